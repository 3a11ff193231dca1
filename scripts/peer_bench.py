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

3. --batched (alone): the throughput peer of kuiper-bench --throughput (issue 13), a
   hand-written Qwen3 decode step for B sequences at once captured in one CUDA graph: fused
   qkv and gate/up projections (cuBLAS through torch.matmul), RMSNorm, q/k norm and RoPE in
   PyTorch ops, a static KV cache of --context rows (random values) plus the new token per
   sequence, and SDPA (the query heads of each kv head as its query rows, so GQA needs no
   copy of K/V), then the lm_head and the arg-max fed back as the next step's input. Random
   fp16 weights of --config's shape. Each B of --batch-sizes: the graph replayed --steps
   times, the tokens copied to the host after each step as a generation loop does (the
   median of 3 runs): ms per step, output tok/s (B tokens per step) and the GB/s of the
   weights and KV rows a step reads. --peer-forms times other ways of writing the same step
   (separate projections; SDPA's enable_gqa, K and V expanded to every query head first, or
   a static cache of --static-cache-len slots attended under a mask of the filled ones, as
   transformers' StaticCache does), each its own row ("torch-graph-decode" is fused-rows, the default and issue 13's peer).

  python3 scripts/peer_bench.py --config models/qwen3-8b.json --json peer.json
  python3 scripts/peer_bench.py --batched --config models/qwen3-8b.json --json batched.json

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
    p.add_argument("--batched", action="store_true",
                   help="only the batched decode peer (kuiper-bench --throughput's)")
    p.add_argument("--batch-sizes", default="1,8,32,64,128,256", help="--batched: sequences B")
    p.add_argument("--context", type=int, default=512,
                   help="--batched: cached tokens each sequence attends to (plus its new one)")
    p.add_argument("--steps", type=int, default=16, help="--batched: decode steps per timed run")
    p.add_argument("--peer-forms", default="fused-rows",
                   help="--batched: the step's forms, PROJECTIONS-ATTENTION, comma-separated: "
                        "projections fused (q|k|v and gate|up one matmul each) or separate (one "
                        "a weight, as transformers' modules); attention rows (each kv head's "
                        "query heads as its query rows), gqa (SDPA's enable_gqa) or expand "
                        "(K and V repeated to every query head, transformers' repeat_kv) or static "
                        "(rows over a static cache of --static-cache-len slots, the slots not yet "
                        "filled masked out, as transformers' StaticCache attends)")
    p.add_argument("--static-cache-len", type=int, default=1024,
                   help="--batched, the static form: the cache's slots per sequence (> --context)")
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


