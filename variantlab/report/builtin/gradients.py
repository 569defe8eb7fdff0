"""What the report shows of the ``gradients`` probe: the loss at initialisation, the first
layer's mean |grad| and the last/first-layer gradient-norm ratio per stack, the gradient
norm and residual-stream RMS by layer, and how the gradient norm grows with depth."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ...plugin.probe import ProbeView
from ..findings import listing, means
from ..frame import ReportData
from ..panels import condition_groups, mark_coinciding, panels_legend, small_multiples, variant_styles
from ..plots import Plot, log_scale, new_axes, stack_caption, stack_lines
from ..tables import (
    MetricRows,
    Table,
    depth_ratios,
    first_layer,
    fmt,
    select,
    stacks_of,
    summary_section,
)

PROBE = "gradients"
NOTE = ("loss at initialisation, the first layer's mean |grad| over its weight matrices (the "
        "seeds' measure), and the last/first-layer gradient-norm ratio, mean ± std over seeds")


def _of(stack: str) -> str:
    """A label's prefix naming the stack: ``"encoder "``, or nothing."""
    return f"{stack} " if stack else ""


def metrics(data: ReportData) -> pd.DataFrame:
    """Loss at init, then per stack the first layer's mean |grad| and the depth ratios."""
    rows, out = data.rows, MetricRows()
    out.add(select(rows, PROBE, "loss"), PROBE, "loss", "loss at init", "")
    first = first_layer(rows, "mean_abs_grad", PROBE)
    for stack in stacks_of(first):
        out.add(first[first["stack"] == stack], PROBE, "first_layer_mean_abs_grad"
                + (f".{stack}" if stack else ""), _of(stack) + "first-layer mean |grad|", "")
    ratios = depth_ratios(rows, probe=PROBE)
    for stack in stacks_of(ratios):
        mine = ratios[ratios["stack"] == stack]
        for name in sorted(set(mine["name"]), key=lambda n: (n != "all", n)):
            label = "last/first layer grad norm" + ("" if name == "all" else f" ({name})")
            metric = f"grad_norm_ratio.{stack + '.' if stack else ''}{name}"
            out.add(mine[mine["name"] == name], PROBE, metric, _of(stack) + label, "x")
    return out.frame()


def section(data: ReportData, summary: pd.DataFrame) -> Table | None:
    note = NOTE
    if any(stacks_of(data.rows)):
        note += ("; a model of several stacks (encoder, decoder) has each stack's layers "
                 "compared among themselves, named by stack")
    return summary_section(data, summary, PROBE, "Gradients", note)


def gradient_plot(data: ReportData) -> Plot:
    title = "Gradient norm by layer"
    caption = ("L2 norm of each layer's parameter gradients (mean over batches and seeds) at "
               "initialisation, log scale: a line rising to the right means gradients grow "
               "with depth.")
    rows = data.rows
    part = rows[(rows["probe"] == PROBE) & (rows["scope"] == "layer")
                & (rows["metric"] == "grad_norm") & rows["layer"].notna()]
    if not len(part):
        return Plot("gradients", title, caption, skipped="no per-layer gradient rows (the "
                    "gradients probe did not run)")
    names = [n for n in ("all", "attention", "feedforward") if n in set(part["name"])]
    names = names or sorted(set(part["name"]))[:3]
    groups = condition_groups(data)
    fig, axes = new_axes(len(groups), len(names), width=3.4 * len(names) + 1,
                         height=3.6 if len(groups) == 1 else 2.8 * len(groups) + 0.6,
                         share=len(groups) > 1)
    labels, st = variant_styles(data)
    for row, (condition, variants) in enumerate(groups):
        for col, name in enumerate(names):
            ax = axes[row * len(names) + col]
            stack_lines(ax, part[part["name"] == name], variants, st, labels)
            log_scale(ax, "y")
            ax.set_title(("all slots" if name == "all" else name)
                         + (f" — {condition}" if condition else ""), fontsize=9)
            ax.set_xlabel("layer index")
            ax.set_ylabel("gradient L2 norm (log scale)")
            ax.xaxis.get_major_locator().set_params(integer=True)
    said = mark_coinciding(axes)
    if len(groups) > 1:
        said = " One row of panels per condition, on shared axes." + said
    panels_legend(fig, axes)
    fig.suptitle(title)
    return Plot("gradients", title, caption + stack_caption(part) + said, fig)


