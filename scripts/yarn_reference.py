#!/usr/bin/env python3
"""YaRN's rotary frequencies and attention factor as transformers computes them, printed as the
C++ initialisers of test/yarn_test.cpp (run on a machine with transformers; the numbers there
came from transformers 5.17).

Usage: python3 scripts/yarn_reference.py
"""
from transformers import Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# (name, head_dim, config.json's rope fields): Qwen3's documented setting in the older
# rope_scaling style, and every optional key in the newer rope_parameters style.
CASES = [
    ("qwen3", 128, {"max_position_embeddings": 131072, "rope_theta": 1000000.0,
                    "rope_scaling": {"type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 32768}}),
    ("options", 64, {"max_position_embeddings": 163840,
                     "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0,
                                         "factor": 40.0, "beta_fast": 16.0, "beta_slow": 2.0,
                                         "mscale": 0.707, "mscale_all_dim": 1.0,
                                         "original_max_position_embeddings": 4096,
                                         "truncate": False}}),
    ("attention_factor", 64, {"max_position_embeddings": 65536,
                              "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0,
                                                  "factor": 2.0, "attention_factor": 0.8,
                                                  "original_max_position_embeddings": 32768}}),
]


def main():
    for name, head_dim, rope in CASES:
        fields = {"hidden_size": 4 * head_dim, "num_attention_heads": 4, "head_dim": head_dim}
        fields.update(rope)
        config = Qwen3Config.from_dict(fields)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
        values = ", ".join("%.9g" % v for v in inv_freq.tolist())
        print(f"// {name}: {config.rope_parameters}")
        print(f"{{{head_dim}, {attention_factor!r}, {{{values}}}}},")


if __name__ == "__main__":
    main()
