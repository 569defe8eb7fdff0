"""A short AdamW run: loss per step, final and best loss, a divergence flag.

The learning rate rises linearly over ``warmup_steps`` (step i uses lr·(i+1)/warmup_steps)
and then stays at ``lr``; gradients are clipped to a global L2 norm of ``grad_clip``. The
run stops at the first non-finite loss.

- ``final_loss``: mean training loss over the last tenth of the steps (at least one), so one
  noisy batch does not decide it; ``best_loss``: the lowest step loss;
- ``eval_loss``: after training, the mean loss in eval mode (dropout off, BatchNorm on its
  running statistics) over ``eval_batches`` fresh batches drawn with another seed;
- ``diverged``: 1 when a loss was NaN/inf or the loss really rose (:func:`diverged`): the
  final loss is above the first step's by more than the run's own step-to-step noise can
  explain (3 standard deviations of the difference, at least 5% of the first loss), or it is
  more than twice the first loss. A short run on data that cannot be learned (random
  tokens) wanders around its first loss and is not flagged;
- ``compiled``: 1 when the run was compiled (``compile: true``: the model runs under
  ``torch.compile``, :mod:`variantlab.probes.compiled`), else 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, PositiveFloat, PositiveInt

from ..data import sources as datalib
from ..model.specs import ModelSpec
from ..model.tasks import Batch, task_for
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from ..plugin.settings import Device, DType, Strict
from .common import autocast, make_model, resolve_device
from .compiled import compile_errors, compile_model


class TrainRunSettings(Strict):
    """What every training run takes (the training and dynamics probes)."""

    steps: PositiveInt = Field(200, description="optimizer steps (one fresh batch each)")
    lr: PositiveFloat = Field(3e-4, description="AdamW learning rate")
    batch_size: PositiveInt = Field(16, description="rows per batch")
    seq_len: PositiveInt = Field(128, description="positions per row")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up")
    grad_clip: PositiveFloat | None = Field(
        1.0, description="clip gradients to this global L2 norm (null: no clipping)")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay")
    eval_batches: int = Field(
        4, ge=0, description="fresh batches scored in eval mode after training (0: none)")
    dtype: DType = Field("float32", description="autocast dtype; float32: none")
    device: Device = Field("auto", description="auto, cpu, cuda, cuda:N or mps")


class TrainingSettings(TrainRunSettings):
    """A short AdamW run with linear warm-up and gradient clipping."""

    compile: bool = Field(False, description="run the model under torch.compile")

Loss = Callable[[Any, Batch], torch.Tensor]  # (model output, batch) -> scalar loss

#: Eval batches come from the data with this offset added to the unit's seed.
EVAL_SEED_OFFSET = 1_000_003
#: A rise counts when it exceeds this many standard deviations of (final - first) ...
RISE_SIGMAS = 3.0
#: ... and this fraction of the first loss; a final loss over BLOWUP_FACTOR x the first
#: counts whatever the noise.
RISE_FLOOR = 0.05
BLOWUP_FACTOR = 2.0


def tail_size(n: int) -> int:
    """Steps averaged into ``final_loss``: the last tenth, at least one."""
    return max(1, n // 10)


def step_noise(losses: list[float]) -> float:
    """Standard deviation of one step's loss around the curve, from the step-to-step
    differences (their interquartile range, so that a trend or a few jumps do not inflate
    it); 0 with fewer than two differences."""
    diffs = sorted(b - a for a, b in zip(losses, losses[1:]))
    if len(diffs) < 2:
        return 0.0
    iqr = _quantile(diffs, 0.75) - _quantile(diffs, 0.25)
    # a normal's IQR is 1.349 sigma; a difference of two steps has sqrt(2) x one's noise
    return iqr / 1.349 / math.sqrt(2)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def diverged(losses: list[float]) -> bool:
    """Whether a training curve diverged: a non-finite loss, or a real rise of the final
    loss (mean of the last tenth of the steps) over the first step's loss.

    A rise is real when it is larger than both ``RISE_SIGMAS`` standard deviations of
    (final - first), with the noise measured in this run (:func:`step_noise`; the final
    loss averages ``k`` steps, so the difference has sqrt(1 + 1/k) x one step's noise), and
    ``RISE_FLOOR`` x |first loss|; or when the final loss is over ``BLOWUP_FACTOR`` x the
    first (a blow-up whose own wild steps would otherwise hide it).
    """
    if not losses or not all(math.isfinite(v) for v in losses):
        return bool(losses)
    k = tail_size(len(losses))
    final = sum(losses[-k:]) / k
    first = losses[0]
    rise = final - first
    if first > 0 and final > BLOWUP_FACTOR * first:
        return True
    margin = max(RISE_SIGMAS * step_noise(losses) * math.sqrt(1 + 1 / k),
                 RISE_FLOOR * abs(first))
    return rise > margin


def lr_at(step: int, settings: TrainRunSettings) -> float:
    """Linear warm-up, then constant."""
    if settings.warmup_steps and step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    return settings.lr


def setup(spec: ModelSpec, settings: TrainRunSettings, seed: int, data: Any,
          base_dir: Path | str, device: str | None, registry: Registry,
          ) -> tuple[torch.device, torch.nn.Module, torch.optim.Optimizer, Any, Loss]:
    """``(device, model in train mode, AdamW, batches, loss)`` of a training run (training and
    dynamics probes alike); ``loss(output, batch)`` is the family task's."""
    dev = resolve_device(device or settings.device)
    model = make_model(spec, seed, registry, dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr,
                            weight_decay=settings.weight_decay)
    batches = datalib.batches(data, spec, settings.batch_size, settings.seq_len, settings.steps,
                              seed=seed, registry=registry, base_dir=base_dir)
    return dev, model, opt, batches, functools.partial(task_for(spec, registry).loss, spec)


def run(
    spec: ModelSpec, settings: TrainingSettings, *, seed: int, data: Any = None,
    base_dir: Path | str = ".", device: str | None = None, registry: Registry,
) -> list[Row]:
    dev, model, opt, batches, loss = setup(spec, settings, seed, data, base_dir, device, registry)
    compiled = compile_model(model, settings.compile)
    with compile_errors(settings.compile):
        losses = train(model, compiled, opt, loss, batches, dev, settings)

    rows = [row("training", "loss", v, step=i) for i, v in enumerate(losses)]
    finite = [v for v in losses if math.isfinite(v)]
    tail = losses[-tail_size(len(losses)):]
    final = sum(tail) / len(tail)
    rows += [
        row("training", "final_loss", final),
        row("training", "best_loss", min(finite) if finite else math.nan),
        row("training", "diverged", float(diverged(losses))),
        row("training", "compiled", float(settings.compile)),
    ]
    if settings.eval_batches and math.isfinite(final):
        held = datalib.batches(data, spec, settings.batch_size, settings.seq_len,
                               settings.eval_batches, seed=seed + EVAL_SEED_OFFSET,
                               registry=registry, base_dir=base_dir)
        with compile_errors(settings.compile):
            value = eval_loss(compiled, loss, held, dev, settings)
        rows.append(row("training", "eval_loss", value))
    return rows


def train(model: torch.nn.Module, compiled: torch.nn.Module, opt: torch.optim.Optimizer,
          loss_fn: Loss, batches: list, dev: torch.device,
          settings: TrainingSettings) -> list[float]:
    """The AdamW loop: the loss per step, stopping at the first non-finite one. ``compiled``
    runs the forward (``model`` itself, or it under torch.compile); ``model`` owns the
    parameters that are clipped."""
    losses: list[float] = []
    for step, batch in enumerate(batches):
        batch = batch.to(dev)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings)
        opt.zero_grad(set_to_none=True)
        with autocast(settings.dtype, dev):
            loss = loss_fn(compiled(**batch.inputs), batch)
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value):
            break
        loss.backward()
        if settings.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
    return losses


def eval_loss(model: torch.nn.Module, loss_fn: Loss, batches: list, dev: torch.device,
              settings: TrainRunSettings) -> float:
    """Mean loss in eval mode over ``batches``, without gradients."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(dev)
            with autocast(settings.dtype, dev):
                total += float(loss_fn(model(**batch.inputs), batch))
    return total / len(batches)
