#!/usr/bin/env python3
"""Tables and the plot for docs/PERFORMANCE.md, from the JSON that scripts/perf_report.sh writes.

  python3 scripts/plot_perf.py DIR --tables            # markdown tables on stdout
  python3 scripts/plot_perf.py DIR --png docs/perf.png  # decode vs context, prefill vs length

DIR holds model_<kind>.json (kuiper-bench model mode, one per attention kind), attention.json
(kuiper-bench --attention-only) and peer.json (scripts/peer_bench.py); missing files are left out.
--tables needs only the standard library (perf_report.sh prints them on the device);
--png needs matplotlib (apt-get install python3-matplotlib), run where the JSON was fetched to.
"""
import argparse
import glob
import json
import os
import sys

KINDS = ["mha", "flash1", "flash2"]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"note: {path}: {e}", file=sys.stderr)
        return None


def load_dir(d):
    models = [m for m in (load(p) for p in sorted(glob.glob(os.path.join(d, "model_*.json")))) if m]
    data = {"decode": [], "prefill": [], "memory": [], "skipped": [], "copy_gb_s": None, "device": None,
            "commands": []}
    for m in models:
        for key in ("decode", "prefill", "memory", "skipped"):
            data[key] += m.get(key, [])
        data["copy_gb_s"] = data["copy_gb_s"] or m.get("copy_gb_s")
        data["device"] = data["device"] or m.get("device", {}).get("name")
        data["commands"].append(m.get("command", ""))
        data["ceiling_0"] = m.get("ceiling_tok_s_context_0")
    data["attention"] = load(os.path.join(d, "attention.json")) if os.path.exists(os.path.join(d, "attention.json")) else None
    data["peer"] = load(os.path.join(d, "peer.json")) if os.path.exists(os.path.join(d, "peer.json")) else None
    return data


