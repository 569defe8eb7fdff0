"""A short AdamW run: loss per step, final and best loss, a divergence flag.

The learning rate rises linearly over ``warmup_steps`` (step i uses lr·(i+1)/warmup_steps)
and then stays at ``lr``; gradients are clipped to a global L2 norm of ``grad_clip``. The
run stops at the first non-finite loss.

- ``final_loss``: mean training loss over the last tenth of the steps (at least one), so one
  noisy batch does not decide it; ``best_loss``: the lowest step loss;
- ``eval_loss``: after training, the mean loss in eval mode (dropout off, BatchNorm on its
  running statistics) over ``eval_batches`` fresh batches drawn with another seed;
- ``diverged``: 1 when a loss was NaN/inf or the final loss is above the first step's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from .. import data as datalib
from ..registry import Registry
from ..rows import Row, row
from ..settings import TrainingSettings
from ..specs import ModelSpec
from .common import autocast, make_model, resolve_device

#: Eval batches come from the data with this offset added to the unit's seed.
EVAL_SEED_OFFSET = 1_000_003


def lr_at(step: int, settings: TrainingSettings) -> float:
    """Linear warm-up, then constant."""
    if settings.warmup_steps and step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    return settings.lr


def run(
    spec: ModelSpec, settings: TrainingSettings, *, seed: int, data: Any = None,
    base_dir: Path | str = ".", device: str | None = None, registry: Registry | None = None,
) -> list[Row]:
    dev = resolve_device(device or settings.device)
    model = make_model(spec, seed, registry, dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr,
                            weight_decay=settings.weight_decay)
    batches = datalib.batches(data, spec, settings.batch_size, settings.seq_len, settings.steps,
                              seed=seed, base_dir=base_dir)
    losses: list[float] = []
    for step, batch in enumerate(batches):
        batch = batch.to(dev)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings)
        opt.zero_grad(set_to_none=True)
        with autocast(settings.dtype, dev):
            loss = spec.loss(model(**batch.inputs), batch)
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value):
            break
        loss.backward()
        if settings.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()

    rows = [row("training", "loss", v, step=i) for i, v in enumerate(losses)]
    finite = [v for v in losses if math.isfinite(v)]
    tail = losses[-max(1, len(losses) // 10):]
    final = sum(tail) / len(tail)
    diverged = len(finite) < len(losses) or final > losses[0]
    rows += [
        row("training", "final_loss", final),
        row("training", "best_loss", min(finite) if finite else math.nan),
        row("training", "diverged", float(diverged)),
    ]
    if settings.eval_batches and math.isfinite(final):
        held = datalib.batches(data, spec, settings.batch_size, settings.seq_len,
                               settings.eval_batches, seed=seed + EVAL_SEED_OFFSET,
                               base_dir=base_dir)
        rows.append(row("training", "eval_loss", eval_loss(model, spec, held, dev, settings)))
    return rows


def eval_loss(model: torch.nn.Module, spec: ModelSpec, batches: list, dev: torch.device,
              settings: TrainingSettings) -> float:
    """Mean loss in eval mode over ``batches``, without gradients."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(dev)
            with autocast(settings.dtype, dev):
                total += float(spec.loss(model(**batch.inputs), batch))
    return total / len(batches)
