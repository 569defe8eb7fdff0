"""Parameter counts: total, trainable, non-embedding, per slot, per layer.

Each tensor is counted once (a head tied to the token embedding is the same tensor).
Per-layer rows of a model of several stacks are named by their stack (``encoder/``,
``decoder/``). Non-embedding excludes the token and position embeddings (slots ``embedding`` and
``positional``), as Kaplan et al. 2020 and nanoGPT count N.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch import nn

from ..model.specs import ModelSpec
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from ..plugin.settings import Strict
from .common import EMBEDDING_SLOTS, make_model, param_index, stacked


class ParamsSettings(Strict):
    """Parameter counts: total, trainable, non-embedding, per slot, per layer."""


def count_rows(model: nn.Module) -> list[Row]:
    """The params probe's rows for an already built model."""
    index = param_index(model)
    total = sum(p.param.numel() for p in index)
    trainable = sum(p.param.numel() for p in index if p.param.requires_grad)
    non_emb = sum(p.param.numel() for p in index if p.slot not in EMBEDDING_SLOTS)
    by_slot: dict[str, int] = defaultdict(int)
    by_layer: dict[tuple[int, str], int] = defaultdict(int)
    for p in index:
        by_slot[p.slot] += p.param.numel()
        if p.layer is not None:
            by_layer[(p.layer, p.stack)] += p.param.numel()
    rows = [
        row("params", "total", total, unit="count"),
        row("params", "trainable", trainable, unit="count"),
        row("params", "non_embedding", non_emb, unit="count"),
    ]
    rows += [row("params", "params", n, scope="slot", name=s, unit="count")
             for s, n in sorted(by_slot.items())]
    rows += [row("params", "params", n, scope="layer", name=stacked(stack, ""), layer=i,
                 unit="count")
             for (i, stack), n in sorted(by_layer.items())]
    return rows


def non_embedding_params(model: nn.Module) -> int:
    return sum(p.param.numel() for p in param_index(model) if p.slot not in EMBEDDING_SLOTS)


def run(
    spec: ModelSpec, settings: ParamsSettings, *, seed: int, registry: Registry,
    **_: Any,
) -> list[Row]:
    """Count the parameters of the model ``spec`` builds (no data, no device)."""
    return count_rows(make_model(spec, seed, registry))


__all__ = ["count_rows", "non_embedding_params", "run"]
