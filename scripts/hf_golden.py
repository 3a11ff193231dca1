#!/usr/bin/env python3
"""Reference outputs from Hugging Face transformers for a model configuration.

Usage (on a machine with torch and transformers, a GPU if there is one):
  python3 scripts/hf_golden.py [--dtype fp32|bf16] [--prompts GOLDEN] [--tokenizer DIR]
                               DETWEIGHTS_DIR CONFIG_DIR [CONFIG_DIR ...]

For each CONFIG_DIR holding a config.json, writes the checkpoint of the fixture weight recipe
(detweights.py in DETWEIGHTS_DIR, the same recipe the C++ tests use; the tensors and planted
"set"s of CONFIG_DIR/tensors.json where there is one) to a scratch directory, loads it with
from_pretrained in the dtype (fp32 default, or bf16: torch.bfloat16 throughout, as a user runs a
published checkpoint) with eager attention, runs the prompts and writes
CONFIG_DIR/golden.safetensors (fp32) or CONFIG_DIR/golden_bf16.safetensors (bf16) with, for each
prompt P: P.ids, P.logits_last, P.top_ids, P.top_vals, P.lse, P.greedy, P.greedy_margin.

Prompts: the P.ids of --prompts GOLDEN, else of CONFIG_DIR/golden.safetensors when it exists (so
a bf16 golden has the fp32 one's prompts, names and greedy lengths), else pseudo-random ids below
the vocabulary size: "short" (19 ids) and "long" (300).

Qwen3-VL (Qwen3VLForConditionalGeneration): the text prompt "chat" and the image prompt "img"
holding the fixture's test_image.png, preprocessed by the image processor that
CONFIG_DIR/preprocessor_config.json names; both are rebuilt with the Qwen tokenizer (--tokenizer,
default DETWEIGHTS_DIR/../tokenizer/qwen3) and must equal the reference golden's ids where there
is one. Also image.pixel_values_fast, image.grid_thw_fast, image.vision_embeds (the merger's
output) and image.deepstack0.. (the deepstack mergers' outputs).
A config with rope scaling also gets "shiftedN" prompts (see shifted_prompts).
"""
import argparse
import json
import os
import sys
import tempfile
import traceback

import torch
import transformers
from safetensors.torch import load_file, save_file

GREEDY_STEPS = 8
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
VL_CHAT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
VL_IMAGE = ("<|im_start|>user\n<|vision_start|>{pads}<|vision_end|>Describe this image.<|im_end|>\n"
            "<|im_start|>assistant\n")


def prompt_ids(vocab, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g, dtype=torch.int64)


def recipe_tensors(cfg_dir, config, model_class):
    """(name, shape, sets) of every stored tensor: tensors.json, else the model's parameters."""
    path = os.path.join(cfg_dir, "tensors.json")
    if os.path.exists(path):
        return [(t["name"], t["shape"], t.get("set", ())) for t in json.load(open(path))]
    with torch.device("meta"):
        model = model_class._from_config(config)
    return [(name, list(p.shape), ()) for name, p in model.named_parameters()]


def load_model(detweights, cfg_dir, dtype, device):
    """The recipe checkpoint loaded as a user loads a published one. Every parameter must hold
    its recipe value (plants included): nothing may be left to random initialisation."""
    config = transformers.AutoConfig.from_pretrained(cfg_dir)
    model_class = getattr(transformers, config.architectures[0])
    tensors = recipe_tensors(cfg_dir, config, model_class)
    with tempfile.TemporaryDirectory() as ckpt:
        config.save_pretrained(ckpt)
        detweights.write_safetensors(os.path.join(ckpt, "model.safetensors"), tensors)
        model = model_class.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager")
    params = dict(model.named_parameters())
    recipe = {name: (shape, sets) for name, shape, sets in tensors}
    unset = sorted(set(params) - set(recipe))
    if unset:
        raise RuntimeError(f"parameters the checkpoint did not set: {unset[:5]}")
    for name, (shape, sets) in recipe.items():
        want = torch.from_numpy(detweights.bf16_values(name, shape, sets))
        if name in params and not torch.equal(params[name].detach().float().cpu(), want):
            raise RuntimeError(f"{name} does not hold its recipe values")
    return config, model.to(device).eval()


