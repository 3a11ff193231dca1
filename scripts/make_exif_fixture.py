#!/usr/bin/env python3
"""Makes test/data/exif/: a small image saved as PNG (eXIf chunk) and JPEG (APP1 Exif) with each
EXIF orientation 1-8, and pil_exif.json with what Hugging Face's image loading gives for each
(transformers.image_utils.load_image: PIL.ImageOps.exif_transpose, then convert("RGB")).

    /usr/bin/python3 scripts/make_exif_fixture.py      # needs python3-pil (Pillow >= 6)
"""
import json
import os

from PIL import Image, ImageOps

OUT = os.path.join(os.path.dirname(__file__), "..", "test", "data", "exif")


def main():
    os.makedirs(OUT, exist_ok=True)
    # 5 x 3, every pixel distinct, so any wrong flip or rotation shows.
    w, h = 5, 3
    base = Image.new("RGB", (w, h))
    base.putdata([(40 * x + 10, 80 * y + 20, 7 * (x + w * y)) for y in range(h) for x in range(w)])
    # A smooth 24 x 16 image for JPEG (blocky content would differ more between decoders).
    jw, jh = 24, 16
    smooth = Image.new("RGB", (jw, jh))
    smooth.putdata([(x * 10, y * 15, 128 + 3 * (x - y)) for y in range(jh) for x in range(jw)])
    doc = {"png": [], "jpeg": []}
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        for kind, image, ext, extra in (("png", base, "png", {}), ("jpeg", smooth, "jpg", {"quality": 95})):
            name = "orientation_%d.%s" % (orientation, ext)
            path = os.path.join(OUT, name)
            image.save(path, exif=exif.tobytes(), **extra)
            with Image.open(path) as loaded:
                assert loaded.getexif().get(0x0112) == orientation, (name, loaded.getexif())
                shown = ImageOps.exif_transpose(loaded).convert("RGB")
            doc[kind].append({"file": name, "orientation": orientation, "width": shown.width,
                              "height": shown.height,
                              "rgb": [c for px in shown.getdata() for c in px]})
    with open(os.path.join(OUT, "pil_exif.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
