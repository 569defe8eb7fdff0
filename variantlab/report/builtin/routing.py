"""What the report shows of mixture-of-experts routing (the dynamics probe's routing rows,
:mod:`variantlab.probes.routing`): expert load per layer over steps as heatmaps, and the
balance quantities (load imbalance, router entropy, the balancing losses, dropped
assignments) against step. Variants without routed layers show nothing here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...probes.metricnames import ROUTING_METRICS as LAYER_METRICS

LABELS = {"load_imbalance": "load imbalance (max / mean)",
          "router_entropy": "router entropy (nats)",
          "dropped_fraction": "dropped assignments (share)",
          "aux_loss": "load-balancing loss", "z_loss": "router z-loss"}
#: at most this many variants get expert-load heatmaps (the first in the report's order)
MAX_VARIANTS = 6


def routing_views() -> tuple[Any, ...]:
    """The routing views, contributed by the dynamics probe."""
    return (expert_load, balance_lines)


def _rows(data: Any, metrics: Sequence[str]) -> Any:
    rows = data.rows
    return rows[(rows["probe"] == "dynamics") & (rows["scope"] == "layer")
                & rows["metric"].isin(list(metrics)) & rows["step"].notna()
                & rows["layer"].notna()]


def _expert(name: str) -> tuple[str, int]:
    """``"decoder/expert 3"`` -> ``("decoder", 3)``; ``"expert 3"`` -> ``("", 3)``."""
    stack, _, last = str(name).rpartition("/")
    return stack, int(last.split()[-1])


def expert_load(data: Any) -> Sequence[Any]:
    """Per variant (rows) and routed layer (columns): the share of assignments each expert
    (y) took at each recorded step (x), mean over seeds."""
    import matplotlib.pyplot as plt

    from ..plots import RC, Plot, shown

    part = _rows(data, ["expert_load"])
    title = "Expert load per layer over training"
    if not len(part):
        return []
    variants = [v for v in data.order if v in set(part["variant"])]
    cut = len(variants) > MAX_VARIANTS
    variants = variants[:MAX_VARIANTS]
    part = part.assign(stack=[_expert(n)[0] for n in part["name"]],
                       expert=[_expert(n)[1] for n in part["name"]])
    layers = sorted({(s, int(i)) for s, i in zip(part["stack"], part["layer"])})
    caption = ("each panel: one routed layer of one variant; each cell the share of that "
               "layer's routing assignments (token x choice) the expert (rows) took at the "
               "recorded step (columns), mean over seeds; 1/n_experts is a balanced load; "
               "one colour scale for all panels")
    if cut:
        caption += f"; the first {MAX_VARIANTS} variants only"
    vmax = float(part["value"].max())
    with plt.rc_context(RC):
        fig, axes = plt.subplots(len(variants), len(layers), squeeze=False,
                                 figsize=(2.4 * len(layers) + 0.8, 1.9 * len(variants) + 0.6))
        im = None
        for r, variant in enumerate(variants):
            for c, (stack, layer) in enumerate(layers):
                ax = axes[r][c]
                mine = part[(part["variant"] == variant) & (part["stack"] == stack)
                            & (part["layer"] == layer)]
                if not len(mine):
                    ax.set_axis_off()
                    continue
                grid = mine.pivot_table(index="expert", columns="step", values="value",
                                        aggfunc="mean")
                im = ax.imshow(grid.to_numpy(), aspect="auto", origin="lower", cmap="magma",
                               vmin=0.0, vmax=vmax)
                steps = [int(s) for s in grid.columns]
                ticks = sorted({0, len(steps) - 1})
                ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
                ax.set_yticks(range(len(grid.index)), [str(int(e)) for e in grid.index])
                if r == 0:
                    ax.set_title(f"layer {stack + '/' if stack else ''}{layer}", fontsize=8)
                if c == 0:
                    ax.set_ylabel(f"{shown(variant)}\nexpert", fontsize=8)
                if r == len(variants) - 1:
                    ax.set_xlabel("step")
        if im is not None:
            fig.colorbar(im, ax=axes, fraction=0.03, pad=0.02)
    return [Plot("moe-expert-load", title, caption, fig)]


def balance_lines(data: Any) -> Sequence[Any]:
    """One panel per balance quantity: its mean over routed layers (and seeds) per step."""
    from ..panels import step_lines
    from ..plots import Plot

    part = _rows(data, LAYER_METRICS)
    if not len(part):
        return []
    title = "Routing balance over training"
    caption = ("mean over routed layers and seeds at each recorded step; the losses are "
               "unweighted (the training objective adds them times their coefficients)")
    variants = [v for v in data.order if v in set(part["variant"])]
    metrics = [m for m in LAYER_METRICS if m in set(part["metric"])]
    fig, said = step_lines(data, part, variants, metrics, LABELS)
    return [Plot("moe-balance", title, caption + "." + said if said else caption, fig)]


__all__ = ["balance_lines", "expert_load", "routing_views"]