def reference_golden(cfg_dir, prompts_file):
    path = prompts_file or os.path.join(cfg_dir, "golden.safetensors")
    return load_file(path) if os.path.exists(path) else None


def run_prompt(model, prefix, ids, greedy_steps, device, out, **inputs):
    """The P.* tensors of one prompt (inputs: extra model inputs, e.g. the image's)."""
    n = ids.numel()
    ids = ids.to(device)[None]
    # An explicit all-ones mask: without one, generate infers padding from pad_token_id and
    # silently drops prompt tokens equal to it.
    mask = torch.ones_like(ids)
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, **inputs)
        logits = result.logits[0].float()
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=greedy_steps,
                             do_sample=False, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None, **inputs)
    # For the record: what the residual stream reaches (fp16's largest number is 65504).
    if result.hidden_states is not None:
        print(f"  {prefix}: max |residual| after layer 0 "
              f"{result.hidden_states[1].abs().max().item():.4g}, "
              f"finite logits {torch.isfinite(logits).all().item()}")
    top = torch.topk(logits, 8, dim=-1)
    scores = torch.stack([s[0].float() for s in gen.scores])
    top2 = torch.topk(scores, 2, dim=-1).values
    out[f"{prefix}.ids"] = ids[0].to(torch.int32).cpu()
    out[f"{prefix}.logits_last"] = logits[-1].cpu()
    out[f"{prefix}.top_ids"] = top.indices.to(torch.int32).cpu()
    out[f"{prefix}.top_vals"] = top.values.cpu()
    out[f"{prefix}.lse"] = torch.logsumexp(logits, dim=-1).cpu()
    out[f"{prefix}.greedy"] = gen.sequences[0, n:].to(torch.int32).cpu()
    out[f"{prefix}.greedy_margin"] = (top2[:, 0] - top2[:, 1]).cpu()


def greedy_steps(ref, prefix):
    key = f"{prefix}.greedy"
    return ref[key].numel() if ref is not None and key in ref else GREEDY_STEPS


def text_goldens(model, config, ref, device, out):
    if ref is not None:
        prompts = [(k[:-len(".ids")], ref[k].to(torch.int64)) for k in ref if k.endswith(".ids")]
    else:
        prompts = [("short", prompt_ids(config.vocab_size, 19, 1)),
                   ("long", prompt_ids(config.vocab_size, 300, 2))]
    for prefix, ids in prompts:
        run_prompt(model, prefix, ids, greedy_steps(ref, prefix), device, out)


def vl_goldens(model, config, cfg_dir, tokenizer_dir, ref, device, out):
    """The Qwen3-VL prompts: text only, and the fixture's test image."""
    from transformers.image_utils import load_image
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    processor = transformers.AutoImageProcessor.from_pretrained(cfg_dir)
    image = processor(images=[load_image(os.path.join(cfg_dir, "test_image.png"))],
                      return_tensors="pt")
    grid = image["image_grid_thw"]
    merge = config.vision_config.spatial_merge_size
    pads = "<|image_pad|>" * int(grid.prod().item() // (merge * merge))
    visual = model.model.visual
    captured = {}

    def keep(name):
        def hook(module, args, output):
            captured.setdefault(name, output.float().cpu())  # the prompt's own pass, not generate's
        return hook

    hooks = [visual.merger.register_forward_hook(keep("image.vision_embeds"))]
    for i, m in enumerate(visual.deepstack_merger_list):
        hooks.append(m.register_forward_hook(keep(f"image.deepstack{i}")))
    for prefix, text, inputs in (
            ("chat", VL_CHAT, {}),
            ("img", VL_IMAGE.format(pads=pads),
             {"pixel_values": image["pixel_values"].to(device),
              "image_grid_thw": grid.to(device)})):
        ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)
        if inputs:  # which tokens are the image's (1) and which text (0), as the processor says
            inputs["mm_token_type_ids"] = (ids == config.image_token_id).to(torch.int32)[None].to(device)
        if ref is not None and f"{prefix}.ids" in ref and not torch.equal(
                ref[f"{prefix}.ids"].to(torch.int64), ids):
            raise RuntimeError(f"the {prefix} prompt's ids differ from the reference golden's")
        run_prompt(model, prefix, ids, greedy_steps(ref, prefix), device, out, **inputs)
    for h in hooks:
        h.remove()
    out.update(captured)
    out["image.pixel_values_fast"] = image["pixel_values"].float()
    out["image.grid_thw_fast"] = grid.to(torch.int32)
    if ref is not None and "image.pixel_values_fast" in ref:
        diff = (ref["image.pixel_values_fast"] - out["image.pixel_values_fast"]).abs().max().item()
        print(f"{cfg_dir}: pixel values vs the reference golden's: max abs diff {diff:.3g}")


