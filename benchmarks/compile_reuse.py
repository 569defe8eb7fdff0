"""Would ``compile: auto`` pay at the throughput sweep's 100 steps if a worker kept its
compiled graphs from one unit to the next? (issue 39, twelfth round in
benchmarks/throughput.md)

``compile: auto`` compiles a training run of at least 1,000 steps
(:mod:`variantlab.probes.compiled`), and each compiled unit starts from
``torch._dynamo.reset()``, so it traces again and loads its code from inductor's on-disk
cache. A pool worker runs many units of the same shape (a sweep's other rates and seeds),
so it could instead keep dynamo's in-memory graphs and pay the compile once per shape.
This script measures what that would give on the throughput sweep's units: width 32, 2
layers, 4 heads, bytes, 16 x 64 tokens, 100 steps, ``kernels: fast``, validation split
scored, one torch thread, one seed, the four feed-forwards (tanh GELU, ReLU, ReLU², SwiGLU)
at five learning rates: 20 units, run the way a worker runs them (``training.run``).

- **eager**: ``compile: false``, what the sweep runs;
- **compiled, reset per unit**: ``compile: true`` as the training probe runs it;
- **compiled, graphs kept**: ``compile: true`` with ``torch._dynamo.reset`` made a no-op
  after the first, so that the units of a shape reuse the first one's graphs (a what-if:
  nothing in variantlab runs so).

Each mode runs in a process of its own; rounds alternate the modes so that drift of the
machine hits all alike. Printed: per mode the median time of a shape's first unit (which
pays the trace and compile) and of the other units, the 20 units' total, and the largest
difference of a unit's validation loss from eager's.

    .venv/bin/python benchmarks/compile_reuse.py [--rounds 2] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("eager", "reset", "kept")
LABELS = {"eager": "eager", "reset": "compiled, reset per unit",
          "kept": "compiled, graphs kept"}
SHAPES = {"gelu": {"activation": {"kind": "gelu", "approximate": "tanh"}},
          "relu": {"activation": {"kind": "relu"}},
          "relu2": {"activation": {"kind": "relu2"}},
          "swiglu": {"activation": {"kind": "silu"},
                     "feedforward": {"kind": "glu", "hidden_mult": 4}}}
LRS = (1.0e-3, 3.0e-3, 1.0e-2, 3.0e-2, 1.0e-1)
MODEL = {"family": "gpt", "vocab_size": 256, "context_length": 64, "emb_dim": 32,
         "n_heads": 4, "n_layers": 2, "drop_rate": 0.0}


def child(mode: str) -> None:
    """Run the 20 units in this process under ``mode``; print one JSON line per unit."""
    import torch

    torch.set_num_threads(1)
    import variantlab as vl
    from variantlab.data.sources import StdlibData
    from variantlab.model.kernels import settings_with_kernels, with_kernels
    from variantlab.probes import training
    from variantlab.probes.training import TrainingSettings

    if mode == "kept":
        torch._dynamo.reset()
        torch._dynamo.reset = lambda: None  # the what-if: graphs outlive their unit
    reg = vl.get_registry()
    data = StdlibData(max_files=100, tokenizer="bytes")
    for shape, extra in SHAPES.items():
        spec = with_kernels(vl.parse_model_spec({**MODEL, **extra}, reg), "fast", reg)
        for lr in LRS:
            settings = settings_with_kernels({"training": TrainingSettings(
                steps=100, lr=lr, batch_size=16, seq_len=64, schedule="cosine",
                warmup_steps=20, compile=mode != "eager")}, "fast")["training"]
            settings = settings.model_copy(update={"test_split": "deferred"})
            start = time.perf_counter()
            rows = training.run(spec, settings, seed=0, data=data, device="cpu", registry=reg)
            seconds = time.perf_counter() - start
            val = next(r["value"] for r in rows if r["metric"] == "val_loss")
            compiled = next(r["value"] for r in rows if r["metric"] == "compiled")
            print(json.dumps({"shape": shape, "lr": lr, "s": seconds, "val": val,
                              "compiled": compiled}), flush=True)


def run_mode(mode: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    done = subprocess.run([sys.executable, __file__, "--child", mode], env=env,
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr}")
    units = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if {u["compiled"] for u in units} != {float(mode != "eager")}:
        raise SystemExit(f"{mode}: units ran {'eager' if mode != 'eager' else 'compiled'}")
    return units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    runs: dict[str, list[list[dict]]] = {m: [] for m in MODES}
    loads = []
    for r in range(args.rounds):
        for mode in MODES:
            loads.append(os.getloadavg()[0])
            runs[mode].append(run_mode(mode))
            total = sum(u["s"] for u in runs[mode][-1])
            print(f"round {r}, {mode}: {total:.1f} s for 20 units", flush=True)
    eager_val = {(u["shape"], u["lr"]): u["val"] for u in runs["eager"][0]}
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, Python "
             f"{platform.python_version()}; one torch thread; {args.rounds} alternating "
             f"round(s); load average at each run's start {min(loads):.2f} to "
             f"{max(loads):.2f}.", "",
             "| mode | a shape's first unit, median (s) | other units, median (s) | "
             "20 units, median total (s) | largest Δ validation loss from eager |",
             "|---|---:|---:|---:|---:|"]
    for mode in MODES:
        firsts = [u["s"] for run in runs[mode] for u in run if u["lr"] == LRS[0]]
        others = [u["s"] for run in runs[mode] for u in run if u["lr"] != LRS[0]]
        totals = [sum(u["s"] for u in run) for run in runs[mode]]
        diff = max(abs(u["val"] - eager_val[(u["shape"], u["lr"])])
                   for run in runs[mode] for u in run)
        lines.append(f"| {LABELS[mode]} | {statistics.median(firsts):.2f} | "
                     f"{statistics.median(others):.2f} | {statistics.median(totals):.1f} | "
                     f"{diff:.3g} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