def kinds_in(rows):
    present = {r["attention"] for r in rows}
    return [k for k in KINDS if k in present] + sorted(present - set(KINDS))


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def human(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def tables(data):
    out = []
    dec = data["decode"]
    if dec:
        ctxs = sorted({r["context"] for r in dec})
        out.append(f"Decode tok/s vs context (model_<kind>.json: decode[].decode_tok_s; "
                   f"% of copy = decode[].decode_pct_of_copy)\n")
        out.append("| attention | " + " | ".join(f"{human(c)}" for c in ctxs) + " |")
        out.append("|---|" + "---|" * len(ctxs))
        for k in kinds_in(dec):
            cells = []
            for c in ctxs:
                r = next((r for r in dec if r["attention"] == k and r["context"] == c), None)
                cells.append("–" if r is None else f"{r['decode_tok_s']:.1f} ({r['decode_pct_of_copy']:.0f}%)")
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        ceil = []
        for c in ctxs:
            r = next((r for r in sorted(dec, key=lambda r: r["attention"] != "flash2") if r["context"] == c), None)
            ceil.append("–" if r is None else f"{r['ceiling_tok_s']:.1f}")
        out.append("| ceiling (copy GB/s / bytes per token) | " + " | ".join(ceil) + " |")
        out.append("")
    pre = data["prefill"]
    if pre:
        lens = sorted({r["prompt"] for r in pre})
        out.append("Prefill tok/s vs prompt length (model_<kind>.json: prefill[].prefill_tok_s; "
                   "TFLOP/s = prefill[].prefill_tflop_s)\n")
        out.append("| attention | " + " | ".join(human(n) for n in lens) + " |")
        out.append("|---|" + "---|" * len(lens))
        for k in kinds_in(pre):
            cells = []
            for n in lens:
                r = next((r for r in pre if r["attention"] == k and r["prompt"] == n), None)
                cells.append("–" if r is None else f"{r['prefill_tok_s']:.0f} ({r['prefill_tflop_s']:.0f} TF)")
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        out.append("")
        out.append("Prefill time in ms (prefill[].prefill_ms)\n")
        out.append("| attention | " + " | ".join(human(n) for n in lens) + " |")
        out.append("|---|" + "---|" * len(lens))
        for k in kinds_in(pre):
            cells = []
            for n in lens:
                r = next((r for r in pre if r["attention"] == k and r["prompt"] == n), None)
                cells.append("–" if r is None else f"{r['prefill_ms']:.1f}")
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        out.append("")
    att = (data["attention"] or {}).get("attention", [])
    peer = data["peer"] or {}
    sdpa = peer.get("sdpa", []) or []
    if att or sdpa:
        out.append("Attention alone, 32 q heads / 8 kv heads / head dim 128, fp16 (attention.json: "
                   "attention[]; peer.json: sdpa[]). Decode: us, KV GB/s (kv_gb_s) and its share "
                   "of the copy bandwidth; prefill (causal, T queries over T keys): us, TFLOP/s "
                   "(tflop_s) and its share of the peak (pct_of_peak)\n")
        rows = att + sdpa
        copy = (data["attention"] or {}).get("copy_gb_s") or data["copy_gb_s"]
        cases = sorted({(r["phase"], r["kv_len"], r["queries"]) for r in rows},
                       key=lambda c: (c[0] != "decode", c[1]))
        head = []
        for phase, L, T in cases:
            head.append(f"decode kv {human(L)}" if phase == "decode" else f"prefill T={human(T)}")
        out.append("| implementation | " + " | ".join(head) + " |")
        out.append("|---|" + "---|" * len(cases))
        impls = [(k, [r for r in att if r["attention"] == k]) for k in kinds_in(att)] if att else []
        if sdpa:
            impls.append(("PyTorch SDPA flash", sdpa))
        for name, rs in impls:
            cells = []
            for phase, L, T in cases:
                r = next((r for r in rs if (r["phase"], r["kv_len"], r["queries"]) == (phase, L, T)), None)
                if r is None:
                    cells.append("–")
                elif phase == "decode":
                    pct = f" = {100.0 * r['kv_gb_s'] / copy:.0f}%" if copy else ""
                    cells.append(f"{r['us']:.1f} us, {r['kv_gb_s']:.0f} GB/s{pct}" +
                                 (f" (eager {r['us_eager']:.1f} us)" if "us_eager" in r else ""))
                else:
                    cells.append(f"{r['us']:.0f} us, {r['tflop_s']:.1f} TF/s = {r['pct_of_peak']:.0f}%" +
                                 (f" (eager {r['us_eager']:.0f} us)" if "us_eager" in r else ""))
            kernels = " / ".join(dict.fromkeys(r["kernel"] for r in rs))
            label = name if name == "PyTorch SDPA flash" else f"{name} ({kernels})"
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    hf = peer.get("hf")
    if hf or pre or dec:
        out.append("End to end beside Hugging Face transformers (eager) at the same shape "
                   "(peer.json: hf; kuiper: prefill[] at 512, decode[] at context 512)\n")
        out.append("| engine | prefill 512 ms | prefill 512 tok/s | decode tok/s (context 512) |")
        out.append("|---|---|---|---|")
        for k in kinds_in(pre or dec):
            p = next((r for r in pre if r["attention"] == k and r["prompt"] == 512), None)
            d = next((r for r in dec if r["attention"] == k and r["context"] == 512), None)
            out.append(f"| kuiper {k} | {fmt(p and p['prefill_ms'], '.1f')} | {fmt(p and p['prefill_tok_s'], '.0f')} | "
                       f"{fmt(d and d['decode_tok_s'], '.1f')} |")
        if hf:
            out.append(f"| transformers {hf.get('transformers')} eager | {hf['prefill_ms']:.1f} "
                       f"(all logits {hf['prefill_all_logits_ms']:.1f}) | {hf['prefill_tok_s']:.0f} | "
                       f"{hf['decode_tok_s']:.1f} |")
        out.append("")
    mem = data["memory"]
    if mem:
        out.append("Peak GPU memory of the decode sweep (model_<kind>.json: memory[]; allocator "
                   "high-water mark; reserved = held from CUDA by the allocator; device used = cudaMemGetInfo, CUDA context included)\n")
        out.append("| attention | KV tokens | weights GiB | KV cache GiB | peak GiB | peak - weights - KV GiB | "
                   "reserved GiB | device used GiB |")
        out.append("|---|---|---|---|---|---|---|---|")
        for k in kinds_in(mem):
            for m in (m for m in mem if m["attention"] == k):
                out.append(f"| {k} | {m['max_context']} | {m['weights_gib']:.2f} | {m['kv_cache_gib']:.2f} | "
                           f"{m['peak_gib']:.2f} | {m['excess_gib']:.2f} | {m['reserved_gib']:.2f} | "
                           f"{m['device_used_gib']:.2f} |")
        out.append("")
    if data["copy_gb_s"]:
        out.append(f"Device-to-device copy (read + write): {data['copy_gb_s']:.0f} GB/s on {data['device']}; "
                   f"decode ceiling at context 0: {data.get('ceiling_0') or 0:.1f} tok/s.")
    for s in data["skipped"]:
        out.append(f"skipped: {s['attention']} {s['figure']} {s.get('context', s.get('prompt'))}: {s['why']}")
    for e in peer.get("errors", []) or []:
        out.append(f"peer error: {e}")
    return "\n".join(out)


def plot(data, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    dec, pre = data["decode"], data["prefill"]
    markers = {"mha": "s", "flash1": "^", "flash2": "o"}
    for k in kinds_in(dec):
        rs = sorted((r for r in dec if r["attention"] == k), key=lambda r: r["context"])
        ax1.plot([r["context"] for r in rs], [r["decode_tok_s"] for r in rs], marker=markers.get(k, "o"), label=k)
    if dec:
        ceil = {}
        for r in sorted(dec, key=lambda r: r["attention"] == "flash2"):  # flash2's run last: it wins
            ceil[r["context"]] = r["ceiling_tok_s"]
        xs = sorted(ceil)
        ax1.plot(xs, [ceil[x] for x in xs], "k--", label=f"ceiling ({data['copy_gb_s']:.0f} GB/s copy)")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("context (tokens in the KV cache)")
    ax1.set_ylabel("decode tok/s (batch 1, CUDA graph)")
    ax1.set_title("Decode vs context")
    ax1.set_ylim(bottom=0)
    ax1.grid(True, alpha=0.3)
    ax1.legend()
    for k in kinds_in(pre):
        rs = sorted((r for r in pre if r["attention"] == k), key=lambda r: r["prompt"])
        ax2.plot([r["prompt"] for r in rs], [r["prefill_tok_s"] for r in rs], marker=markers.get(k, "o"), label=k)
    hf = (data["peer"] or {}).get("hf")
    if hf:
        ax2.plot([hf["prompt"]], [hf["prefill_tok_s"]], "kx", markersize=9, label="HF transformers eager")
    if pre:
        # The compute ceiling as tok/s: peak FLOP/s over the FLOPs per token of each length.
        peak = None
        for p in glob.glob(os.path.join(data.get("dir", ""), "model_*.json")):
            m = load(p)
            peak = peak or (m or {}).get("peak_tflop_s")
        if peak:
            per_len = {}
            for r in pre:
                per_len[r["prompt"]] = r["flops"] / r["prompt"]
            xs = sorted(per_len)
            ax2.plot(xs, [peak * 1e12 / per_len[x] for x in xs], "k:", label=f"{peak:.0f} TFLOP/s ceiling")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("prompt length (tokens)")
    ax2.set_ylabel("prefill tok/s")
    ax2.set_title("Prefill vs prompt length")
    ax2.grid(True, alpha=0.3, which="both")
    ax2.legend()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    for ax, xs in ((ax1, sorted({r["context"] for r in dec})), (ax2, sorted({r["prompt"] for r in pre}))):
        if xs:
            ax.xaxis.set_major_locator(FixedLocator(xs))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(int(round(v)))))
    fig.suptitle(f"Kuiper, Qwen3-8B shape, fp16, {data['device'] or 'GPU'}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="folder with model_*.json, attention.json, peer.json")
    ap.add_argument("--tables", action="store_true", help="print the markdown tables")
    ap.add_argument("--png", default="", help="write the plot here (needs matplotlib)")
    a = ap.parse_args()
    data = load_dir(a.dir)
    data["dir"] = a.dir
    if not (data["decode"] or data["prefill"] or data["attention"] or data["peer"]):
        print(f"no measurements found in {a.dir}", file=sys.stderr)
        return 1
    if a.tables or not a.png:
        print(tables(data))
    if a.png:
        plot(data, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