SHIFTS = (1000, 32760, 40000, 120000)


def shifted_prompts(model, config, device, out):
    """With rope scaling (YaRN), the "short" prompt rotated at positions N + t for each N of
    SHIFTS, its attention still over itself alone (an empty cache): shiftedN.ids, .logits_last,
    .top_ids, .top_vals, .lse."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") == "default":
        return
    ids = prompt_ids(config.vocab_size, 19, 1)
    for shift in SHIFTS:
        positions = torch.arange(len(ids)) + shift
        with torch.no_grad():
            logits = model(ids[None].to(device),
                           position_ids=positions[None].to(device)).logits[0].float()
        top = torch.topk(logits, 8, dim=-1)
        out[f"shifted{shift}.ids"] = ids.to(torch.int32)
        out[f"shifted{shift}.logits_last"] = logits[-1].cpu()
        out[f"shifted{shift}.top_ids"] = top.indices.to(torch.int32).cpu()
        out[f"shifted{shift}.top_vals"] = top.values.cpu()
        out[f"shifted{shift}.lse"] = torch.logsumexp(logits, dim=-1).cpu()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--prompts", help="a golden.safetensors whose P.ids are the prompts")
    ap.add_argument("--tokenizer", help="the Qwen tokenizer directory (Qwen3-VL prompts)")
    ap.add_argument("detweights_dir")
    ap.add_argument("config_dirs", nargs="+")
    args = ap.parse_args()
    sys.path.insert(0, args.detweights_dir)
    import detweights  # noqa: E402

    tokenizer_dir = args.tokenizer or os.path.join(args.detweights_dir, "..", "tokenizer", "qwen3")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    # bf16 GEMMs accumulate in fp32 end to end, as the engine's do.
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    name = "golden.safetensors" if args.dtype == "fp32" else f"golden_{args.dtype}.safetensors"
    failed = []
    for cfg_dir in args.config_dirs:
        try:
            config, model = load_model(detweights, cfg_dir, DTYPES[args.dtype], device)
            ref = reference_golden(cfg_dir, args.prompts)
            out = {}
            if hasattr(config, "vision_config"):
                vl_goldens(model, config, cfg_dir, tokenizer_dir, ref, device, out)
            else:
                text_goldens(model, config, ref, device, out)
                shifted_prompts(model, config, device, out)
        except Exception as e:  # one configuration's failure leaves the others' goldens
            traceback.print_exc()
            print(f"{cfg_dir}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(cfg_dir)
            continue
        out = {k: v.contiguous() for k, v in out.items()}
        save_file(out, os.path.join(cfg_dir, name),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                            "device": device, "dtype": args.dtype})
        print(cfg_dir, name, "written", {k: list(v.shape) for k, v in out.items() if "ids" in k})
    if failed:
        sys.exit(f"no {name} for {failed}")


if __name__ == "__main__":
    main()
