"""What the timing probe adds to a forward+backward: probe vs a bare torch loop.

Both time the same model (same seed, same parameters), the same batch and the same timer
(``variantlab.probes.timing.time_fn``: warm-up, blocks of calls, median and IQR from
``torch.utils.benchmark``). The bare loop is three lines of plain torch; the probe goes
through ``run_probe("timing", ...)`` (spec loss, autocast context, the probe's closures).
Rounds alternate probe and bare so drift of a shared machine hits both alike.

    .venv/bin/python benchmarks/timing_overhead.py [--device cpu] [--rounds 5] [--markdown F]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

import torch
import torch.nn.functional as F

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData
from variantlab.model.build import resolve_spec
from variantlab.probes import run_probe
from variantlab.probes.timing import device_name, time_fn

REG = vl.get_registry()

MODEL = {
    "family": "gpt", "vocab_size": 1024, "context_length": 64, "emb_dim": 64,
    "n_heads": 4, "n_layers": 2, "drop_rate": 0.0,
}


def bare_median(spec, batch_size: int, seq_len: int, seed: int, device: str,
                warmup: int, repeats: int) -> tuple[float, float]:
    torch.manual_seed(seed)
    model = vl.build_model(spec, REG).to(device)
    model.train()
    (batch,) = datalib.batches(SyntheticData(), spec, batch_size, seq_len, 1, seed=seed, registry=REG)
    idx, target = batch.inputs["idx"].to(device), batch.target.to(device)

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(idx).flatten(0, 1), target.flatten()).backward()

    m = time_fn(fwd_bwd, warmup, repeats, label="bare")
    return m.median, m.iqr


def probe_median(spec, settings: dict, seed: int) -> tuple[float, float]:
    rows = run_probe("timing", spec, settings, seed=seed, registry=REG)
    got = {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}
    return got["backward_median_s"], got["backward_iqr_s"]


def machine(device: str) -> str:
    threads = torch.get_num_threads()
    return (f"{device_name(torch.device(device))}; {os.cpu_count()} logical CPUs, torch "
            f"{torch.__version__} ({threads} threads), Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    spec = resolve_spec(MODEL, REG)
    settings = {"batch_size": args.batch_size, "seq_len": args.seq_len, "passes": ["backward"],
                "warmup": 3, "repeats": args.repeats, "device": args.device}
    probe, bare = [], []
    for r in range(args.rounds):
        probe.append(probe_median(spec, settings, seed=0))
        bare.append(bare_median(spec, args.batch_size, args.seq_len, 0, args.device, 3,
                                args.repeats))
        print(f"round {r + 1}: probe {probe[-1][0] * 1e3:.3f} ms, bare {bare[-1][0] * 1e3:.3f} ms",
              file=sys.stderr)
    p_med = statistics.median(m for m, _ in probe)
    b_med = statistics.median(m for m, _ in bare)
    p_iqr = statistics.median(i for _, i in probe)
    b_iqr = statistics.median(i for _, i in bare)
    ratios = [p[0] / b[0] for p, b in zip(probe, bare)]
    ratio = p_med / b_med
    header = ("| path | median (ms) | IQR (ms) | ratio to bare |\n"
              "|---|---:|---:|---:|\n")
    table = header + (
        f"| timing probe | {p_med * 1e3:.3f} | {p_iqr * 1e3:.3f} | {ratio:.4f} |\n"
        f"| bare torch loop | {b_med * 1e3:.3f} | {b_iqr * 1e3:.3f} | 1.0000 |\n"
    )
    n_params = sum(p.numel() for p in vl.build_model(spec, REG).parameters())
    desc = (f"forward+backward of a gpt (emb_dim {MODEL['emb_dim']}, {MODEL['n_layers']} layers, "
            f"{MODEL['n_heads']} heads, vocab {MODEL['vocab_size']}, {n_params:,} parameters), "
            f"batch {args.batch_size} x {args.seq_len} tokens, float32, {args.rounds} alternating "
            f"rounds of {args.repeats} timed blocks each; medians over rounds. Per-round "
            f"ratios: {', '.join(f'{x:.3f}' for x in ratios)} (median "
            f"{statistics.median(ratios):.3f}).")
    text = f"Machine: {machine(args.device)}\n\n{desc}\n\n{table}"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
