"""What each executor adds per unit: 48 small units in process, in a pool of 2 and on Ray.

The experiment: 12 tiny GPT variants (norm x residual x n_layers) x 2 seeds x 2 probes
(params; gradients of one 2 x 16 batch), so the units themselves take milliseconds and the
executor's own costs show. Each executor runs it into a fresh run folder through
``run_experiment``; the progress events give the times at which units were stored.

- wall: the whole ``run_experiment`` call, start-up (spawning processes, starting Ray and
  connecting) included;
- start-up: from the call until the first unit was stored;
- per-unit overhead: worker time per unit beyond the unit's own duration, in the steady
  state: ``(t_last - t_first) * P / (n - 1) - mean duration``, with ``P`` the units that run
  at once (1 in process, 2 for the pool and Ray) and ``t`` the times units were stored.

Ray here is a local instance (``--workers 2``: 2 CPUs) started by the run. Every unit runs
with one torch thread (the pool's and Ray's workers get one each on 2 CPUs; the driver is
set to one too), so the executors differ only in how units reach a process and come back.

    .venv/bin/python benchmarks/executors.py [--rounds 3] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import torch

from variantlab.config.experiment import experiment_from_text
from variantlab.executors.runner import run_experiment
from variantlab.store.store import load_run

EXPERIMENT = """\
name: executors
seeds: [0, 1]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
        n_layers: 2, drop_rate: 0.0}
grid:
  norm.kind: [layer, rms]
  residual.kind: [pre_norm, post_norm]
  n_layers: [1, 2, 3]
measure:
  params: {}
  gradients: {batch_size: 2, seq_len: 16, batches: 1}
"""
EXECUTORS = [("inprocess", {}, 1), ("pool", {"workers": 2}, 2), ("ray", {"workers": 2}, 2)]


def measure(name: str, options: dict, parallel: int, out: Path) -> dict[str, float]:
    experiment = experiment_from_text(EXPERIMENT)
    stored: list[float] = []
    t0 = time.perf_counter()

    def progress(event) -> None:
        if event.kind in ("ok", "failed"):
            stored.append(time.perf_counter() - t0)

    summary = run_experiment(experiment, out, executor=name, executor_options=options,
                             progress=progress)
    wall = time.perf_counter() - t0
    if summary.done != 48:
        errors = sorted({error for _, error in summary.failed})
        raise SystemExit(f"{name}: {summary.done} of 48 units computed; {errors[:3]}")
    mean = float(load_run(summary.run_dir).units.duration_s.mean())
    steady = (stored[-1] - stored[0]) * parallel / (len(stored) - 1)
    return {"wall": wall, "startup": stored[0], "mean": mean, "overhead": steady - mean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    # a local Ray instance with token authentication, without writing ~/.ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    torch.set_num_threads(1)
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in EXECUTORS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # rounds alternate executors: drift hits all alike
            for name, options, parallel in EXECUTORS:
                results[name].append(measure(name, options, parallel, Path(tmp) / f"{name}{r}"))
    lines = [f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical "
             f"CPUs, torch {torch.__version__}, Python {platform.python_version()}; "
             f"{args.rounds} rounds, medians.", "",
             "| executor | wall (s) | start-up (s) | mean unit (ms) | per-unit overhead (ms) |",
             "|---|---:|---:|---:|---:|"]
    for name, _, parallel in EXECUTORS:
        med = {k: statistics.median(r[k] for r in results[name]) for k in results[name][0]}
        label = name if parallel == 1 else f"{name} ({parallel})"
        lines.append(f"| {label} | {med['wall']:.2f} | {med['startup']:.2f} | "
                     f"{med['mean'] * 1e3:.1f} | {med['overhead'] * 1e3:.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