def residual_plot(data: ReportData) -> Plot:
    """Residual-stream RMS by layer, from every probe's ``residual_rms`` layer rows."""
    title = "Residual-stream RMS by layer"
    caption = ("Root mean square of the residual stream after each layer (mean over batches "
               "and seeds): how the activations' scale grows with depth.")
    rows = data.rows
    part = rows[(rows["metric"] == "residual_rms") & rows["layer"].notna()]
    if not len(part):
        return Plot("residual", title, caption, skipped="no residual_rms rows")
    groups = condition_groups(data)
    fig, axes = small_multiples(len(groups))
    labels, st = variant_styles(data)
    for ax, (condition, variants) in zip(axes, groups):
        stack_lines(ax, part, variants, st, labels)
        ax.set_title(condition or title, fontsize=9 if condition else None)
        ax.set_xlabel("layer index")
        ax.set_ylabel("residual RMS (activation units)")
        ax.xaxis.get_major_locator().set_params(integer=True)
    said = mark_coinciding(axes)
    if len(groups) > 1:
        fig.suptitle(title)
        said = " One panel per condition, on shared axes." + said
    panels_legend(fig, axes)
    return Plot("residual", title, caption + stack_caption(part) + said, fig)


def plots(data: ReportData) -> list[Plot]:
    return [gradient_plot(data), residual_plot(data)]


def gradient_growth(data: ReportData) -> str | None:
    """How the gradient norm changes from the first to the last layer, per variant; in a
    model of several stacks, one sentence per stack (layers compared within it)."""
    ratios = depth_ratios(data.rows, probe=PROBE)
    if not len(ratios):
        return None
    out = []
    for stack in stacks_of(ratios):
        text = _growth(ratios[ratios["stack"] == stack])
        out.append(f"{stack.capitalize()}: {text[0].lower()}{text[1:]}" if stack else text)
    return " ".join(out)


def _growth(ratios: pd.DataFrame) -> str:
    names = set(ratios["name"])
    name = "feedforward" if "feedforward" in names else "all" if "all" in names else min(names)
    part = ratios[ratios["name"] == name]
    agg = part.groupby("variant", sort=False).agg(value=("value", "mean"),
                                                   first=("first_layer", "min"),
                                                   last=("last_layer", "max"))
    agg = agg.sort_values("value", ascending=False)
    what = {"all": "gradient norm", "feedforward": "FFN gradient norm"}.get(name,
                                                                          f"{name} gradient norm")
    pairs = []
    for i, (variant, rec) in enumerate(agg.iterrows()):
        value = rec["value"]
        if abs(value - 1) < 0.05:
            change = f"stays within 5% ({value:.2f}x)"
        elif value > 1:
            change = f"rises {value:.1f}x"
        else:
            change = f"falls {1 / value:.1f}x"
        if i == 0:
            change = (f"{what} {change} from layer {int(rec['first'])} "
                      f"to layer {int(rec['last'])}")
        elif value > 1 and abs(value - 1) >= 0.05:
            change = f"{value:.1f}x"
        pairs.append((variant, change))
    return listing(pairs) + "."


def first_layer_gradient(data: ReportData, summary: pd.DataFrame) -> str | None:
    """The first layer's mean |grad| against the baseline's, when it differs by 2x or more
    (per stack in a model of several)."""
    found = [m for m in dict.fromkeys(summary["metric"])
             if m == "first_layer_mean_abs_grad" or m.startswith("first_layer_mean_abs_grad.")]
    out = [t for t in (_first_layer(data, summary, m) for m in found) if t]
    return " ".join(out) or None


def _first_layer(data: ReportData, summary: pd.DataFrame, metric: str) -> str | None:
    table = means(summary, metric)
    if len(table) < 2 or data.baseline not in table.index:
        return None
    base = table.loc[data.baseline, "mean"]
    if not base > 0:
        return None
    ratio = (table["mean"] / base).drop(index=data.baseline)
    pairs = [(v, f"{fmt(table.loc[v, 'mean'])} ({r:,.0f}x)" if r >= 100 else
              f"{fmt(table.loc[v, 'mean'])} ({r:.3g}x)") for v, r in ratio.items()
             if r >= 2 or r <= 0.5]
    if not pairs:
        return None
    pairs.sort(key=lambda p: -ratio[p[0]])
    stack = metric.partition(".")[2]
    what = f"{stack.capitalize()} first-layer" if stack else "First-layer"
    return (f"{what} mean |grad|: {data.baseline} {fmt(base)}; " + listing(pairs) + ".")


def reading(data: ReportData, summary: pd.DataFrame) -> Sequence[str | None]:
    return [gradient_growth(data), first_layer_gradient(data, summary)]


def views() -> tuple[ProbeView, ...]:
    """The gradients probe's pieces: its plots and reading first among the probes', its
    section last."""
    return (ProbeView(plots=plots, reading=reading, rank=10),
            ProbeView(metrics=metrics, section=section, rank=40))
