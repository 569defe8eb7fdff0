"""Training dynamics: a training run (AdamW, as the training probe) that records, every
``every`` steps (step 0 and the last step included) and per layer:

- ``grad_norm``: L2 norm of the layer's parameter gradients (before clipping);
- ``update_ratio``: ||ΔW|| / ||W|| over the layer's parameters for that optimizer step
  (ΔW = W after the step - W before; both norms over all the layer's tensors together);
- ``residual_rms``: root mean square of the layer's output (the residual stream after the
  block) in that step's forward;
- ``max_attn_logit``: the largest q·k/sqrt(d) before softmax over heads and positions of the
  layer's attention modules (those exposing ``record_stats``/``last_stats``, as the built-in
  ``mha`` does for both impls);
- ``attn_entropy``: the attention distribution's entropy (nats), mean over heads and queries;
- ``first_token_mass``: the softmax weight on the first key (position 0), mean over heads and
  the queries after position 0 that may see it (a query whose window has left position 0
  behind is not counted): the attention sink of Xiao et al. 2023 ("Efficient streaming
  language models with attention sinks");
- ``sink_mass`` (attention with learned sinks, ``sinks: true``; gpt-oss): the weight the
  sink logit takes in the softmax, mean over heads and queries.

A model with routed (mixture-of-experts) layers also gets, at each recorded step and per
layer, the routing rows of :mod:`variantlab.probes.routing` (``expert_load`` per expert,
``load_imbalance``, ``router_entropy``, ``aux_loss``, ``z_loss``, ``dropped_fraction`` with a
capacity); it trains on the task's loss plus the weighted balancing losses, as the training
probe does.

It also records ``loss`` at each recorded step, and ``eval_loss`` after training when
``eval_batches`` > 0: the loss over the first ``eval_batches`` batches of the fixed
validation set the training probe scores (:mod:`variantlab.data.heldout`), capped by
``eval_tokens``. Rows have scope ``layer``, ``layer`` and
``step`` set and ``name`` the layer's stack (``""`` in a one-stack model). A killed unit
resumes from its last checkpoint (:mod:`variantlab.probes.checkpoint`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, PositiveInt
from torch import nn

from ..model.sparse import after_step
from ..model.specs import ModelSpec
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from . import checkpoint
from .common import autocast, first_tensor, layer_stacks, param_index
from .heldout import HeldOut, scores_held_out
from .metricnames import DYNAMICS_METRICS, DYNAMICS_OPTIONAL, DYNAMICS_RECORDED
from .recipe import lr_at
from .routing import layer_rows, routed_layers, snapshot
from .training import TrainRunSettings, setup


class DynamicsSettings(TrainRunSettings):
    """A training run (training's settings) recording per-layer dynamics every ``every`` steps."""

    every: PositiveInt = Field(10, description="record every k-th optimizer step (and step 0)")
    eval_batches: int | None = Field(
        0, ge=0, description="batches of the fixed validation set scored in eval mode after "
                             "training (0: none; unset: eval_tokens)")

Layer = tuple[str, int]  # (stack, layer index)
METRICS = DYNAMICS_METRICS
OPTIONAL = DYNAMICS_OPTIONAL
RECORDED = DYNAMICS_RECORDED


def layer_params(model: nn.Module) -> dict[Layer, list[nn.Parameter]]:
    """Each layer's parameters (every tensor once), by (stack, layer index)."""
    out: dict[Layer, list[nn.Parameter]] = defaultdict(list)
    for info in param_index(model):
        if info.layer is not None:
            out[(info.stack, info.layer)].append(info.param)
    return dict(sorted(out.items()))


def norm_of(tensors: list[torch.Tensor]) -> float:
    """L2 norm over several tensors together."""
    return math.sqrt(sum(float(t.detach().float().pow(2).sum()) for t in tensors))


def attention_modules(model: nn.Module) -> dict[Layer, list[nn.Module]]:
    """The attention modules with the ``record_stats`` hook point, by layer."""
    out: dict[Layer, list[nn.Module]] = {}
    for i, module, stack in layer_stacks(model):
        found = [m for m in module.modules() if hasattr(m, "record_stats")]
        out[(stack, i)] = found
    return out


def _recorder(model: nn.Module, record: dict[str, dict[Layer, float]]) -> list[Any]:
    """Forward hooks storing each layer's output RMS into ``record['residual_rms']``."""
    def hook(key: Layer):
        def fn(_m: nn.Module, _i: Any, out: Any) -> None:
            t = first_tensor(out)
            if t is not None:
                record["residual_rms"][key] = float(t.detach().float().pow(2).mean().sqrt())
        return fn
    return [m.register_forward_hook(hook((stack, i))) for i, m, stack in layer_stacks(model)]


def _attention(modules: dict[Layer, list[nn.Module]], on: bool) -> None:
    for mods in modules.values():
        for m in mods:
            setattr(m, "record_stats", on)  # noqa: B010 (attributes the attention reads)
            setattr(m, "last_stats", None)  # noqa: B010


def _attention_stats(modules: dict[Layer, list[nn.Module]], record: dict) -> None:
    for key, mods in modules.items():
        stats: list[dict[str, float]] = [
            s for s in (getattr(m, "last_stats", None) for m in mods) if s is not None]
        if stats:
            record["max_attn_logit"][key] = max(s["max_logit"] for s in stats)
            record["attn_entropy"][key] = sum(s["entropy"] for s in stats) / len(stats)
            for metric in ("first_token_mass", *OPTIONAL):  # mean over the modules with it
                got = [s[metric] for s in stats if metric in s]
                if got:
                    record[metric][key] = sum(got) / len(got)


def run(
    spec: ModelSpec, settings: DynamicsSettings, *, seed: int, data: Any = None,
    base_dir: Path | str = ".", device: str | None = None, registry: Registry,
) -> list[Row]:
    dev, model, opt, batches, loss_fn = setup(spec, settings, seed, data, base_dir, device,
                                              registry)
    layers, attn = layer_params(model), attention_modules(model)
    routed = routed_layers(model)
    rows: list[Row] = []
    total = len(batches)
    saver = checkpoint.current()
    start = checkpoint.resume_unit(saver, model, opt, batches, dev, {"rows": rows})
    for step in range(start, total):
        batch = batches.next().to(dev)
        watch = step % settings.every == 0 or step == total - 1
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings, total)
        opt.zero_grad(set_to_none=True)
        record: dict[str, dict[Layer, float]] = {m: {} for m in RECORDED}
        hooks = _recorder(model, record) if watch else []
        _attention(attn, watch)
        try:
            with autocast(settings.dtype, dev):
                loss = loss_fn(model(**batch.inputs), batch)
                objective = loss_fn.total(loss, model)
        finally:
            for h in hooks:
                h.remove()
        value = float(loss.detach())
        if not math.isfinite(value):
            rows.append(row("dynamics", "loss", value, step=step))
            break
        routing = snapshot(routed) if watch and routed else {}
        objective.backward()
        before = {}
        if watch:
            _attention_stats(attn, record)
            for key, ps in layers.items():
                record["grad_norm"][key] = norm_of([p.grad for p in ps if p.grad is not None])
            before = {key: [p.detach().clone() for p in ps] for key, ps in layers.items()}
        if settings.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        after_step(model)
        if watch:
            for key, ps in layers.items():
                delta = [p.detach() - b for p, b in zip(ps, before[key])]
                w = norm_of(before[key])
                record["update_ratio"][key] = norm_of(delta) / w if w > 0 else math.nan
            rows.append(row("dynamics", "loss", value, step=step))
            rows += _rows(record, step)
            rows += layer_rows("dynamics", routing, step)
        if saver is not None and step + 1 < total and saver.due(step + 1):
            checkpoint.save_unit(saver, step + 1, model, opt, batches, dev, {"rows": rows})
    _attention(attn, False)
    diverged = any(r["metric"] == "loss" and not math.isfinite(r["value"]) for r in rows)
    if scores_held_out(settings) and not diverged:
        held = HeldOut(data, spec, settings, base_dir, registry)
        rows.append(row("dynamics", "eval_loss", held.score("val", model, loss_fn, dev).loss))
    return rows


def _rows(record: dict[str, dict[Layer, float]], step: int) -> list[Row]:
    return [row("dynamics", metric, v, scope="layer", name=stack, layer=i, step=step)
            for metric in RECORDED for (stack, i), v in sorted(record[metric].items())]


__all__ = ["METRICS", "OPTIONAL", "RECORDED", "attention_modules", "layer_params", "norm_of", "run"]
