"""Multi-head latent attention against grouped-query and multi-head attention at equal KV
cache: forward+backward time and the memory saved for the backward against sequence length
(issue 29.5). The measurement is benchmarks/mixers.py's (one attention alone, emb_dim 64,
4 heads of 16, batch 1, float32, CPU); only the list of attentions differs. KV cache per
token: mha 2 x 4 x 16 = 128 numbers, GQA with one key/value head 2 x 16 = 32, MLA with
kv_lora_rank 24 and qk_rope_head_dim 8: 24 + 8 = 32 (equal to that GQA), and MLA with the
default kv_lora_rank 64: 72.

    .venv/bin/python benchmarks/mla.py [--threads 1] [--repeats 3] [--markdown F]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mixers as bench  # noqa: E402  (benchmarks/mixers.py)

MLA_32 = {"kind": "mla", "kv_lora_rank": 24, "qk_rope_head_dim": 8}
bench.MIXERS = {
    "mha naive": {"kind": "mha"},
    "mha sdpa": {"kind": "mha", "impl": "sdpa"},
    "gqa kv1 naive": {"kind": "mha", "n_kv_heads": 1},
    "gqa kv1 sdpa": {"kind": "mha", "n_kv_heads": 1, "impl": "sdpa"},
    "mla r24 naive": MLA_32,
    "mla r24 sdpa": dict(MLA_32, impl="sdpa"),
    "mla r24 absorbed": dict(MLA_32, impl="absorbed"),
    "mla r64 sdpa": {"kind": "mla", "impl": "sdpa"},
}
bench.LENGTHS = (128, 256, 512, 1024, 2048)


def cache_table() -> str:
    """KV cache numbers per token and layer (``state_size(t + 1) - state_size(t)``)."""
    rows = ["", "KV cache per token and layer (numbers; x4 bytes in float32):", "",
            "| attention | cache |", "|---|---:|"]
    for name, attention in bench.MIXERS.items():
        module = bench.build(attention)
        rows.append(f"| {name} | {module.state_size(2) - module.state_size(1)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    code = bench.main()
    table = cache_table()
    print(table)
    if "--markdown" in sys.argv:
        with open(sys.argv[sys.argv.index("--markdown") + 1], "a") as f:
            f.write(table + "\n")
    raise SystemExit(code)
