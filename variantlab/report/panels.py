"""Small multiples: a plot that would mix conditions draws one panel per condition on
shared axes, with one legend for the compared variants; a line drawn over an equal one is
dashed, marked and named in the caption (issue 40.2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..config.roles import CONDITION
from .frame import ReportData
from .headline import conditions_of
from .plots import LINESTYLES, MARKERS, RC, legend, new_axes, shown, styles, subplots

PANEL_COLUMNS = 2  # small multiples: at most this many panels side by side (readable at 800 px)


def small_multiples(n: int, height: float = 2.7, width: float = 3.6) -> tuple[Figure, list]:
    """A figure of ``n`` panels on shared axes, :data:`PANEL_COLUMNS` to a row (one panel:
    the usual single axes); the grid's unused cells are removed."""
    if n <= 1:
        return new_axes()
    cols = min(n, PANEL_COLUMNS)
    rows = math.ceil(n / cols)
    fig, axes = new_axes(rows, cols, height=height * rows + 0.4, width=width * cols + 0.6,
                         share=True)
    for ax in axes[n:]:
        fig.delaxes(ax)
    for ax in axes[:n]:
        ax.tick_params(labelbottom=True, labelleft=True)
    return fig, axes[:n]


def condition_groups(data: ReportData) -> list[tuple[str, list[str]]]:
    """``(condition, its variants)`` in the order of ``data.order``, one per condition of a
    run with condition axes (:func:`conditions_of`); ``[("", data.order)]`` without."""
    conditions = conditions_of(data)
    if not conditions:
        return [("", list(data.order))]
    groups: dict[str, list[str]] = {}
    for variant in data.order:
        groups.setdefault(conditions.get(variant, ""), []).append(variant)
    return list(groups.items())


def line_labels(data: ReportData) -> dict[str, str]:
    """Variant -> the name its line carries in the legend: with condition axes, the values
    of its other axes (the panel's title says the condition, so one legend serves every
    panel); without, the variant's name."""
    conditions = conditions_of(data)
    rest = conditions_of(data, keep=lambda axis, role: role != CONDITION) if conditions else {}
    return {v: rest.get(v) or v for v in data.order}


def variant_styles(data: ReportData) -> tuple[dict[str, str], dict[str, dict]]:
    """Each variant's legend label (:func:`line_labels`) and line style: variants that share
    a label (one compared variant in several conditions) share a style."""
    labels = line_labels(data)
    order = list(dict.fromkeys(labels[v] for v in data.order))
    look = dict(zip(order, styles(len(order))))
    return labels, {v: look[labels[v]] for v in data.order}


