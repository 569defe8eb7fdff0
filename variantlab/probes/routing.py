"""Rows of routed (mixture-of-experts) layers: expert load, imbalance, router entropy,
dropped assignments and the balancing losses (docs/moe.md).

Read from the modules that expose ``routing_stats()`` / ``aux_terms()``
(:mod:`variantlab.model.sparse`) after a training step's forward. Per layer:

- ``expert_load``: the share of the layer's routing assignments (token x choice) that went to
  each expert, before any is dropped (sums to 1 over experts; 1/n_experts when balanced);
  ``name`` is ``expert <e>`` (``<stack>/expert <e>`` in a model of several stacks);
- ``load_imbalance``: max over experts of the load / its mean (1 when balanced,
  n_experts when one expert takes everything);
- ``router_entropy``: the entropy (nats) of the router's softmax over all experts, mean over
  tokens (log n_experts when uniform);
- ``dropped_fraction``: the share of assignments dropped by the capacity limit (only when
  ``capacity_factor`` is set);
- ``aux_loss`` / ``z_loss``: the unweighted load-balancing loss and router z-loss.

A model without routed modules gives no rows, so dense runs keep their rows exactly.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..model.sparse import stats_of
from ..plugin.rows import Row, row
from .common import layer_stacks, stacked
from .metricnames import ROUTING_METRICS

#: the per-layer scalar metrics (``expert_load`` has one row per expert besides)
LAYER_METRICS = ROUTING_METRICS
Record = dict[tuple[str, int], dict[str, Any]]


def routed_layers(model: nn.Module) -> list[tuple[str, int, nn.Module]]:
    """``(stack, layer index, module)`` of each routed module inside a numbered layer."""
    out = []
    for i, layer, stack in layer_stacks(model):
        for m in layer.modules():
            if callable(getattr(m, "routing_stats", None)):
                out.append((stack, i, m))
    return out


def snapshot(layers: list[tuple[str, int, nn.Module]]) -> Record:
    """The last forward's statistics of each routed layer, as plain floats."""
    out: Record = {}
    for stack, i, m in layers:
        stats = stats_of(m) or {}
        if "load" not in stats:
            continue
        load = [float(v) for v in stats["load"].tolist()]
        mean = sum(load) / len(load)
        rec: dict[str, Any] = {"load": load,
                               "load_imbalance": max(load) / mean if mean > 0 else float("nan"),
                               "router_entropy": float(stats["router_entropy"])}
        if stats.get("capacity"):
            rec["dropped_fraction"] = float(stats["dropped_fraction"])
        terms = getattr(m, "aux_terms", None)
        if callable(terms):
            rec.update({k: float(v.detach()) for k, v in terms().items()})
        out[(stack, i)] = rec
    return out


def layer_rows(probe: str, record: Record, step: int | None) -> list[Row]:
    """Per-layer rows of one snapshot: ``expert_load`` per expert and the scalars."""
    rows: list[Row] = []
    for (stack, i), rec in sorted(record.items()):
        rows += [row(probe, "expert_load", v, scope="layer", name=stacked(stack, f"expert {e}"),
                     layer=i, step=step, unit="ratio") for e, v in enumerate(rec["load"])]
        rows += [row(probe, metric, rec[metric], scope="layer", name=stack, layer=i, step=step,
                     unit="ratio" if metric == "load_imbalance" else "")
                 for metric in LAYER_METRICS if metric in rec]
    return rows


def mean_over_layers(record: Record) -> dict[str, float]:
    """Each scalar metric's mean over the routed layers of one snapshot."""
    out: dict[str, float] = {}
    for metric in LAYER_METRICS:
        values = [rec[metric] for rec in record.values() if metric in rec]
        if values:
            out[metric] = sum(values) / len(values)
    return out


def training_rows(log: list[Record]) -> list[Row]:
    """The training probe's routing rows: per step, each scalar's mean over layers (model
    scope); ``final_<metric>``, its mean over the last tenth of the steps (as
    ``final_loss``); per layer, the expert loads and scalars averaged over all the steps."""
    rows: list[Row] = []
    per_step = [mean_over_layers(record) for record in log]
    for step, means in enumerate(per_step):
        rows += [row("training", metric, v, step=step,
                     unit="ratio" if metric == "load_imbalance" else "")
                 for metric, v in means.items()]
    if not log:
        return rows
    tail = per_step[-max(1, len(per_step) // 10):]
    rows += [row("training", f"final_{metric}", sum(m[metric] for m in tail) / len(tail),
                 unit="ratio" if metric == "load_imbalance" else "")
             for metric in LAYER_METRICS if metric in tail[0]]
    mean: Record = {}
    for key in log[0]:
        recs = [r[key] for r in log if key in r]
        load = [sum(r["load"][e] for r in recs) / len(recs) for e in range(len(recs[0]["load"]))]
        avg = sum(load) / len(load)
        mean[key] = {"load": load, "load_imbalance": max(load) / avg if avg > 0 else float("nan")}
        mean[key].update({m: sum(r[m] for r in recs) / len(recs)
                          for m in LAYER_METRICS if m != "load_imbalance" and m in recs[0]})
    return rows + layer_rows("training", mean, None)


__all__ = ["LAYER_METRICS", "layer_rows", "routed_layers", "snapshot", "training_rows"]
