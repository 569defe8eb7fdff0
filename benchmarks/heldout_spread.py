"""How much of the seed-to-seed spread of test loss comes from which windows were scored.

One variant (a pre-LN GPT, width 32, 2 layers, UTF-8 bytes of the stdlib sources,
``max_files: 100``) is trained with the training probe's own loop (``training.setup`` and
``training.train``) under several seeds. Each trained model is then scored two ways on the
test split:

- **random windows** (the old rule): ``--batches`` batches of ``batch_size`` windows at random
  starts, drawn with the unit's seed (``seed + 2_000_029``), so every seed scores other text;
- **fixed windows** (the rule now): the test split's fixed set (:mod:`variantlab.data.heldout`),
  the same windows for every seed, up to ``eval_tokens`` targets.

The table gives each seed's test loss both ways and the standard deviation over seeds; the
ratio of the two is how much narrower a seed-level interval becomes.

    .venv/bin/python benchmarks/heldout_spread.py [--seeds 6] [--steps 60] [--markdown F]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import dataclass

import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import StdlibData
from variantlab.model.build import resolve_spec
from variantlab.probes import training
from variantlab.probes.heldout import HeldOut, evaluate
from variantlab.probes.training import TrainingSettings

REG = vl.get_registry()
MODEL = {"family": "gpt", "vocab_size": 256, "context_length": 64, "emb_dim": 32,
         "n_heads": 4, "n_layers": 2, "drop_rate": 0.0}
DATA = StdlibData(max_files=100, tokenizer="bytes")
OLD_TEST_OFFSET = 2_000_029  # the seed offset the old test batches were drawn with


@dataclass(frozen=True)
class Spread:
    seeds: list[int]
    random: list[float]  # test loss per seed over its own random windows
    fixed: list[float]  # test loss per seed over the fixed windows
    fixed_tokens: int
    random_tokens: int

    def sd(self, which: str) -> float:
        return statistics.stdev(getattr(self, which))


def measure(seeds: list[int], steps: int, batches: int = 8, batch_size: int = 16,
            seq_len: int = 64) -> Spread:
    """Train one variant under each seed, score its test loss both ways."""
    spec = resolve_spec(MODEL, REG)
    settings = TrainingSettings(steps=steps, lr=3e-3, batch_size=batch_size, seq_len=seq_len,
                                schedule="cosine", warmup_steps=max(1, steps // 10),
                                device="cpu")
    held = HeldOut(DATA, spec, settings, ".", REG)
    random, fixed = [], []
    for seed in seeds:
        dev, model, opt, train_batches, loss = training.setup(spec, settings, seed, DATA, ".",
                                                              "cpu", REG)
        training.train(model, model, opt, loss, train_batches, dev, settings)
        own = datalib.batches(DATA, spec, batch_size, seq_len, batches,
                              seed=seed + OLD_TEST_OFFSET, registry=REG, split="test")
        random.append(evaluate(model, loss, own, dev).loss)
        fixed.append(held.score("test", model, loss, dev).loss)
        print(f"seed {seed}: random windows {random[-1]:.4f}, fixed windows {fixed[-1]:.4f}",
              file=sys.stderr)
    tokens = sum(b.target.numel() for b in held.batches("test"))
    return Spread(seeds, random, fixed, tokens, batches * batch_size * seq_len)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("VARIANTLAB_CACHE", tempfile.mkdtemp(prefix="vl-bench-cache-"))
    got = measure(list(range(args.seeds)), args.steps)
    rows = "".join(f"| {s} | {r:.4f} | {f:.4f} |\n"
                   for s, r, f in zip(got.seeds, got.random, got.fixed))
    text = (
        f"Machine: {os.cpu_count()} logical CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}\n\n"
        f"One variant (gpt, width {MODEL['emb_dim']}, {MODEL['n_layers']} layers, "
        f"stdlib bytes, max_files {DATA.max_files}), {args.steps} cosine steps of 16 x 64 "
        f"tokens, {args.seeds} seeds; test loss over each seed's own random windows "
        f"({got.random_tokens:,} targets) and over the fixed windows ({got.fixed_tokens:,} "
        "targets, the same for every seed).\n\n"
        "| seed | random windows | fixed windows |\n|---:|---:|---:|\n" + rows +
        f"| **sd over seeds** | **{got.sd('random'):.4f}** | **{got.sd('fixed'):.4f}** |\n\n"
        f"The fixed windows' sd is {got.sd('fixed') / got.sd('random'):.2f} x the random "
        "windows'.\n"
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
