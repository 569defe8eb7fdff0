"""Matplotlib figures (Agg backend) and their deterministic SVG text."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from ..config.roles import CONDITION  # noqa: E402
from ..plugin.registry import Registry  # noqa: E402
from .frame import ReportData  # noqa: E402
from .guard import Failure  # noqa: E402
from .headline import conditions_of  # noqa: E402
from .parts import pieces  # noqa: E402

RC: dict[Any, Any] = {  # matplotlib types its keys as a Literal of every rc name
   "svg.hashsalt": "variantlab", "svg.fonttype": "none", "font.size": 9,
      "axes.titlesize": 10, "figure.dpi": 100}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


@dataclass
class Plot:
    """A figure, or the reason it was skipped."""

    key: str
    title: str
    caption: str
    figure: Figure | None = None
    skipped: str = ""


def palette(name: str) -> tuple:
    """The colours of a qualitative matplotlib colormap (tab10, tab20)."""
    cmap = matplotlib.colormaps[name]
    assert isinstance(cmap, ListedColormap), name
    return tuple(cast("Sequence[Any]", cmap.colors))


def styles(n: int) -> list[dict]:
    """Distinct line styles for n variants: colour cycle, then dashes and markers beyond it."""
    colors = palette("tab10" if n <= 10 else "tab20")
    out = []
    for i in range(n):
        out.append({"color": colors[i % len(colors)],
                    "linestyle": LINESTYLES[(i // len(colors)) % len(LINESTYLES)],
                    "marker": MARKERS[i % len(MARKERS)] if n > 10 else "o"})
    return out


WRAP = 40  # a longer name is broken into lines at its commas (a grid label's pairs)


def shown(name: str) -> str:
    """A variant name as a plot shows it: control characters (no font has them) as spaces;
    a name longer than WRAP characters broken into lines after its commas."""
    text = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(name))
    if len(text) <= WRAP or "," not in text:
        return text
    lines = [""]
    for part in text.split(","):
        if lines[-1] and len(lines[-1]) + len(part) + 1 > WRAP:
            lines[-1] += ","
            lines.append(part)
        else:
            lines[-1] += ("," if lines[-1] else "") + part
    return "\n".join(lines)


def label_lines(names: Sequence[str]) -> int:
    """Lines the names take as bar labels (a long name wraps, see :func:`shown`)."""
    return sum(max(1, shown(n).count("\n") + 1) for n in names)


def legend(fig: Figure, ax, n: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    labels = [shown(label) for label in labels]
    if not handles:
        return
    ncol = max(1, math.ceil(n / 14))
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), ncol=ncol,
               fontsize=8 if n <= 10 else 7, frameon=False, title="variant")


def log_scale(ax, axis: str = "y") -> None:
    """A logarithmic ``axis`` ("x" or "y") whose tick labels are plain text ("0.01",
    "2e-05"): matplotlib's default writes them as mathtext, whose parser cost most of the
    report's drawing time (issue 26.2)."""
    which = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    which.set_major_formatter(LogFormatter())
    which.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def mean_by(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean ``value`` per group of ``by``, groups in order of appearance."""
    return frame.groupby(by, sort=False)["value"].mean().reset_index()


def subplots(rows: int, cols: int, figsize: tuple[float, float],
             layout: Literal["constrained"] | None = None) -> tuple[Figure, Any]:
    """A figure and its ``rows`` x ``cols`` axes (a 2-D array), made under :data:`RC`
    without pyplot (whose import and figure registry a report does not need)."""
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=figsize, layout=layout)
        axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def new_axes(rows: int = 1, cols: int = 1, height: float = 3.6, width: float = 6.4,
             share: bool = False):
    """A figure of ``rows`` x ``cols`` panels and no layout engine: :func:`to_svg` lays it
    out once (constrained layout would run at each of the saving's two draws, twice each).
    ``share``: every panel on the same x and y axes."""
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width, height))
        axes = fig.subplots(rows, cols, squeeze=False, sharex=share, sharey=share)
    return fig, list(axes.flat)


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


def stack_lines(ax, part: pd.DataFrame, order: list[str], st: dict[str, dict],
                names: dict[str, str] | None = None) -> None:
    """One line per variant and stack: an encoder's and a decoder's layers are not joined
    into one curve (their layer indices run on, encoder first). ``names``: each variant's
    legend label (default: its name)."""
    part = part.assign(stack=part["stack"].fillna("")) if "stack" in part.columns \
        else part.assign(stack="")
    mean = mean_by(part, ["variant", "stack", "layer"])
    for variant in order:
        mine = mean[mean["variant"] == variant]
        for i, stack in enumerate(dict.fromkeys(mine["stack"])):
            line = mine[mine["stack"] == stack].sort_values("layer")
            ax.plot(line["layer"].astype(int), line["value"], markersize=3,
                    label=(names or {}).get(variant, variant) if i == 0 else "_nolegend_",
                    **st[variant])


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


def stack_caption(part: pd.DataFrame) -> str:
    """A caption's sentence naming the stacks drawn (nothing for a model of one stack)."""
    stacks = [s for s in dict.fromkeys(part.get("stack", pd.Series(dtype=str)).fillna("")) if s]
    if not stacks:
        return ""
    return (" Stacks are drawn as separate lines, layer indices running on from one to the "
            "next: " + ", ".join(stacks) + ".")


def build_plots(data: ReportData, focus: Sequence[str] | None = None,
                why: str = "", registry: Registry | None = None) -> list[Plot]:
    """Every registered probe's plots (its ``plots`` piece), in rank order; a probe whose
    plot has nothing to draw gives a skipped plot with its reason. ``focus``: the variants
    to draw (default: all), ``why`` says in each caption how they were chosen."""
    if focus is not None:
        keep = set(focus)
        data = replace(data, order=list(focus), rows=data.rows[data.rows["variant"].isin(keep)])
    with matplotlib.rc_context(RC):
        plots = [plot for piece in pieces(registry, "plots", failed_plots)
                 for plot in piece(data)]
    if why:
        for plot in plots:
            plot.caption += " " + why
    return plots


def failed_plots(probe: str, failure: Failure) -> list[Plot]:
    """In place of a probe's plots that raised: one skipped plot saying so."""
    return [Plot(f"failed-{probe}-plots", f"{probe}: plots", "", skipped=failure.notice())]


def heatmap(table: pd.DataFrame, key: str, title: str, caption: str, what: str) -> Plot:
    """A heatmap of ``table`` (one axis's values down, another's across) with each cell's
    number written in it."""
    rows, cols = len(table.index), len(table.columns)
    fig, (ax,) = new_axes(height=1.4 + 0.4 * rows, width=2.6 + 0.9 * cols)
    image = ax.imshow(table.to_numpy(dtype=float), cmap="viridis", aspect="auto")
    ax.set_xticks(range(cols), [shown(c) for c in table.columns], rotation=30, ha="right")
    ax.set_yticks(range(rows), [shown(r) for r in table.index])
    ax.set_xlabel(shown(table.columns.name or ""))
    ax.set_ylabel(shown(table.index.name or ""))
    if rows * cols <= 64:
        for (i, j), value in np.ndenumerate(table.to_numpy(dtype=float)):
            light = not math.isnan(value) and float(image.norm(value)) > 0.6  # viridis' yellow
            ax.text(j, i, "NaN" if math.isnan(value) else f"{value:.4g}", ha="center",
                    va="center", fontsize=7, color="black" if light else "white")
    fig.colorbar(image, ax=ax, label=what)
    ax.set_title(title)
    return Plot(key, title, caption, fig)


def to_svg(fig: Figure) -> str:
    """Deterministic SVG text: fixed hash salt, no date in the metadata. A figure of several
    panels or with a figure legend (:func:`legend`, right of the figure) and no layout
    engine gets one tight-layout pass (no panel's labels over its neighbour's, the panels
    up to the legend); the saved area is the drawing's tight bounding box."""
    buf = io.StringIO()
    with matplotlib.rc_context(RC):
        panels = [ax for ax in fig.axes if ax.get_subplotspec() is not None]  # not colorbars
        if (len(panels) > 1 or fig.legends) and fig.get_layout_engine() is None:
            fig.tight_layout()
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buf.getvalue()


def inline_svg(svg: str, prefix: str) -> str:
    """SVG for embedding in HTML: no prolog, metadata or namespace URLs; ids made unique."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}-{m.group(1)}"', svg)
    return svg