def bench_batched(torch, args):
    import torch.nn.functional as F

    with open(args.config) as f:
        cfg = json.load(f)
    H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    NH, KVH = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // NH
    V, eps, theta = cfg["vocab_size"], cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 1e6)
    G, ctx = NH // KVH, args.context
    batches = lengths(args.batch_sizes)
    dev, dt = "cuda", torch.float16

    def weight(*shape):
        return torch.empty(*shape, device=dev, dtype=dt).normal_(0.0, 0.02)

    def norm_weight(n):
        return torch.empty(n, device=dev, dtype=dt).uniform_(0.9, 1.1)

    torch.cuda.synchronize()
    t0 = time.time()
    layers = [{"ln1": norm_weight(H), "wqkv": weight((NH + 2 * KVH) * D, H), "qn": norm_weight(D),
               "kn": norm_weight(D), "wo": weight(H, NH * D), "ln2": norm_weight(H),
               "wgu": weight(2 * I, H), "wd": weight(H, I)} for _ in range(L)]
    embed = weight(V, H)
    lm_head = embed if cfg.get("tie_word_embeddings", False) else weight(V, H)
    final_norm = norm_weight(H)
    # The cache of the largest batch: [B, kv heads, context + 1, D] per layer, the last row the
    # step's own token; a smaller batch uses the first B sequences (a contiguous view).
    bmax = max(batches)
    kcache = [torch.randn(bmax, KVH, ctx + 1, D, device=dev, dtype=dt) for _ in range(L)]
    vcache = [torch.randn(bmax, KVH, ctx + 1, D, device=dev, dtype=dt) for _ in range(L)]
    inv_freq = theta ** (-torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D)
    angle = ctx * inv_freq
    cos = torch.cat([angle.cos(), angle.cos()]).to(dt)
    sin = torch.cat([angle.sin(), angle.sin()]).to(dt)
    ids = torch.randint(0, V, (bmax,), device=dev)
    torch.cuda.synchronize()
    build_s = time.time() - t0

    def rope(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    # The separate projections are row slices of the stacked weights (the same bytes, one
    # matmul each).
    forms = [f.split("-") for f in args.peer_forms.split(",")]
    for projections, attention in forms:
        if projections not in ("fused", "separate") or attention not in ("rows", "gqa", "expand",
                                                                          "static"):
            raise ValueError(f"--peer-forms: unknown form {projections}-{attention}")
    # The static form's cache: --static-cache-len slots a sequence, the first ctx + 1 filled (the
    # same random rows, then the step's own token), the rest masked out of every query's keys.
    S = args.static_cache_len
    if any(a == "static" for _, a in forms):
        if S <= ctx:
            raise ValueError("--static-cache-len must exceed --context")
        kstatic = [torch.randn(bmax, KVH, S, D, device=dev, dtype=dt) for _ in range(L)]
        vstatic = [torch.randn(bmax, KVH, S, D, device=dev, dtype=dt) for _ in range(L)]
        filled = (torch.arange(S, device=dev) <= ctx).view(1, 1, 1, S)
        torch.cuda.synchronize()

    def step(B, projections="fused", attention="rows"):
        tokens = ids[:B]
        x = embed[tokens]
        for layer, p in enumerate(layers):
            h = F.rms_norm(x, (H,), p["ln1"], eps)
            if projections == "fused":
                q, k, v = (h @ p["wqkv"].t()).split([NH * D, KVH * D, KVH * D], dim=-1)
            else:
                q, k, v = (h @ w.t() for w in p["wqkv"].split([NH * D, KVH * D, KVH * D]))
            q = rope(F.rms_norm(q.view(B, NH, D), (D,), p["qn"], eps))
            k = rope(F.rms_norm(k.view(B, KVH, D), (D,), p["kn"], eps))
            static = attention == "static"
            kc = (kstatic if static else kcache)[layer][:B]
            vc = (vstatic if static else vcache)[layer][:B]
            kc[:, :, ctx] = k
            vc[:, :, ctx] = v.view(B, KVH, D)
            if attention == "rows":
                # Query heads j*G .. j*G+G-1 share kv head j: they are that head's G query rows.
                o = F.scaled_dot_product_attention(q.view(B, KVH, G, D), kc, vc)
            elif static:
                o = F.scaled_dot_product_attention(q.view(B, KVH, G, D), kc, vc, attn_mask=filled)
            elif attention == "gqa":
                o = F.scaled_dot_product_attention(q.view(B, NH, 1, D), kc, vc, enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(q.view(B, NH, 1, D),
                                                   kc.repeat_interleave(G, dim=1),
                                                   vc.repeat_interleave(G, dim=1))
            x = x + o.reshape(B, NH * D) @ p["wo"].t()
            h = F.rms_norm(x, (H,), p["ln2"], eps)
            if projections == "fused":
                gate, up = (h @ p["wgu"].t()).chunk(2, dim=-1)
            else:
                gate, up = (h @ w.t() for w in p["wgu"].chunk(2))
            x = x + (F.silu(gate) * up) @ p["wd"].t()
        logits = F.rms_norm(x, (H,), final_norm, eps) @ lm_head.t()
        tokens.copy_(logits.argmax(-1))

    weight_bytes = 2.0 * (sum(t.numel() for p in layers for t in p.values()) + V * H + H)
    rows = []
    with torch.inference_mode():
        for (projections, attention), B in ((f, B) for f in forms for B in batches):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up (cuBLAS handles, workspaces) off the capture stream
                for _ in range(2):
                    step(B, projections, attention)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step(B, projections, attention)

            def run(n):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(n):
                    graph.replay()
                    ids[:B].tolist()  # the tokens to the host, as a generation loop needs them
                return (time.perf_counter() - t) / n

            run(3)
            seconds = statistics.median(run(args.steps) for _ in range(3))
            # The KV rows the attention reads (the static form reads its masked slots too).
            slots = S if attention == "static" else ctx + 1
            kv_bytes = 2.0 * L * B * slots * KVH * D * 2
            name = "torch-graph-decode"
            if (projections, attention) != ("fused", "rows"):
                name += f" ({projections}-{attention})"
            rows.append({"peer": name, "batch": B, "context": ctx,
                         "ms_per_step": seconds * 1e3, "output_tok_s": B / seconds,
                         "bytes_per_step": weight_bytes + kv_bytes,
                         "gb_s": (weight_bytes + kv_bytes) / seconds / 1e9, "steps": args.steps,
                         "build_s": build_s})
            del graph
            torch.cuda.empty_cache()
    del layers, embed, lm_head, kcache, vcache
    if any(a == "static" for _, a in forms):
        del kstatic, vstatic
    torch.cuda.empty_cache()
    return rows


def _cache_takes_config(transformers):
    import inspect
    try:
        return "config" in inspect.signature(transformers.DynamicCache.__init__).parameters
    except (TypeError, ValueError):
        return False


def main():
    args = parse_args()
    report = {"tool": "peer_bench", "command": " ".join(sys.argv), "peak_tflop_s": args.peak_tflops,
              "sdpa": [], "hf": None, "batched": [], "errors": []}
    try:
        import torch
    except ImportError as e:
        report["errors"].append("torch: " + str(e))
        torch = None
    if torch is not None:
        report["torch"] = torch.__version__
        report["device"] = {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
        peers = [("batched", bench_batched)] if args.batched else (
            # transformers first: a failed graph capture in the SDPA part cannot spoil it.
            ([] if args.skip_hf else [("hf", bench_hf)]) + [("sdpa", bench_sdpa)])
        for name, bench in peers:
            try:
                report[name] = bench(torch, args)
            except Exception as e:  # noqa: BLE001 - report and go on to the next peer
                report["errors"].append(name + ": " + "".join(traceback.format_exception_only(type(e), e)).strip())
                traceback.print_exc()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if report["batched"]:
        print("| peer | B | context | ms/step | output tok/s | GB/s |")
        print("|---|---|---|---|---|---|")
        for r in report["batched"]:
            print(f"| {r['peer']} | {r['batch']} | {r['context']} | {r['ms_per_step']:.2f} | "
                  f"{r['output_tok_s']:.0f} | {r['gb_s']:.0f} |")
    if report["sdpa"]:
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
