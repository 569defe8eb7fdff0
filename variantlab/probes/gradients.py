"""Gradients at initialisation, per parameter and per layer, and the residual-stream RMS.

The family's loss (its task's ``loss``: next-token cross-entropy for token models, MSE to zero
for float families) is back-propagated on ``batches`` batches; each batch's loss is divided
by the number of batches, so the accumulated ``.grad`` is the mean gradient, and every
statistic is taken of that mean (Xiong et al. 2020 average gradients over batches before
taking norms). Statistics per parameter and per (layer, slot):

- ``mean_abs_grad``: mean of |g| (seed 004's ``print_gradients`` measure),
- ``grad_norm``: L2 norm sqrt(sum g^2),
- ``max_abs_grad``: max |g|.

Layer rows are named by slot, plus ``all`` (every parameter of the layer) and ``weights``
(its weight matrices only, the seeds' measure). In a model of several stacks (encoder-
decoder) a layer row's name starts with its stack: ``encoder/feedforward``, ``decoder/all``,
and ``encoder/`` for ``residual_rms``; layer indices run on from one stack to the next.

``residual_rms`` is sqrt(mean(h^2)) of each layer's output h, averaged over the batches.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, PositiveInt

from ..data import sources as datalib
from ..model.build import make_model
from ..model.specs import ModelSpec
from ..model.tasks import task_for
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from ..plugin.settings import Strict
from .common import (
    describe,
    first_tensor,
    forward_hooks,
    layer_stacks,
    param_index,
    resolve_device,
    stacked,
)


class GradientsSettings(Strict):
    """Gradients of the family's loss on real batches, averaged over ``batches``."""

    batch_size: PositiveInt = Field(8, description="rows per batch")
    seq_len: PositiveInt = Field(128, description="positions per row")
    batches: PositiveInt = Field(4, description="batches whose mean gradient is measured")
    mode: Literal["train", "eval"] = Field("train", description="train: dropout active")

METRICS = ("mean_abs_grad", "grad_norm", "max_abs_grad")
#: Layer rows beside the per-slot ones: every parameter of the layer, and its weight
#: matrices only (the seeds print mean |grad| of weights, biases and norm gains left out).
AGGREGATES = ("all", "weights")


def grad_stats(grads: list[torch.Tensor]) -> dict[str, float]:
    """The three statistics over the elements of one or more gradient tensors."""
    n = sum(g.numel() for g in grads)
    abs_sum = sum(float(g.abs().sum()) for g in grads)
    sq_sum = sum(float(g.double().pow(2).sum()) for g in grads)
    mx = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
    return {"mean_abs_grad": abs_sum / max(n, 1), "grad_norm": math.sqrt(sq_sum),
            "max_abs_grad": mx}


def run(
    spec: ModelSpec, settings: GradientsSettings, *, seed: int, data: Any = None,
    base_dir: Path | str = ".", device: str | None = None, registry: Registry,
) -> list[Row]:
    dev = resolve_device(device or "cpu")
    model = make_model(spec, seed, registry, dev)
    model.train(settings.mode == "train")
    batches = datalib.batches(
        data, spec, settings.batch_size, settings.seq_len, settings.batches,
        seed=seed, registry=registry, base_dir=base_dir,
    )
    task = task_for(spec, registry)
    stacks = layer_stacks(model)
    layers = [(i, m) for i, m, _ in stacks]
    rms_sum: dict[int, float] = defaultdict(float)

    def record_rms(layer: int, out: Any) -> None:
        h = first_tensor(out)
        if h is not None:
            rms_sum[layer] += float(h.detach().float().pow(2).mean().sqrt())

    model.zero_grad(set_to_none=True)
    losses = []
    with forward_hooks(layers, record_rms):
        for i, batch in enumerate(batches):
            batch = batch.to(dev)
            loss = task.loss(spec, model(**batch.inputs), batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"gradients: the loss is {float(loss.detach())} on batch {i + 1} of {len(batches)} at "
                    f"initialisation (seed {seed}); the variant ({describe(spec)}) gives "
                    "non-finite outputs, so no gradient would mean anything; look for a "
                    "missing norm, an unstable component or too large sizes"
                )
            losses.append(float(loss.detach()))
            (loss / len(batches)).backward()

    rows = [row("gradients", "loss", sum(losses) / len(losses))]
    per_layer: dict[int, dict[str, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
    stack_of: dict[int, str] = {i: st for i, _, st in stacks}
    for info in param_index(model):
        if not info.param.requires_grad:
            continue
        g = info.param.grad
        g = torch.zeros_like(info.param) if g is None else g.detach()
        if not torch.isfinite(g).all():
            raise FloatingPointError(
                f"gradients: non-finite gradient in {info.name} (seed {seed}) of the variant "
                f"({describe(spec)}); the loss was finite, so a component's backward overflows"
            )
        for metric, value in grad_stats([g]).items():
            rows.append(row("gradients", metric, value, scope="parameter", name=info.name,
                            layer=info.layer))
        if info.layer is not None:
            stack_of.setdefault(info.layer, info.stack)
            per_layer[info.layer][info.slot].append(g)
            per_layer[info.layer]["all"].append(g)
            if info.param.ndim >= 2 and info.name.endswith("weight"):
                per_layer[info.layer]["weights"].append(g)
    for layer in sorted(per_layer):
        for slot in sorted(per_layer[layer], key=lambda s: (s in AGGREGATES, s)):
            for metric, value in grad_stats(per_layer[layer][slot]).items():
                rows.append(row("gradients", metric, value, scope="layer",
                                name=stacked(stack_of[layer], slot), layer=layer))
    for layer, _, stack in stacks:
        rows.append(row("gradients", "residual_rms", rms_sum[layer] / len(batches),
                        scope="layer", name=stacked(stack, ""), layer=layer))
    model.zero_grad(set_to_none=True)
    return rows
