#!/usr/bin/env python3
"""Issue 13's throughput table and curve, from the JSON that scripts/throughput.sh writes.

  python3 scripts/plot_throughput.py DIR --tables                  # markdown table on stdout
  python3 scripts/plot_throughput.py DIR --png docs/throughput.png  # tok/s and latency vs concurrency

DIR holds throughput.json (kuiper-bench --throughput --json) and peer_batched.json
(scripts/peer_bench.py --batched --json), both from one device call; a missing peer is left out.
Kuiper's decode figure is the full-batch decode rate (the steps in which every running sequence
decoded one token: the peer's workload); its latency the inter-token latency p50 / p99 and the
time to first token. The peer's step time is its inter-token latency (every sequence gets one
token a step). --tables needs only the standard library; --png needs matplotlib
(apt-get install python3-matplotlib).
"""
import argparse
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"note: {path}: {e}", file=sys.stderr)
        return None


def load_dir(d):
    """(kuiper rows by concurrency, peer rows by batch, device name, commands)."""
    bench = load(os.path.join(d, "throughput.json")) or {}
    peer = load(os.path.join(d, "peer_batched.json")) or {}
    kuiper = {}
    for r in bench.get("throughput", []):
        if r.get("attention", "flash2") == "flash2" or r["concurrency"] not in kuiper:
            kuiper[r["concurrency"]] = r
    peers = {r["batch"]: r for r in peer.get("batched", [])}
    device = (bench.get("device") or {}).get("name") or (peer.get("device") or {}).get("name") or "GPU"
    commands = [c for c in (bench.get("command"), peer.get("command")) if c]
    return kuiper, peers, device, commands


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def tables(kuiper, peers):
    out = ["| B | peer tok/s | Kuiper full-batch decode tok/s | / peer | output tok/s | "
           "ITL p50 / p99 ms | TTFT p50 / p99 ms |",
           "|---|---|---|---|---|---|---|"]
    for b in sorted(set(kuiper) | set(peers)):
        k, p = kuiper.get(b), peers.get(b)
        mine = k["full_batch_decode_tok_s"] if k and k.get("full_batch_decode_tok_s") else None
        theirs = p["output_tok_s"] if p else None
        ratio = mine / theirs if mine and theirs else None
        out.append(
            f"| {b} | {fmt(theirs, '.0f')} | {fmt(mine, '.1f')} | {fmt(ratio, '.2f')} | "
            f"{fmt(k and k['output_tok_s'], '.1f')} | "
            f"{fmt(k and k['itl_ms_p50'], '.2f')} / {fmt(k and k['itl_ms_p99'], '.2f')} | "
            f"{fmt(k and k['ttft_ms_p50'], '.0f')} / {fmt(k and k['ttft_ms_p99'], '.0f')} |")
    return "\n".join(out)


def plot(kuiper, peers, device, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    ks = sorted(b for b in kuiper if kuiper[b].get("full_batch_decode_tok_s"))
    ps = sorted(peers)
    if ks:
        ax1.plot(ks, [kuiper[b]["full_batch_decode_tok_s"] for b in ks], "o-",
                 label="Kuiper, full-batch decode")
        ax1.plot(ks, [kuiper[b]["output_tok_s"] for b in ks], "s:",
                 label="Kuiper, whole run (prefill included)")
    if ps:
        ax1.plot(ps, [peers[b]["output_tok_s"] for b in ps], "^--", label="PyTorch peer (graph, SDPA)")
        ax1.plot(ps, [1.3 * peers[b]["output_tok_s"] for b in ps], color="gray", linewidth=0.8,
                 linestyle="--", label="1.3 x peer")
    ax1.set(xscale="log", yscale="log", xlabel="concurrent sequences", ylabel="output tok/s",
            title="Decode throughput vs concurrency")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    ls = sorted(kuiper)
    if ls:
        ax2.plot(ls, [kuiper[b]["itl_ms_p50"] for b in ls], "o-", label="Kuiper ITL p50")
        ax2.plot(ls, [kuiper[b]["itl_ms_p99"] for b in ls], "o:", label="Kuiper ITL p99")
        ax2.plot(ls, [kuiper[b]["ttft_ms_p50"] for b in ls], "s-", label="Kuiper TTFT p50")
    if ps:
        ax2.plot(ps, [peers[b]["ms_per_step"] for b in ps], "^--", label="peer step (= its ITL)")
    ax2.set(xscale="log", yscale="log", xlabel="concurrent sequences", ylabel="ms",
            title="Latency vs concurrency")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ticks = sorted(set(ks) | set(ps) | set(ls))
        if ticks:
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(t) for t in ticks])
            ax.minorticks_off()
    fig.suptitle(device, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="where throughput.json and peer_batched.json are")
    ap.add_argument("--tables", action="store_true", help="print the markdown table")
    ap.add_argument("--png", default="", help="write the plot here (needs matplotlib)")
    args = ap.parse_args()
    kuiper, peers, device, commands = load_dir(args.dir)
    if not kuiper and not peers:
        print(f"error: no throughput.json or peer_batched.json with results in {args.dir}", file=sys.stderr)
        return 1
    if args.tables or not args.png:
        print(tables(kuiper, peers))
        for c in commands:
            print(f"\n`{c}`")
    if args.png:
        plot(kuiper, peers, device, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
