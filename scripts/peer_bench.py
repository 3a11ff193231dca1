#!/usr/bin/env python3
"""Peers for kuiper-bench, measured on the same GPU in the same call (scripts/perf_report.sh).

1. PyTorch SDPA with only the FlashAttention backend allowed
   (torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)) on kuiper-bench's attention
   shapes: 32 query heads, 8 kv heads (enable_gqa=True; pre-expanded with repeat_interleave if
   this torch refuses it), head dim 128, fp16.
     decode:  1 query over kv 4096 and 32768 keys: us per call and TB/s of KV read (K and V of
              the 8 kv heads, the bytes kuiper-bench counts)
     prefill: causal, T queries over T keys, T = 2048 and 8192: TFLOP/s with the causal FLOP
              count kuiper-bench uses, 4 * heads * head_dim * T (T + 1) / 2
   Timing: about 2 ms of calls captured in one CUDA graph and replayed between CUDA events, the
   median replay ("us": the GPU's time, as kuiper-bench's C++ launches leave it); "us_eager" is
   the same calls issued back to back from Python, as kuiper-bench --attention-only issues its
   own. The KV tensors rotate through enough copies (>= 256 MB) that L2 cannot hold them.
2. Hugging Face transformers Qwen3ForCausalLM, eager attention, at the shape of --config
   (models/qwen3-8b.json) with random weights, fp16 on the GPU (built directly on the device, no
   CPU init): prefill of a 512-token prompt (ms, last-position logits as kuiper-bench computes,
   and with all logits) and greedy decode tok/s after it (one token per step through its KV
   cache, the argmax copied to the host every step as kuiper-bench does).

  python3 scripts/peer_bench.py --config models/qwen3-8b.json --json peer.json

Prints a short table and writes every measurement as JSON. No network is used.
"""
import argparse
import json
import math
import statistics
import sys
import time
import traceback


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="models/qwen3-8b.json", help="Hugging Face config.json")
    p.add_argument("--json", default="", help="write the measurements here")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--decode-kv-lens", default="4096,32768")
    p.add_argument("--causal-lens", default="2048,8192")
    p.add_argument("--prompt", type=int, default=512, help="HF prefill length")
    p.add_argument("--gen", type=int, default=32, help="HF decode steps timed")
    p.add_argument("--repeat", type=int, default=5, help="HF prefill runs (median)")
    p.add_argument("--skip-hf", action="store_true", help="SDPA only")
    p.add_argument("--no-graph", action="store_true",
                   help="SDPA: time only the calls issued from Python (no CUDA graph replay)")
    p.add_argument("--peak-tflops", type=float, default=989.4,
                   help="compute ceiling for percentages (H100 SXM dense fp16 datasheet figure)")
    return p.parse_args()


def first_line(e):
    lines = str(e).splitlines()
    return (lines[0] if lines else type(e).__name__)[:120]


def lengths(text):
    return [int(x) for x in text.split(",") if x.strip()]


def time_batched(torch, call):
    """Per-call seconds: warm-up, then batches of back-to-back calls between CUDA events."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    index = [0]

    def batch(n):
        start.record()
        for _ in range(n):
            call(index[0])
            index[0] += 1
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / n

    per_call = batch(3)
    inner = int(min(max(math.ceil(2e-3 / max(per_call, 1e-7)), 1), 200))
    batches = int(min(max(math.ceil(0.5 / max(per_call * inner, 1e-7)), 3), 25))
    return statistics.median(batch(inner) for _ in range(batches))


def time_graph(torch, call, per_call):
    """Per-call seconds with about 2 ms of calls captured in one CUDA graph and replayed: the
    GPU's time alone, without Python and dispatcher cost per call (kuiper-bench's C++ launches
    cost a few us, well under its kernels' time). per_call: the eager estimate."""
    n = int(min(max(math.ceil(2e-3 / max(per_call, 1e-7)), 1), 200))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            call(i)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def replay():
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / n

    replay()
    replay()
    reps = int(min(max(math.ceil(0.5 / max(per_call * n, 1e-7)), 3), 25))
    seconds = statistics.median(replay() for _ in range(reps))
    del graph
    return seconds, n