def panels_legend(fig: Figure, axes: Sequence[Any]) -> None:
    """One figure legend for the lines of every panel, each label once (:func:`legend`)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return
    n = len(handles)
    fig.legend(list(handles.values()), [shown(label) for label in handles], loc="center left",
               bbox_to_anchor=(1.0, 0.5), ncol=max(1, math.ceil(n / 14)),
               fontsize=8 if n <= 10 else 7, frameon=False, title="variant")


def curve_panels(data: ReportData, part: pd.DataFrame, x: str, title: str, xlabel: str,
                 ylabel: str, band: bool = True) -> tuple[Figure, str]:
    """Per-variant curves of ``part`` (``value`` against column ``x``; mean over seeds, and
    with ``band`` the min-max over seeds shaded where a variant has several), one panel per
    condition on shared axes (:func:`condition_groups`) with one legend (:func:`line_labels`);
    a line drawn over an equal one is dashed and marked (:func:`mark_coinciding`). Returns
    the figure and the caption's sentences on panels and coinciding lines."""
    groups = condition_groups(data)
    names, style = variant_styles(data)
    stats = part.groupby(["variant", x], sort=False)["value"].agg(["mean", "min", "max",
                                                                  "count"]).reset_index()
    fig, axes = small_multiples(len(groups))
    for ax, (condition, variants) in zip(axes, groups):
        for variant in variants:
            line = stats[stats["variant"] == variant].sort_values(x)
            if not len(line):
                continue
            look = dict(style[variant], marker=None)
            ax.plot(line[x].astype(float), line["mean"], label=names[variant], **look)
            if band and (line["count"] > 1).any():
                ax.fill_between(line[x].astype(float), line["min"], line["max"],
                                color=look["color"], alpha=0.12, linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if condition:
            ax.set_title(condition, fontsize=9)
    said = mark_coinciding(axes)
    if len(groups) > 1:
        fig.suptitle(title)
        panels_legend(fig, axes)
        said = " One panel per condition, on shared axes." + said
    else:
        axes[0].set_title(title)
        legend(fig, axes[0], len(set(names.values())))
    if band:
        said = " Shaded: min-max over seeds." + said
    return fig, said


def coinciding(lines: Sequence[Any]) -> list[list[Any]]:
    """Groups of lines (matplotlib Line2D) that lie on one another: the same x, and y within
    0.1% of the panel's y range at every point; each group in drawing order."""
    groups: list[list[Any]] = []
    ys = [np.asarray(line.get_ydata(), dtype=float) for line in lines]
    finite = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
    tol = 1e-3 * (float(finite.max() - finite.min()) if finite.size else 0.0) or 1e-12
    for line, y in zip(lines, ys):
        x = np.asarray(line.get_xdata(), dtype=float)
        for group in groups:
            first = group[0]
            gx = np.asarray(first.get_xdata(), dtype=float)
            gy = np.asarray(first.get_ydata(), dtype=float)
            if len(gx) == len(x) and np.array_equal(gx, x) and np.allclose(
                    gy, y, rtol=0.0, atol=tol, equal_nan=True):
                group.append(line)
                break
        else:
            groups.append([line])
    return [g for g in groups if len(g) > 1]


def mark_coinciding(axes: Sequence[Any], labels: dict[Any, str] | None = None) -> str:
    """Dashes and markers, offset along the line, on every line drawn over an earlier one
    (:func:`coinciding`), so that the one beneath shows through; a caption sentence naming
    each group ("" when no line hides another). ``labels``: a line's name when its legend
    label is not (a second stack's line). A line with gid ``guide`` (a fit, a reference
    level) is left alone."""
    said: list[str] = []
    for ax in axes:
        lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 0
                 and line.get_linestyle() not in ("None", "") and line.get_gid() != "guide"]
        for group in coinciding(lines):
            for k, line in enumerate(group[1:], start=1):
                line.set_linestyle(LINESTYLES[k % len(LINESTYLES)] if k % len(LINESTYLES)
                                   else (0, (1, 1)))
                line.set_marker(MARKERS[k % len(MARKERS)])
                line.set_markevery((k - 1, len(group)) if len(line.get_xdata()) > 3 else None)
                line.set_markersize(4)
            names = [(labels or {}).get(line, line.get_label()) for line in group]
            text = " = ".join(shown(n).replace("\n", " ") for n in dict.fromkeys(names)
                              if not n.startswith("_"))
            if text.count(" = ") and text not in said:
                said.append(text)
    if not said:
        return ""
    return (" Lines that coincide are drawn dashed with markers over one another: "
            + "; ".join(said) + ".")


def step_lines(data: ReportData, part: pd.DataFrame, variants: list[str], metrics: list[str],
               labels: dict[str, str]) -> tuple[Figure, str]:
    """One panel per metric and condition (a row of metrics per condition, shared axes
    within a metric's column): each variant's mean over rows (layers, seeds) at each step,
    one legend; returns the figure and the caption's sentences on conditions and
    coinciding lines (:func:`mark_coinciding`)."""
    keep = set(variants)
    groups = [(c, [v for v in vs if v in keep]) for c, vs in condition_groups(data)]
    groups = [g for g in groups if g[1]]
    names, look = variant_styles(data)
    many = len(groups) > 1
    fig, axes = subplots(len(groups), len(metrics),
                         (2.8 * len(metrics) + 1.8, 2.6 * len(groups) + 0.4))
    with matplotlib.rc_context(RC):
        for r, (condition, mine) in enumerate(groups):
            for c, metric in enumerate(metrics):
                ax = axes[r][c]
                if r:
                    ax.sharex(axes[0][c])
                    ax.sharey(axes[0][c])
                for variant in mine:
                    rows = part[(part["variant"] == variant) & (part["metric"] == metric)]
                    curve = rows.groupby("step")["value"].mean()
                    ax.plot(curve.index, curve.to_numpy(), label=names.get(variant, variant),
                            **look.get(variant, {}))
                ax.set_title(labels[metric] + (f" — {condition}" if condition else ""),
                             fontsize=8)
                ax.set_xlabel("step")
    flat = list(axes.flat)
    said = mark_coinciding(flat)
    panels_legend(fig, flat)
    if many:
        said = " One row of panels per condition, on shared axes." + said
    return fig, said
