"""Held-out scoring of a training run: the fixed validation and test sets, the scores over
them (after training, and every ``eval_every`` steps during it), and whether the run had
converged.

- ``val_loss`` / ``test_loss``: the loss in eval mode over the whole fixed set of the split
  (:mod:`variantlab.data.heldout`: the same windows for every seed and variant), each batch
  weighted by the targets it scores; ``val_tokens`` / ``test_tokens``: those targets;
  ``val_recall_accuracy`` / ``test_recall_accuracy`` (recall data): exact-match accuracy on
  the queried values of the same sets (``recall_accuracy``: the test one, its older name);
- ``test_loss_at_N``, ``test_tokens_at_N`` (and ``test_recall_accuracy_at_N``): the test set
  of windows of N tokens, by the same rule (:func:`length_rows`; the training probe's
  ``eval_lengths``);
- with ``eval_every: N``: ``val_loss_curve`` (and ``val_recall_accuracy_curve``) at steps
  N, 2N, ... and at the last step, ``step`` = optimizer steps done; test is scored once,
  after training, so that nothing chosen along the way has seen it. A curve point scores
  a subset of the validation set (:func:`variantlab.data.heldout.spread`: at most
  ``CURVE_TOKENS`` = 8,192 targets spread evenly over it; the whole set when it is that
  small, as synthetic sets are by default), ``val_curve_tokens`` says how many; the point
  at the last step is the final ``val_loss`` over the whole set;
- ``steps_to_solve`` (recall data): the first of those evaluations (the final one counts)
  whose validation recall accuracy reaches ``SOLVED``; absent when none does;
- ``still_improving``: :func:`still_improving` of the training loss curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.heldout import held_out_set, scored, spread
from ..data.sources import SyntheticData
from ..data.splits import Split
from ..model.specs import ModelSpec
from ..model.tasks import Batch
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from .common import autocast
from .noise import step_noise
from .recall import recall_hits

#: On CPU a scoring batch's forward runs in pieces of at most this many positions
#: (:func:`piece_rows`): the activations of 4,096 positions stay in cache, those of a whole
#: scoring batch (up to 2 ** 22 logits) do not
FORWARD_TOKENS = 4096
#: Recall accuracy at which the task counts as solved (``steps_to_solve``).
SOLVED = 0.99
#: ``still_improving``: the fall over the last fifth must exceed this many standard errors.
IMPROVING_SIGMAS = 2.0
#: ... measured over at least this many steps (a shorter curve is never "still improving").
MIN_TAIL = 8


@dataclass(frozen=True)
class Scores:
    """A model's scores over one held-out set."""

    loss: float  # mean over every scored target
    tokens: int  # targets scored
    recall: float | None  # recall accuracy; None when the set has no recall mask


def couples_rows(model: torch.nn.Module) -> bool:
    """Whether a row's output can depend on the other rows of its batch in eval mode: a
    routed (mixture-of-experts) module, whose experts take the tokens of the whole batch
    (and drop some past a capacity), or any module that says so with ``couples_rows =
    True`` (the attribute a plugin sets for a component that mixes rows)."""
    return any(getattr(m, "couples_rows", False) is True
               or callable(getattr(m, "routing_stats", None)) for m in model.modules())


