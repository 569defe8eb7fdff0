"""``recall_accuracy``: on held-out associative-recall batches (``data: {source: synthetic,
task: recall}``), the fraction of queried values the model predicts exactly (argmax of the
logits at each queried key equals its value; Zoology's MQAR accuracy, Arora et al. 2023)."""

from __future__ import annotations

import torch

from ..model.tasks import Batch


def recall_accuracy(model: torch.nn.Module, batches: list[Batch], dev: torch.device
                    ) -> float | None:
    """Exact-match accuracy over the positions ``extra["recall_mask"]`` marks, in eval mode
    without gradients; None when no batch carries a mask (not the recall task)."""
    hits = total = 0
    model.eval()
    with torch.no_grad():
        for batch in batches:
            if batch.extra.get("recall_mask") is None:
                continue
            got = recall_hits(model(**batch.to(dev).inputs), batch)
            if got is not None:
                hits, total = hits + got[0], total + got[1]
    return hits / total if total else None


def recall_hits(logits: torch.Tensor, batch: Batch) -> tuple[int, int] | None:
    """(right answers, queried positions) of (B, T, V) ``logits`` on ``batch``; None when
    the batch carries no recall mask."""
    mask = batch.extra.get("recall_mask")
    if mask is None:
        return None
    mask = mask.to(logits.device)  # (B, T)
    right = logits.argmax(-1) == batch.target.to(logits.device)  # (B, T)
    return int(right[mask].sum()), int(mask.sum())


__all__ = ["recall_accuracy", "recall_hits"]
