#!/usr/bin/env python3
"""Load a running kuiper-server (or any OpenAI-compatible server) as `vllm bench serve` does.

Random prompts of --input-len words go to /v1/completions (streamed, ignore_eos so every request
generates --output-len tokens) at each concurrency of --concurrency (a sweep: 1,4,16,64), and
for each the table reports request throughput, output tok/s, and TTFT, inter-token latency
(ITL) and end-to-end latency as mean, p50 and p99. Python 3 standard library only.

  python3 scripts/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,8,32,64 \
      --requests 128 --input-len 256 --output-len 128 [--json out.json]
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact").split()


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def one_request(url, model, prompt, output_len, api_key):
    """Streams one completion; returns (ttft, [inter-token gaps], e2e, output tokens) or None."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    response = conn.getresponse()
    if response.status != 200:
        response.read()
        conn.close()
        return None
    ttft, last, gaps, tokens = None, None, [], 0
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        if event.get("choices") and event["choices"][0].get("text"):
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                gaps.append(now - last)
            last = now
    conn.close()
    return ttft or 0.0, gaps, time.perf_counter() - start, tokens


def run_level(args, model, concurrency, prompts):
    results, lock, next_index = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(prompts):
                return
            r = one_request(args.url, model, prompts[i], args.output_len, args.api_key)
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    ok = [r for r in results if r is not None]
    ttft = [r[0] for r in ok]
    itl = [g for r in ok for g in r[1]]
    e2e = [r[2] for r in ok]
    tokens = sum(r[3] for r in ok)
    ms = lambda v: 1e3 * v
    return {
        "concurrency": concurrency, "requests": len(prompts), "failed": len(results) - len(ok),
        "duration_s": duration, "request_throughput": len(ok) / duration,
        "output_tok_s": tokens / duration,
        "ttft_ms": {"mean": ms(statistics.fmean(ttft)) if ttft else None,
                    "p50": ms(percentile(ttft, 50)), "p99": ms(percentile(ttft, 99))},
        "itl_ms": {"mean": ms(statistics.fmean(itl)) if itl else None,
                   "p50": ms(percentile(itl, 50)), "p99": ms(percentile(itl, 99))},
        "e2e_ms": {"mean": ms(statistics.fmean(e2e)) if e2e else None,
                   "p50": ms(percentile(e2e, 50)), "p99": ms(percentile(e2e, 99))},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="", help="default: the first of /v1/models")
    p.add_argument("--api-key", default="")
    p.add_argument("--concurrency", default="1,4,16,64", help="comma list: the sweep")
    p.add_argument("--requests", type=int, default=0, help="per level; default 4 x concurrency (>= 16)")
    p.add_argument("--input-len", type=int, default=128, help="prompt words")
    p.add_argument("--output-len", type=int, default=64, help="tokens per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args()
    model = args.model
    if not model:
        parts = urllib.parse.urlsplit(args.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=60)
        headers = {"Authorization": "Bearer " + args.api_key} if args.api_key else {}
        conn.request("GET", "/v1/models", headers=headers)
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
    rng = random.Random(args.seed)
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"{'conc':>5} {'req':>5} {'fail':>4} {'req/s':>8} {'out tok/s':>10} "
          f"{'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'E2E p50':>9} {'E2E p99':>9}  (ms)")
    rows = []
    for c in levels:
        n = args.requests or max(16, 4 * c)
        prompts = [" ".join(rng.choice(WORDS) for _ in range(args.input_len)) for _ in range(n)]
        r = run_level(args, model, c, prompts)
        rows.append(r)
        print(f"{c:>5} {n:>5} {r['failed']:>4} {r['request_throughput']:>8.2f} {r['output_tok_s']:>10.1f} "
              f"{r['ttft_ms']['p50']:>9.1f} {r['ttft_ms']['p99']:>9.1f} {r['itl_ms']['p50']:>8.2f} "
              f"{r['itl_ms']['p99']:>8.2f} {r['e2e_ms']['p50']:>9.1f} {r['e2e_ms']['p99']:>9.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "model": model, "input_len": args.input_len,
                       "output_len": args.output_len, "levels": rows}, f, indent=2)
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