def piece_rows(model: torch.nn.Module, batch: Batch, dev: torch.device,
               coupled: bool) -> int | None:
    """Rows per forward when a scoring batch is run in pieces (:func:`forward`), or None for
    one forward of the whole batch: on CPU, ``FORWARD_TOKENS`` // positions per row (at
    least one row); never for a model that couples rows, a compiled model (its fused code
    keeps little in memory, and a new shape would compile again) or an input that is not a
    (rows, ...) tensor."""
    if dev.type != "cpu" or coupled or hasattr(model, "_orig_mod"):
        return None
    rows = batch.target.shape[0]
    inputs = list(batch.inputs.values())
    if not inputs or any(not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != rows
                         for v in inputs):
        return None
    positions = max(v.shape[1] if v.dim() > 1 else 1 for v in inputs)
    per = max(1, FORWARD_TOKENS // max(1, positions))
    return per if per < rows else None


def forward(model: torch.nn.Module, batch: Batch, rows: int | None) -> Any:
    """The model's output for ``batch``: one forward, or (``rows`` set) one forward per
    ``rows`` rows with the outputs concatenated. A row's output is the same either way (the
    model does not couple rows, :func:`couples_rows`; tested bit for bit on the committed
    experiments' models); the pieces keep each forward's activations in the CPU's cache,
    where a scoring batch took 0.40 to 0.84 of its time in one forward
    (benchmarks/scoring_pieces.py)."""
    if rows is None:
        return model(**batch.inputs)
    outs = []
    for start in range(0, batch.target.shape[0], rows):
        piece = {k: v[start:start + rows] for k, v in batch.inputs.items()}
        out = model(**piece)
        n = next(iter(piece.values())).shape[0]
        if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != n:
            return model(**batch.inputs)  # not one output row per input row: the whole batch
        outs.append(out)
    return torch.cat(outs)


def evaluate(model: torch.nn.Module, loss_fn: Any, batches: list[Batch], dev: torch.device,
             dtype: str = "float32") -> Scores:
    """``model``'s scores over ``batches`` in eval mode, without gradients: the loss of each
    batch weighted by its scored targets (:func:`variantlab.data.heldout.scored`), and the
    recall accuracy over every marked position. Each batch's loss is taken over the whole
    batch's output, which on CPU is computed in pieces (:func:`forward`). The model is left
    in eval mode."""
    model.eval()
    coupled = couples_rows(model)
    total, tokens, hits, asked = 0.0, 0, 0, 0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(dev)
            with autocast(dtype, dev):
                out = forward(model, batch, piece_rows(model, batch, dev, coupled))
                loss = loss_fn(out, batch)
            n = scored(batch)
            if n:
                total += float(loss) * n
                tokens += n
            got = recall_hits(out, batch)
            if got is not None:
                hits, asked = hits + got[0], asked + got[1]
    return Scores(total / tokens if tokens else math.nan, tokens,
                  hits / asked if asked else None)


class HeldOut:
    """The fixed validation and test sets of a run and its scores. Each set is made once, on
    first use, and moved to the device once (:meth:`ready`); a unit scores from those."""

    def __init__(self, data: Any, spec: ModelSpec, settings: Any, base_dir: Path | str,
                 registry: Registry) -> None:
        self.data, self.spec, self.settings = data, spec, settings
        self.base_dir, self.registry = base_dir, registry
        self.sets: dict[str, list[Batch]] = {}  # "test", or "test@N" at length N
        self.placed: dict[tuple[str, int | None, bool, str], list[Batch]] = {}

    def batches(self, split: Split, length: int | None = None) -> list[Batch]:
        """The split's fixed set of windows of ``length`` tokens (unset: ``seq_len``; on
        synthetic data rows of that length, in place of ``data.seq_len``)."""
        s = self.settings
        length = length or s.seq_len
        key = split if length == s.seq_len else f"{split}@{length}"
        if key not in self.sets:
            cap = s.eval_tokens
            if s.eval_batches:  # the older cap, in batches of batch_size windows
                by_batches = s.eval_batches * s.batch_size * length
                cap = by_batches if cap is None else min(cap, by_batches)
            data = self.data
            if length != s.seq_len and isinstance(data, SyntheticData) and data.seq_len:
                data = data.model_copy(update={"seq_len": length})
            self.sets[key] = held_out_set(data, self.spec, s.batch_size, length, split,
                                          max_tokens=cap, registry=self.registry,
                                          base_dir=self.base_dir)
        return self.sets[key]

    def ready(self, split: Split, dev: torch.device, length: int | None = None,
              curve: bool = False) -> list[Batch]:
        """The split's set on ``dev`` (``curve``: the curve's subset of it), made and moved
        on the first call only."""
        key = (split, length, curve, str(dev))
        if key not in self.placed:
            parts = self.batches(split, length)
            self.placed[key] = [b.to(dev) for b in (spread(parts) if curve else parts)]
        return self.placed[key]

    def score(self, split: Split, model: torch.nn.Module, loss_fn: Any,
              dev: torch.device, length: int | None = None, curve: bool = False) -> Scores:
        """``model``'s scores over the split's set (``curve``: the curve's subset)."""
        return evaluate(model, loss_fn, self.ready(split, dev, length, curve), dev,
                        self.settings.dtype)


def scores_held_out(settings: Any) -> bool:
    """Whether a run's settings ask for held-out scores (``eval_batches: 0`` turns them
    off; ``eval_tokens`` unset or positive keeps them)."""
    return getattr(settings, "eval_batches", None) != 0


class Curve:
    """Validation scores during training: ``after_step(step)`` scores the model after every
    ``every``-th optimizer step and puts it back in train mode."""

    def __init__(self, held: HeldOut, model: torch.nn.Module, loss_fn: Any,
                 dev: torch.device, every: int | None) -> None:
        self.held, self.model, self.loss_fn, self.dev = held, model, loss_fn, dev
        self.every = every
        # (steps done, loss, tokens, recall) per evaluation: plain values, so that a
        # checkpoint holds them (a resumed run keeps the points scored before it)
        self.raw: list[tuple[int, float, int, float | None]] = []

    @property
    def points(self) -> list[tuple[int, Scores]]:
        """(steps done, validation scores) per evaluation so far."""
        return [(at, Scores(loss, tokens, recall)) for at, loss, tokens, recall in self.raw]

    def after_step(self, step: int) -> None:
        if self.every and (step + 1) % self.every == 0:
            got = self.held.score("val", self.model, self.loss_fn, self.dev, curve=True)
            self.raw.append((step + 1, got.loss, got.tokens, got.recall))
            self.model.train()


def final_rows(probe: str, val: Scores, curve: list[tuple[int, Scores]],
               steps: int) -> list[Row]:
    """The validation rows of a run: final scores, curves (``curve``, scored on the curve's
    subset, then the final validation score at ``steps``, in place of a curve point there),
    the curve's targets per point (``val_curve_tokens``) and ``steps_to_solve``; the test
    split's are :func:`test_split_rows`."""
    rows = [row(probe, "eval_loss", val.loss), row(probe, "val_loss", val.loss),
            row(probe, "val_tokens", float(val.tokens), unit="count")]
    if val.recall is not None:
        rows.append(row(probe, "val_recall_accuracy", val.recall, unit="fraction"))
    if not curve:
        points = [(steps, val)]
    else:
        points = [*(p for p in curve if p[0] != steps), (steps, val)]
        rows.append(row(probe, "val_curve_tokens", float(curve[0][1].tokens), unit="count"))
        rows += [row(probe, "val_loss_curve", s.loss, step=at) for at, s in points]
        rows += [row(probe, "val_recall_accuracy_curve", s.recall, unit="fraction", step=at)
                 for at, s in points if s.recall is not None]
    solved = solve_step([(at, s.recall) for at, s in points])
    if solved is not None:
        rows.append(row(probe, "steps_to_solve", float(solved), unit="count"))
    return rows


def test_split_rows(probe: str, test: Scores) -> list[Row]:
    """The rows of the test split scored at the run's ``seq_len``: ``test_loss``,
    ``test_tokens`` and, on recall data, ``test_recall_accuracy`` (``recall_accuracy``: its
    older name)."""
    rows = [row(probe, "test_loss", test.loss),
            row(probe, "test_tokens", float(test.tokens), unit="count")]
    if test.recall is not None:
        rows += [row(probe, "test_recall_accuracy", test.recall, unit="fraction"),
                 row(probe, "recall_accuracy", test.recall, unit="fraction")]
    return rows


def length_rows(probe: str, length: int, test: Scores) -> list[Row]:
    """The rows of the test set scored at ``length`` tokens per window: ``test_loss_at_N``,
    ``test_tokens_at_N`` and, on recall data, ``test_recall_accuracy_at_N``."""
    rows = [row(probe, f"test_loss_at_{length}", test.loss),
            row(probe, f"test_tokens_at_{length}", float(test.tokens), unit="count")]
    if test.recall is not None:
        rows.append(row(probe, f"test_recall_accuracy_at_{length}", test.recall,
                        unit="fraction"))
    return rows


def solve_step(points: list[tuple[int, float | None]]) -> int | None:
    """The first step whose recall accuracy reaches ``SOLVED``; None when none does."""
    return next((at for at, acc in points if acc is not None and acc >= SOLVED), None)


def still_improving(losses: list[float]) -> bool:
    """Whether a loss curve was still falling when it stopped.

    Over its last fifth (at least ``MIN_TAIL`` steps; a shorter or non-finite curve: no),
    the least-squares line through the losses falls by ``fall = -slope x (k - 1)``. The
    noise is that of one step's loss, ``sigma`` (:func:`variantlab.probes.noise.step_noise`
    over those steps: the spread of the step-to-step differences / sqrt 2, from their
    interquartile range); the fall's standard error is ``sigma x (k - 1) / sqrt(sum (x -
    mean x)^2)``. The curve is still improving when ``fall`` exceeds ``IMPROVING_SIGMAS``
    standard errors: a flat noisy tail passes about 2% of the time.
    """
    k = max(MIN_TAIL, len(losses) // 5)
    if len(losses) < k or not all(math.isfinite(v) for v in losses[-k:]):
        return False
    tail = losses[-k:]
    mean_x, mean_y = (k - 1) / 2, sum(tail) / k
    sxx = sum((x - mean_x) ** 2 for x in range(k))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(tail)) / sxx
    fall = -slope * (k - 1)
    error = step_noise(tail) * (k - 1) / math.sqrt(sxx)
    return fall > IMPROVING_SIGMAS * error


__all__ = ["SOLVED", "Curve", "HeldOut", "Scores", "evaluate", "final_rows", "length_rows", "test_split_rows",
           "scores_held_out", "solve_step", "still_improving"]
