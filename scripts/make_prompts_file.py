#!/usr/bin/env python3
"""Writes a JSONL prompts file for --prompts-file runs at scale (issue 13's 1000-line check):
LINES lines of varied chat prompts asking for up to MAX_TOKENS tokens each, and every 97th line
(from line 14) a bad one of four kinds: broken JSON, an out-of-range top_p, a max_tokens of the
wrong type, invalid UTF-8. The same arguments give the same file.
usage: make_prompts_file.py OUT [--lines 1000] [--max-tokens 128] [--seed 0]"""
import argparse
import json
import random

TOPICS = ["the sea", "a city at night", "prime numbers", "how bread rises", "a long journey",
          "the history of maps", "why the sky is blue", "a quiet library", "volcanoes",
          "learning to swim", "the moon landing", "a chess opening", "autumn leaves"]
ASKS = ["Write a short story about {}.", "Explain {} to a child.", "List five facts about {}.",
        "Write a poem about {}.", "Describe {} in detail.", "What would you ask an expert on {}?"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    bad = 0
    with open(a.out, "wb") as f:
        for i in range(a.lines):
            if i % 97 == 13:
                bad += 1
                f.write([b'{not json', json.dumps({"prompt": "x", "top_p": 2.0}).encode(),
                         json.dumps({"prompt": "x", "max_tokens": "many"}).encode(),
                         b'{"prompt": "bad \xff"}'][bad % 4] + b"\n")
                continue
            prompt = rng.choice(ASKS).format(rng.choice(TOPICS))
            line = {"prompt": f"{i}: {prompt}",
                    "max_tokens": rng.randint(a.max_tokens // 2, a.max_tokens)}
            f.write(json.dumps(line).encode() + b"\n")
    print(f"{a.out}: {a.lines} lines, {bad} bad")


if __name__ == "__main__":
    main()
