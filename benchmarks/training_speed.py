"""The training probe's tokens/s against a bare hand-written loop, and the memmap loader's speed.

Trainer: both train the same model (same seed, same spec) on the same windows of the same
corpus (the stdlib sources, GPT-2 BPE through the token cache) with AdamW, gradient clipping
at 1.0 and the same steps. The probe is ``variantlab.probes.training.run`` (recipe, schedule
per step, loss rows, divergence check, tokens and FLOPs; ``eval_batches: 0``); the bare loop is
plain torch over the batches ``datalib.batches`` gives. Each path is timed from model build to
its last step, batch making included. Rounds alternate probe and bare so that drift of a
shared machine hits both alike.

Held-out scoring: making the fixed validation and test sets (:mod:`variantlab.data.heldout`,
the default ``eval_tokens``) and scoring a model on both, as the probe does after training,
timed in the same rounds and set beside the probe's training time.

Loader: the first tokenisation of the corpus (an empty cache folder), opening the cached
memmap and splitting it in a fresh state (the in-process split cache cleared), and drawing
training windows (tokens/s of ``datalib.batches``).

    .venv/bin/python benchmarks/training_speed.py [--rounds 7] [--steps 30] [--markdown F]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import StdlibData
from variantlab.model.build import resolve_spec
from variantlab.model.tasks import task_for
from variantlab.probes import training
from variantlab.probes.heldout import HeldOut
from variantlab.probes.training import TrainingSettings

REG = vl.get_registry()
MODEL = {
    "family": "gpt", "vocab_size": 1024, "context_length": 64, "emb_dim": 64,
    "n_heads": 4, "n_layers": 2, "drop_rate": 0.0,
}
DATA = StdlibData(max_files=60)


def probe_time(spec, settings: TrainingSettings) -> float:
    start = time.perf_counter()
    training.run(spec, settings, seed=0, data=DATA, device="cpu", registry=REG)
    return time.perf_counter() - start


def bare_time(spec, settings: TrainingSettings) -> float:
    start = time.perf_counter()
    torch.manual_seed(0)
    model = vl.build_model(spec, REG)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.1)
    task = task_for(spec, REG)
    for batch in datalib.batches(DATA, spec, settings.batch_size, settings.seq_len,
                                 settings.steps, seed=0, registry=REG):
        opt.zero_grad(set_to_none=True)
        loss = task.loss(spec, model(**batch.inputs), batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return time.perf_counter() - start


def scoring_time(spec, settings: TrainingSettings) -> tuple[float, int]:
    """Seconds to make both held-out sets and score a fresh model on them, and the targets
    scored per split."""
    start = time.perf_counter()
    torch.manual_seed(0)
    model = vl.build_model(spec, REG)
    held = HeldOut(DATA, spec, settings.model_copy(update={"eval_batches": None}), ".", REG)
    task = task_for(spec, REG)
    scores = [held.score(split, model, lambda out, b: task.loss(spec, out, b),
                         torch.device("cpu")) for split in ("val", "test")]
    return time.perf_counter() - start, scores[0].tokens


def loader(spec, batch_size: int, seq_len: int, n: int) -> dict[str, float]:
    """Seconds to tokenise (cold) and to open + split (warm), and window tokens/s."""
    datalib._SPLITS.clear()
    start = time.perf_counter()
    datalib.corpus_splits(DATA)
    cold = time.perf_counter() - start
    datalib._SPLITS.clear()
    start = time.perf_counter()
    parts, _ = datalib.corpus_splits(DATA)
    warm = time.perf_counter() - start
    start = time.perf_counter()
    datalib.batches(DATA, spec, batch_size, seq_len, n, seed=0, registry=REG)
    draw = time.perf_counter() - start
    return {"cold": cold, "warm": warm, "tok_s": n * batch_size * seq_len / draw,
            "corpus": float(len(parts.train) + len(parts.val) + len(parts.test))}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    names = [line.split(":", 1)[1].strip() for line in out.splitlines()
             if line.startswith("Model name")]
    return names[0] if names else "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables as Markdown")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["VARIANTLAB_CACHE"] = tempfile.mkdtemp(prefix="vl-bench-cache-")

    spec = resolve_spec(MODEL, REG)
    settings = TrainingSettings(steps=args.steps, lr=1e-3, batch_size=args.batch_size,
                                seq_len=args.seq_len, eval_batches=0, device="cpu")
    load = loader(spec, args.batch_size, args.seq_len, 2000)
    tokens = args.steps * args.batch_size * args.seq_len
    probe_time(spec, settings)  # warm-up: first-call costs out of the rounds
    bare_time(spec, settings)
    probe, bare, scoring = [], [], []
    for r in range(args.rounds):
        probe.append(probe_time(spec, settings))
        bare.append(bare_time(spec, settings))
        scoring.append(scoring_time(spec, settings)[0])
        print(f"round {r + 1}: probe {tokens / probe[-1]:.0f} tok/s, "
              f"bare {tokens / bare[-1]:.0f} tok/s", file=sys.stderr)
    ratios = [b / p for p, b in zip(probe, bare)]  # probe tok/s over bare tok/s
    p_tok, b_tok = tokens / statistics.median(probe), tokens / statistics.median(bare)
    scored = scoring_time(spec, settings)[1]
    train_s, score_s = statistics.median(probe), statistics.median(scoring)
    n_params = sum(p.numel() for p in vl.build_model(spec, REG).parameters())
    machine = (f"{cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
               f"({torch.get_num_threads()} threads), Python {platform.python_version()}")
    text = (
        f"Machine: {machine}\n\n"
        f"Trainer: a gpt (emb_dim {MODEL['emb_dim']}, {MODEL['n_layers']} layers, vocab "
        f"{MODEL['vocab_size']}, {n_params:,} parameters), {args.steps} AdamW steps of "
        f"{args.batch_size} x {args.seq_len} tokens on the stdlib corpus ({DATA.max_files} "
        f"files), float32, {args.rounds} alternating rounds; medians over rounds. Per-round "
        f"ratios (probe tok/s / bare tok/s): {', '.join(f'{x:.3f}' for x in ratios)} (median "
        f"{statistics.median(ratios):.3f}).\n\n"
        "| path | tokens/s (median) | ratio to bare |\n|---|---:|---:|\n"
        f"| training probe | {p_tok:,.0f} | {p_tok / b_tok:.3f} |\n"
        f"| bare loop | {b_tok:,.0f} | 1.000 |\n\n"
        f"Held-out scoring: {scored:,} targets per split (val and test), sets made and scored "
        f"in eval mode, against the probe's {args.steps} training steps ({tokens:,} tokens).\n\n"
        "| path | seconds (median) | ratio to training |\n|---|---:|---:|\n"
        f"| training ({args.steps} steps) | {train_s:.3f} | 1.000 |\n"
        f"| held-out scoring (val + test) | {score_s:.3f} | {score_s / train_s:.3f} |\n"
        f"\nHeld-out scoring costs as much as {score_s / train_s * args.steps:.0f} training "
        f"steps of {args.batch_size} x {args.seq_len} tokens.\n\n"
        f"Loader: the corpus is {load['corpus']:,.0f} GPT-2 tokens.\n\n"
        "| step | result |\n|---|---:|\n"
        f"| tokenise and write the cache (cold) | {load['cold']:.3f} s |\n"
        f"| open the memmap and split (warm) | {load['warm']:.3f} s |\n"
        f"| draw training windows | {load['tok_s']:,.0f} tokens/s |\n"
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
