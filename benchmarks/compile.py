"""Compiled vs eager forward+backward per variant, through the timing probe.

For each variant the timing probe runs twice on the same seed and batch: ``compile:
false`` and ``compile: true`` (inductor). Reported: the eager and compiled medians of a
forward+backward (``backward`` pass), their ratio, and the compile time of the compiled
run's first call (``backward_compile_s``). Eager and compiled alternate per variant so
drift of a shared machine hits both alike.

    .venv/bin/python benchmarks/compile.py [--threads 1] [--repeats 10] [--device cpu]
        [--markdown F]

``--device cuda`` measures the same models on a GPU (the timing probe synchronises the
device around each timed block), where the question is whether compiling pays at all
for models this small.
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch

import variantlab as vl
from variantlab.probes import run_probe
from variantlab.probes.timing import device_name

REG = vl.get_registry()

BASE = {"family": "gpt", "vocab_size": 1024, "context_length": 64, "emb_dim": 64,
        "n_heads": 4, "n_layers": 2, "drop_rate": 0.0}
VARIANTS = {
    "layer norm, gelu mlp": {},
    "rms norm, gelu mlp": {"norm": {"kind": "rms"}},
    "layer norm, swiglu": {"feedforward": {"kind": "glu"}, "activation": {"kind": "silu"}},
}


def measure(model: dict, compile_: bool, repeats: int, device: str) -> dict[str, float]:
    settings = {"batch_size": 4, "seq_len": 64, "passes": ["backward"], "warmup": 3,
                "repeats": repeats, "device": device, "compile": compile_}
    rows = run_probe("timing", model, settings, seed=0, registry=REG)
    return {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=10, help="timed blocks per run")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = [
        f"{device_name(torch.device(args.device))}, torch {torch.__version__}, Python "
        f"{platform.python_version()}, {args.threads} thread(s); gpt emb_dim 64, 2 layers, "
        "4 heads, vocab 1024, batch 4 x 64 tokens, float32, forward+backward",
        "",
        "| variant | eager median (ms) | compiled median (ms) | compiled / eager | "
        "compile time (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, over in VARIANTS.items():
        model = {**BASE, **over}
        eager = measure(model, False, args.repeats, args.device)
        compiled = measure(model, True, args.repeats, args.device)
        e, c = eager["backward_median_s"], compiled["backward_median_s"]
        lines.append(f"| {name} | {e * 1e3:.3f} | {c * 1e3:.3f} | {c / e:.3f} | "
                     f"{compiled['backward_compile_s']:.1f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
