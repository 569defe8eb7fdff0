"""Held-out scoring on CPU: one forward of a whole scoring batch against forwards of pieces of
``FORWARD_TOKENS`` positions (what :func:`variantlab.probes.heldout.evaluate` does), on the
first variant of committed experiments, one torch thread.

Prints a markdown table: per experiment, the positions per row, the rows of a scoring batch
(:func:`variantlab.data.heldout.eval_rows`), the median time of one scoring batch's forward
whole and in pieces, their ratio, and whether the outputs are the same bits.

    python benchmarks/scoring_pieces.py [--repeats 5] [experiments/x.yaml ...]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from variantlab.config.experiment import load_experiment
from variantlab.data.heldout import eval_rows
from variantlab.model.build import make_model
from variantlab.model.tasks import task_for
from variantlab.probes.heldout import FORWARD_TOKENS, couples_rows, forward, piece_rows

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["gelu-vs-relu", "pre-vs-post-norm", "llama-vs-gpt2", "hybrid-ratio",
           "zoology-mqar", "nope-recall"]


def timed(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(path: Path, repeats: int) -> dict:
    exp = load_experiment(path)
    spec = exp.variants[0].spec
    settings = exp.measure.probes()["training"]
    seq_len = settings.seq_len
    rows = eval_rows(spec, settings.batch_size, seq_len)
    model = make_model(spec, 0, exp.registry).eval()
    batch = task_for(spec, exp.registry).batch(spec, rows, seq_len,
                                               generator=torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    per = piece_rows(model, batch, cpu, couples_rows(model))
    with torch.no_grad():
        whole = timed(lambda: forward(model, batch, None), repeats)
        pieces = timed(lambda: forward(model, batch, per), repeats)
        same = torch.equal(forward(model, batch, None), forward(model, batch, per))
    return {"name": path.stem, "positions": seq_len, "rows": rows, "per": per,
            "whole": whole, "pieces": pieces, "same": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="*", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    paths = args.experiments or [ROOT / "experiments" / f"{n}.yaml" for n in DEFAULT]
    print(f"Machine: {platform.machine()}, torch {torch.__version__}, one thread; pieces of "
          f"{FORWARD_TOKENS} positions; median of {args.repeats}.\n")
    print("| experiment | positions per row | rows per scoring batch | rows per piece "
          "| whole (ms) | pieces (ms) | pieces / whole | same bits |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for path in paths:
        r = measure(path, args.repeats)
        print(f"| {r['name']} | {r['positions']} | {r['rows']} | {r['per'] or r['rows']} "
              f"| {r['whole'] * 1e3:.0f} | {r['pieces'] * 1e3:.0f} "
              f"| {r['pieces'] / r['whole']:.2f} | {'yes' if r['same'] else 'NO'} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
