"""Parameter counts: total, trainable, non-embedding, per slot, per layer; and the recurrent
state a causal decoder keeps per sequence (``state_bytes``: KV cache for attention, a fixed
state for sequence mixers; docs/mixers.md).

Each tensor is counted once (a head tied to the token embedding is the same tensor).
Per-layer rows of a model of several stacks are named by their stack (``encoder/``,
``decoder/``). Non-embedding excludes the token and position embeddings (slots ``embedding`` and
``positional``), as Kaplan et al. 2020 and nanoGPT count N.

A model with routed (mixture-of-experts) layers also gets ``active`` and
``active_non_embedding``: the parameters one token uses, i.e. the total less the routed
experts it is not sent to (``(n_experts - top_k)`` experts per layer; shared experts and the
router count as active; :func:`variantlab.model.sparse.inactive_params`). Dense models get
no such rows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch import nn

from ..model.build import make_model
from ..model.sparse import inactive_params, routed_modules
from ..model.specs import ModelSpec
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from ..plugin.settings import Strict
from .common import EMBEDDING_SLOTS, layer_stacks, param_index, stacked


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
    if any(True for _ in routed_modules(model)):
        idle = inactive_params(model)
        rows += [row("params", "active", total - idle, unit="count"),
                 row("params", "active_non_embedding", non_emb - idle, unit="count")]
    rows += [row("params", "params", n, scope="slot", name=s, unit="count")
             for s, n in sorted(by_slot.items())]
    rows += [row("params", "params", n, scope="layer", name=stacked(stack, ""), layer=i,
                 unit="count")
             for (i, stack), n in sorted(by_layer.items())]
    return rows + state_rows(model)


def state_rows(model: nn.Module) -> list[Row]:
    """What a causal decoder keeps per sequence at the model's context length, in bytes of
    the parameters' dtype: ``state_bytes`` (all layers, and per layer) and
    ``state_bytes_per_token`` (its growth at the last position: the KV cache per token for
    attention, 0 for a fixed-state mixer or a full sliding window). Read from each causal
    attention-slot module's ``state_size(t)`` (numbers kept after t tokens); none when the
    model has no such module (encoders, cross-attention only, plugins without it)."""
    spec = getattr(model, "variantlab_spec", None)
    ctx = getattr(spec, "context_length", None)
    param = next(model.parameters(), None)
    if ctx is None or param is None:
        return []
    size = param.element_size()
    per_layer: dict[tuple[int, str], int] = defaultdict(int)
    growth = 0
    for i, layer, stack in layer_stacks(model):
        for m in layer.modules():
            state = getattr(m, "state_size", None)
            if getattr(m, "variantlab_slot", None) != "attention" or not callable(state) or \
                    getattr(m, "causal", False) is not True:
                continue
            per_layer[(i, stack)] += state(ctx) * size
            growth += (state(ctx) - state(ctx - 1)) * size
    if not per_layer:
        return []
    rows = [row("params", "state_bytes", sum(per_layer.values()), unit="bytes"),
            row("params", "state_bytes_per_token", growth, unit="bytes")]
    return rows + [row("params", "state_bytes", n, scope="layer", name=stacked(stack, ""),
                       layer=i, unit="bytes") for (i, stack), n in sorted(per_layer.items())]


def non_embedding_params(model: nn.Module) -> int:
    return sum(p.param.numel() for p in param_index(model) if p.slot not in EMBEDDING_SLOTS)


def active_non_embedding_params(model: nn.Module) -> int:
    """Non-embedding parameters one token uses: all of them in a dense model; less the
    experts a token is not routed to in a mixture of experts."""
    return non_embedding_params(model) - inactive_params(model)


def run(
    spec: ModelSpec, settings: ParamsSettings, *, seed: int, registry: Registry,
    **_: Any,
) -> list[Row]:
    """Count the parameters of the model ``spec`` builds (no data, no device)."""
    return count_rows(make_model(spec, seed, registry))


__all__ = ["active_non_embedding_params", "count_rows", "non_embedding_params", "run"]
