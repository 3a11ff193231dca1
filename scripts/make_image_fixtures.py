#!/usr/bin/env python3
"""Test images and what PIL makes of them, for test/vision_image_test.cpp:

- test/data/exif/: a small image saved as PNG (eXIf chunk) and JPEG (APP1 Exif) with each EXIF
  orientation 1-8, and pil_exif.json with what Hugging Face's image loading gives for each
  (transformers.image_utils.load_image: PIL.ImageOps.exif_transpose, then convert("RGB"));
- test/data/jpeg/: JPEGs of several kinds (4:2:0 and 4:4:4 chroma, odd sizes, grayscale,
  progressive, restart markers) and pil_jpeg.json with PIL's decoded RGB pixels.

    /usr/bin/python3 scripts/make_image_fixtures.py    # needs python3-pil (Pillow >= 6)
"""
import json
import os
import random

from PIL import Image, ImageOps

DATA = os.path.join(os.path.dirname(__file__), "..", "test", "data")
OUT = os.path.join(DATA, "exif")


def jpegs():
    out = os.path.join(DATA, "jpeg")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)

    def picture(w, h):  # smooth gradients plus noise: both decoder paths matter
        img = Image.new("RGB", (w, h))
        img.putdata([((x * 255) // w ^ rng.randrange(32), (y * 255) // h, (x * y) % 256)
                     for y in range(h) for x in range(w)])
        return img

    cases = [
        ("420_odd.jpg", picture(37, 23), {"quality": 85}),  # 4:2:0, edges not a block multiple
        ("444.jpg", picture(32, 16), {"quality": 90, "subsampling": 0}),
        ("422.jpg", picture(33, 17), {"quality": 75, "subsampling": 1}),
        ("gray.jpg", picture(29, 19).convert("L"), {"quality": 80}),
        ("progressive.jpg", picture(40, 30), {"quality": 85, "progressive": True}),
        ("restart.jpg", picture(48, 40), {"quality": 85, "restart_marker_blocks": 2}),
    ]
    doc = []
    for name, img, options in cases:
        path = os.path.join(out, name)
        img.save(path, **options)
        with Image.open(path) as loaded:
            rgb = loaded.convert("RGB")
        doc.append({"file": name, "width": rgb.width, "height": rgb.height,
                    "rgb": [c for px in rgb.getdata() for c in px]})
    with open(os.path.join(out, "pil_jpeg.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def main():
    jpegs()
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
