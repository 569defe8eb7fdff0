"""A training run's starting point: what its held-out numbers are judged against.

A run that ends where it started learned nothing, however its numbers rank against other
runs'. Each training unit records where it started and how noisy its numbers are, so the
report can say which variants learned nothing (:mod:`variantlab.report.learned`):

- ``init_loss``: the loss of the first step, before any update (the untrained model);
- ``loss_noise``: one step's loss noise around the curve
  (:func:`variantlab.probes.training.step_noise`);
- ``chance_loss``: on random tokens (``data: {source: synthetic}``, the default), the loss
  of the best prediction there is, a uniform guess: ln(vocab_size) nats per token;
- ``chance_recall_accuracy``: on the recall task, the accuracy of a uniform guess among the
  values a pair can hold (the upper half of the vocabulary): 1 / (vocab_size - vocab_size // 2);
- ``recall_noise``: the binomial standard deviation of a recall accuracy at that chance over
  the queried positions the test batches score, sqrt(p (1 - p) / n).

Corpora have no chance level; their runs are judged against ``init_loss``.
"""

from __future__ import annotations

import math
from typing import Any

from ..data.sources import SyntheticData
from ..model.specs import ModelSpec
from ..model.tasks import Batch
from ..plugin.rows import Row, row


def chance_levels(spec: ModelSpec, data: Any) -> dict[str, float]:
    """``chance_loss`` (random tokens) or ``chance_recall_accuracy`` (the recall task) of
    ``spec``'s task on ``data`` (None: random tokens); empty for a corpus."""
    data = SyntheticData() if data is None else data
    if not isinstance(data, SyntheticData):
        return {}
    vocab = spec.vocab_size
    if data.task == "recall":
        return {"chance_recall_accuracy": 1.0 / (vocab - vocab // 2)}
    return {"chance_loss": math.log(vocab)}


def queried(batches: list[Batch]) -> int:
    """Positions the recall accuracy scores over ``batches`` (0: not the recall task)."""
    total = 0
    for batch in batches:
        mask = batch.extra.get("recall_mask")
        total += 0 if mask is None else int(mask.sum())
    return total


def start_rows(probe: str, spec: ModelSpec, data: Any, losses: list[float], noise: float,
               test: list[Batch] | None = None) -> list[Row]:
    """``probe``'s rows of the run's starting point (module docstring): its first loss,
    ``noise`` (one step's), the task's chance levels, and over the ``test`` batches the
    noise of a chance-level recall accuracy."""
    rows: list[Row] = []
    if losses:
        rows += [row(probe, "init_loss", losses[0]), row(probe, "loss_noise", noise)]
    chance = chance_levels(spec, data)
    for metric, value in chance.items():
        rows.append(row(probe, metric, value,
                        unit="fraction" if metric.endswith("accuracy") else ""))
    n = queried(test or [])
    p = chance.get("chance_recall_accuracy")
    if p is not None and n:
        rows.append(row(probe, "recall_noise", math.sqrt(p * (1 - p) / n), unit="fraction"))
    return rows


__all__ = ["chance_levels", "queried", "start_rows"]