def bench_sdpa(torch, args):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, KVH, D = args.heads, args.kv_heads, args.head_dim
    group = H // KVH
    dev, dt = "cuda", torch.float16
    rows = []

    def case(phase, L, T):
        kv_bytes = 2.0 * L * KVH * D * 2
        copies = int(min(max(math.ceil(256e6 / kv_bytes), 1), 64))
        q = torch.randn(1, H, T, D, device=dev, dtype=dt)
        kvs = [(torch.randn(1, KVH, L, D, device=dev, dtype=dt),
                torch.randn(1, KVH, L, D, device=dev, dtype=dt)) for _ in range(copies)]
        causal = phase == "prefill"  # decode: the one query sees every key (no mask)
        gqa = "enable_gqa"
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            try:
                F.scaled_dot_product_attention(q, kvs[0][0], kvs[0][1], is_causal=causal, enable_gqa=True)
                torch.cuda.synchronize()

                def call(i):
                    k, v = kvs[i % copies]
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            except (RuntimeError, TypeError) as e:  # older torch or a refused combination
                gqa = "repeat_interleave (outside the timing): " + first_line(e)
                kvs = [(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)) for k, v in kvs]

                def call(i):
                    k, v = kvs[i % copies]
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with torch.inference_mode():
                eager = time_batched(torch, call)
                try:
                    if args.no_graph:
                        raise RuntimeError("--no-graph")
                    seconds, graph_calls = time_graph(torch, call, eager)
                    timing = f"cuda graph of {graph_calls} calls"
                except Exception as e:  # noqa: BLE001 - keep the eager figure
                    seconds = eager
                    timing = "eager (no graph: " + first_line(e) + ")"
                    torch.cuda.synchronize()
        start = L - T
        flops = 4.0 * H * D * (T * start + T * (T + 1) / 2.0)
        row = {
            "attention": "torch-sdpa-flash", "kernel": "torch.nn.functional.scaled_dot_product_attention",
            "backend": "FLASH_ATTENTION", "gqa": gqa, "phase": phase, "heads": H, "kv_heads": KVH,
            "head_dim": D, "kv_len": L, "queries": T, "kv_copies": copies, "timing": timing,
            "us": seconds * 1e6, "us_eager": eager * 1e6,
            "kv_gb_s": kv_bytes / seconds / 1e9, "flops": flops, "tflop_s": flops / seconds / 1e12,
            "pct_of_peak": 100.0 * flops / seconds / 1e12 / args.peak_tflops,
        }
        rows.append(row)
        del q, kvs
        torch.cuda.empty_cache()

    for L in lengths(args.decode_kv_lens):
        case("decode", L, 1)
    for T in lengths(args.causal_lens):
        case("prefill", T, T)
    return rows


