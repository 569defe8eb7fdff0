"""What the report shows of the dynamics probe: one layer x step heatmap per quantity and
variant (mean over seeds), and per quantity lines of its mean over layers against step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...plugin.probe import ProbeView
from ...probes.metricnames import DYNAMICS_RECORDED as RECORDED

LABELS = {"grad_norm": "gradient norm", "update_ratio": "update / weight (||ΔW||/||W||)",
          "residual_rms": "residual-stream RMS", "max_attn_logit": "max attention logit",
          "attn_entropy": "attention entropy (nats)",
          "first_token_mass": "attention on the first token", "sink_mass": "attention on the sink"}


def dynamics_views() -> tuple[Any, ...]:
    """The dynamics probe's report views (matplotlib is imported only when one runs): its
    heatmaps and lines, its sentences in the reading after the training probe's, and the
    numbers they quote in the summary (:mod:`.dynamics_summary`)."""
    return (heatmaps, lines, ProbeView(metrics=metrics, reading=reading, claims=claims, rank=50))


def metrics(data: Any) -> Any:
    """The dynamics run's per-seed summary values (:mod:`.dynamics_summary`)."""
    from .dynamics_summary import dynamics_metrics

    return dynamics_metrics(data)


def reading(data: Any, summary: Any) -> list[str]:
    """The dynamics probe's sentences (:mod:`.dynamics_findings`)."""
    from .dynamics_findings import dynamics_reading

    return dynamics_reading(data)


def claims(data: Any) -> list[dict[str, Any]]:
    """The dynamics probe's comparisons as claims rows (:func:`.dynamics_findings.dynamics_rows`)."""
    from .dynamics_findings import dynamics_rows

    return dynamics_rows(data)


def _layer_rows(data: Any) -> Any:
    rows = data.rows
    return rows[(rows["probe"] == "dynamics") & (rows["scope"] == "layer")
                & rows["step"].notna() & rows["layer"].notna()]


def heatmaps(data: Any) -> Sequence[Any]:
    """One figure: a row of heatmaps (layer x step) per variant, a column per quantity;
    with condition axes the rows come condition by condition (:func:`..panels.condition_groups`)."""
    import matplotlib.pyplot as plt

    from ..plots import RC, Plot, shown

    part = _layer_rows(data)
    title = "Training dynamics per layer and step"
    caption = ("each cell: the quantity at that layer (rows) and recorded step (columns), "
               "mean over seeds; colour scales are per panel")
    if not len(part):
        return [Plot("dynamics-heatmaps", title, caption, skipped="no dynamics rows")]
    from ..panels import condition_groups, line_labels

    have = set(part["variant"])
    # with condition axes: the rows grouped by condition, each row named by its condition
    # and its other axes' values
    groups = [(c, [v for v in vs if v in have]) for c, vs in condition_groups(data)]
    names = line_labels(data)
    shown_as = {v: (f"{shown(c)}\n{shown(names.get(v, v))}" if c else shown(v))
                for c, vs in groups for v in vs}
    variants = [v for _, vs in groups for v in vs]
    metrics = [m for m in RECORDED if m in set(part["metric"])]
    if len(groups) > 1:
        caption += "; rows grouped by condition, each named by its condition first"
    with plt.rc_context(RC):
        fig, axes = plt.subplots(len(variants), len(metrics), squeeze=False,
                                 figsize=(2.6 * len(metrics), 1.9 * len(variants) + 0.6))
        for r, variant in enumerate(variants):
            for c, metric in enumerate(metrics):
                ax = axes[r][c]
                mine = part[(part["variant"] == variant) & (part["metric"] == metric)]
                if r == 0:
                    ax.set_title(LABELS[metric], fontsize=8)
                if not len(mine):  # a quantity this variant has not (sink_mass without sinks)
                    ax.axis("off")
                    ax.text(0.5, 0.5, "none", ha="center", va="center", fontsize=8,
                            transform=ax.transAxes)
                    continue
                grid = mine.pivot_table(index=["name", "layer"], columns="step", values="value",
                                        aggfunc="mean")
                im = ax.imshow(grid.to_numpy(), aspect="auto", origin="lower", cmap="viridis")
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
                steps = [int(s) for s in grid.columns]
                ticks = sorted({0, len(steps) - 1})
                ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
                ax.set_yticks(range(len(grid.index)), [f"{n}/{int(i)}" if n else str(int(i))
                                                       for n, i in grid.index])
                if c == 0:
                    ax.set_ylabel(f"{shown_as[variant]}\nlayer", fontsize=8)
                if r == len(variants) - 1:
                    ax.set_xlabel("step")
        fig.tight_layout()
    return [Plot("dynamics-heatmaps", title, caption, fig)]


def lines(data: Any) -> Sequence[Any]:
    """One panel per quantity: its mean over layers (and seeds) against step, per variant."""
    from ..panels import step_lines
    from ..plots import Plot

    part = _layer_rows(data)
    title = "Training dynamics over steps"
    caption = "mean over layers and seeds of each quantity at each recorded step"
    if not len(part):
        return [Plot("dynamics-lines", title, caption, skipped="no dynamics rows")]
    variants = [v for v in data.order if v in set(part["variant"])]
    metrics = [m for m in RECORDED if m in set(part["metric"])]
    fig, said = step_lines(data, part, variants, metrics, LABELS)
    return [Plot("dynamics-lines", title, caption + "." + said if said else caption, fig)]


__all__ = ["claims", "dynamics_views", "heatmaps", "lines", "metrics", "reading"]
