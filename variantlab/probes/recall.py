"""``recall_accuracy``: on held-out associative-recall batches (``data: {source: synthetic,
task: recall}``), the fraction of queried values the model predicts exactly (argmax of the
logits at each queried key equals its value; Zoology's MQAR accuracy, Arora et al. 2023)."""

from __future__ import annotations

import torch

from ..model.tasks import Batch
from ..plugin.rows import Row, row


def recall_accuracy(model: torch.nn.Module, batches: list[Batch], dev: torch.device
                    ) -> float | None:
    """Exact-match accuracy over the positions ``extra["recall_mask"]`` marks, in eval mode
    without gradients; None when no batch carries a mask (not the recall task)."""
    hits = total = 0
    model.eval()
    with torch.no_grad():
        for batch in batches:
            mask = batch.extra.get("recall_mask")
            if mask is None:
                continue
            logits = model(**batch.to(dev).inputs)  # (B, T, V)
            mask = mask.to(logits.device)  # (B, T)
            right = logits.argmax(-1) == batch.target.to(logits.device)  # (B, T)
            hits += int(right[mask].sum())
            total += int(mask.sum())
    return hits / total if total else None


def recall_rows(probe: str, model: torch.nn.Module, batches: list[Batch],
                dev: torch.device, metric: str = "recall_accuracy") -> list[Row]:
    """A ``metric`` row (recall accuracy) for ``probe`` when the batches are recall batches."""
    value = recall_accuracy(model, batches, dev)
    return [] if value is None else [row(probe, metric, value, unit="fraction")]


__all__ = ["recall_accuracy", "recall_rows"]
