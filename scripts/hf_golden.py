#!/usr/bin/env python3
"""Reference outputs from Hugging Face transformers for a model configuration.

Usage (on a machine with torch and transformers, a GPU if there is one):
  python3 scripts/hf_golden.py DETWEIGHTS_DIR CONFIG_DIR [CONFIG_DIR ...]

For each CONFIG_DIR holding a config.json, builds the model in fp32 with the fixture weight
recipe (detweights.py in DETWEIGHTS_DIR, the same recipe the C++ tests use), runs the prompts
below and writes CONFIG_DIR/golden.safetensors with the tensors the shared fixtures have:
P.ids, P.logits_last, P.top_ids, P.top_vals, P.lse, P.greedy, P.greedy_margin.
Prompts are pseudo-random ids below the vocabulary size: "short" (19 ids) and "long" (300).
A config with rope scaling also gets "shiftedN" (see shifted_prompts).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

GREEDY_STEPS = 8


def prompt_ids(vocab, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g, dtype=torch.int64)


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
    sys.path.insert(0, sys.argv[1])
    import detweights  # noqa: E402

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    for cfg_dir in sys.argv[2:]:
        config = AutoConfig.from_pretrained(cfg_dir)
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(detweights.bf16_values(name, list(p.shape))))
        model = model.to(device).eval()
        out = {}
        for prompt, n, seed in (("short", 19, 1), ("long", 300, 2)):
            ids = prompt_ids(config.vocab_size, n, seed)
            with torch.no_grad():
                logits = model(ids[None].to(device)).logits[0].float()
                # An explicit all-ones mask: without one, generate infers padding from
                # pad_token_id and silently drops prompt tokens equal to it.
                gen = model.generate(ids[None].to(device),
                                     attention_mask=torch.ones_like(ids[None]).to(device),
                                     max_new_tokens=GREEDY_STEPS,
                                     do_sample=False, output_scores=True,
                                     return_dict_in_generate=True, pad_token_id=0,
                                     eos_token_id=None)
            top = torch.topk(logits, 8, dim=-1)
            scores = torch.stack([s[0].float() for s in gen.scores])
            top2 = torch.topk(scores, 2, dim=-1).values
            out[f"{prompt}.ids"] = ids.to(torch.int32)
            out[f"{prompt}.logits_last"] = logits[-1].cpu()
            out[f"{prompt}.top_ids"] = top.indices.to(torch.int32).cpu()
            out[f"{prompt}.top_vals"] = top.values.cpu()
            out[f"{prompt}.lse"] = torch.logsumexp(logits, dim=-1).cpu()
            out[f"{prompt}.greedy"] = gen.sequences[0, n:].to(torch.int32).cpu()
            out[f"{prompt}.greedy_margin"] = (top2[:, 0] - top2[:, 1]).cpu()
        shifted_prompts(model, config, device, out)
        out = {k: v.contiguous() for k, v in out.items()}
        save_file(out, os.path.join(cfg_dir, "golden.safetensors"),
                  metadata={"transformers": __import__("transformers").__version__,
                            "device": device})
        print(cfg_dir, "written", {k: list(v.shape) for k, v in out.items() if "ids" in k})


if __name__ == "__main__":
    main()