def bench_hf(torch, args):
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with open(args.config) as f:
        cfg = json.load(f)
    for key in ("architectures", "torch_dtype", "dtype", "transformers_version"):
        cfg.pop(key, None)
    config = Qwen3Config(**cfg)
    try:
        config._attn_implementation = "eager"
    except Exception:  # noqa: BLE001 - older/newer config classes
        pass
    # Build directly on the GPU in fp16: the initialisers run there (fast), nothing on the CPU.
    old = torch.get_default_dtype()
    t0 = time.time()
    try:
        torch.set_default_dtype(torch.float16)
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(config)
    except Exception as e:  # noqa: BLE001 - fall back to an fp32 build on the GPU, then convert
        print("fp16 default-dtype build failed, building fp32 then .half():", e, file=sys.stderr)
        torch.set_default_dtype(old)
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(config)
        model = model.half()
    finally:
        torch.set_default_dtype(old)
    model.eval()
    # Random values everywhere (whatever the constructor left: speed can depend on the data
    # through clocks and power, so no zeros): matrices N(0, 0.02), norm weights near 1.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.9, 1.1)
            else:
                p.normal_(0.0, 0.02)
    try:
        model.config._attn_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    torch.cuda.synchronize()
    build_s = time.time() - t0
    params = sum(p.numel() for p in model.parameters())
    result = {
        "transformers": transformers.__version__, "model": "Qwen3ForCausalLM",
        "attn_implementation": getattr(model.config, "_attn_implementation", "?"),
        "dtype": str(next(model.parameters()).dtype), "params": params, "build_s": build_s,
        "prompt": args.prompt, "gen": args.gen,
    }
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, args.prompt), generator=g).to("cuda")

    def prefill(keep):
        cache = transformers.DynamicCache(config=config) if _cache_takes_config(transformers) else transformers.DynamicCache()
        kwargs = {"past_key_values": cache, "use_cache": True}
        if keep:
            kwargs["logits_to_keep"] = keep
        out = model(input_ids=ids, **kwargs)
        return out, cache

    def timed_prefill(keep):
        times = []
        for r in range(args.repeat + 2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out, _ = prefill(keep)
            out.logits[0, -1].argmax().item()
            if r >= 2:  # two warm-ups
                times.append(time.perf_counter() - t)
            del out
        return statistics.median(times)

    with torch.inference_mode():
        result["prefill_ms"] = timed_prefill(1) * 1e3
        result["prefill_tok_s"] = args.prompt / result["prefill_ms"] * 1e3
        result["prefill_all_logits_ms"] = timed_prefill(0) * 1e3

        def decode_run(steps):
            out, cache = prefill(1)
            token = out.logits[0, -1].argmax().item()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(steps):
                step = model(input_ids=torch.tensor([[token]], device="cuda"), past_key_values=cache,
                             use_cache=True, logits_to_keep=1)
                token = step.logits[0, -1].argmax().item()
            return time.perf_counter() - t

        decode_run(4)  # warm-up
        runs = [decode_run(args.gen) for _ in range(3)]
        s = statistics.median(runs)
        result["decode_tok_s"] = args.gen / s
        result["decode_ms_per_token"] = s / args.gen * 1e3
        result["decode_context"] = args.prompt
    result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model
    torch.cuda.empty_cache()
    return result


def _cache_takes_config(transformers):
    import inspect
    try:
        return "config" in inspect.signature(transformers.DynamicCache.__init__).parameters
    except (TypeError, ValueError):
        return False


def main():
    args = parse_args()
    report = {"tool": "peer_bench", "command": " ".join(sys.argv), "peak_tflop_s": args.peak_tflops,
              "sdpa": [], "hf": None, "errors": []}
    try:
        import torch
    except ImportError as e:
        report["errors"].append("torch: " + str(e))
        torch = None
    if torch is not None:
        report["torch"] = torch.__version__
        report["device"] = {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
        # transformers first: a failed graph capture in the SDPA part cannot spoil it.
        if not args.skip_hf:
            try:
                report["hf"] = bench_hf(torch, args)
            except Exception as e:  # noqa: BLE001 - report and go on to the next peer
                report["errors"].append("hf: " + "".join(traceback.format_exception_only(type(e), e)).strip())
                traceback.print_exc()
        try:
            report["sdpa"] = bench_sdpa(torch, args)
        except Exception as e:  # noqa: BLE001
            report["errors"].append("sdpa: " + "".join(traceback.format_exception_only(type(e), e)).strip())
            traceback.print_exc()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    print("| peer | phase | kv len | queries | us | us eager | KV GB/s | TFLOP/s | GQA | timing |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in report["sdpa"]:
        print(f"| {r['attention']} | {r['phase']} | {r['kv_len']} | {r['queries']} | {r['us']:.1f} | "
              f"{r['us_eager']:.1f} | {r['kv_gb_s']:.0f} | {r['tflop_s']:.1f} | {r['gqa'][:20]} | {r['timing']} |")
    hf = report["hf"]
    if hf:
        print(f"\nHF transformers {hf['transformers']} {hf['model']} ({hf['attn_implementation']}, {hf['dtype']}): "
              f"prefill {hf['prompt']} tokens {hf['prefill_ms']:.1f} ms (all logits {hf['prefill_all_logits_ms']:.1f} ms), "
              f"decode {hf['decode_tok_s']:.1f} tok/s at context {hf['decode_context']}, peak {hf['peak_gib']:.2f} GiB")
    for e in report["errors"]:
        print("error:", e)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
