"""Matplotlib figures (Agg backend) and their deterministic SVG text."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import cycle, islice
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .frame import ReportData  # noqa: E402
from .tables import PASS_NAMES, SLOT_ORDER  # noqa: E402

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


def _palette(name: str) -> tuple:
    """The colours of a qualitative matplotlib colormap (tab10, tab20)."""
    cmap = plt.get_cmap(name)
    assert isinstance(cmap, ListedColormap), name
    return tuple(cast("Sequence[Any]", cmap.colors))


def styles(n: int) -> list[dict]:
    """Distinct line styles for n variants: colour cycle, then dashes and markers beyond it."""
    colors = _palette("tab10" if n <= 10 else "tab20")
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


def _label_lines(names: Sequence[str]) -> int:
    """Lines the names take as bar labels (a long name wraps, see :func:`shown`)."""
    return sum(max(1, shown(n).count("\n") + 1) for n in names)


def _legend(fig: Figure, ax, n: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    labels = [shown(label) for label in labels]
    if not handles:
        return
    ncol = max(1, math.ceil(n / 14))
    fig.legend(handles, labels, loc="outside right center", ncol=ncol,
               fontsize=8 if n <= 10 else 7, frameon=False, title="variant")


def _mean_by(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return frame.groupby(by, sort=False)["value"].mean().reset_index()


def _new(rows: int = 1, cols: int = 1, height: float = 3.6, width: float = 6.4):
    with plt.rc_context(RC):
        fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False,
                                 layout="constrained")
    plt.close(fig)  # keep pyplot's registry empty; the figure object stays usable
    return fig, list(axes.flat)


def gradient_plot(data: ReportData) -> Plot:
    title = "Gradient norm by layer"
    caption = ("L2 norm of each layer's parameter gradients (mean over batches and seeds) at "
               "initialisation, log scale: a line rising to the right means gradients grow "
               "with depth.")
    rows = data.rows
    part = rows[(rows["probe"] == "gradients") & (rows["scope"] == "layer")
                & (rows["metric"] == "grad_norm") & rows["layer"].notna()]
    if not len(part):
        return Plot("gradients", title, caption, skipped="no per-layer gradient rows (the "
                    "gradients probe did not run)")
    names = [n for n in ("all", "attention", "feedforward") if n in set(part["name"])]
    names = names or sorted(set(part["name"]))[:3]
    fig, axes = _new(1, len(names), width=3.4 * len(names) + 1)
    st = dict(zip(data.order, styles(len(data.order))))
    for ax, name in zip(axes, names):
        _stack_lines(ax, part[part["name"] == name], data.order, st)
        ax.set_yscale("log")
        ax.set_title("all slots" if name == "all" else name)
        ax.set_xlabel("layer index")
        ax.set_ylabel("gradient L2 norm (log scale)")
        ax.xaxis.get_major_locator().set_params(integer=True)
    _legend(fig, axes[0], len(data.order))
    fig.suptitle(title)
    return Plot("gradients", title, caption + _stack_caption(part), fig)


def _stack_lines(ax, part: pd.DataFrame, order: list[str], st: dict[str, dict]) -> None:
    """One line per variant and stack: an encoder's and a decoder's layers are not joined
    into one curve (their layer indices run on, encoder first)."""
    part = part.assign(stack=part["stack"].fillna("")) if "stack" in part.columns \
        else part.assign(stack="")
    mean = _mean_by(part, ["variant", "stack", "layer"])
    for variant in order:
        mine = mean[mean["variant"] == variant]
        for i, stack in enumerate(dict.fromkeys(mine["stack"])):
            line = mine[mine["stack"] == stack].sort_values("layer")
            ax.plot(line["layer"].astype(int), line["value"], markersize=3,
                    label=variant if i == 0 else "_nolegend_", **st[variant])


def _stack_caption(part: pd.DataFrame) -> str:
    stacks = [s for s in dict.fromkeys(part.get("stack", pd.Series(dtype=str)).fillna("")) if s]
    if not stacks:
        return ""
    return (" Stacks are drawn as separate lines, layer indices running on from one to the "
            "next: " + ", ".join(stacks) + ".")


def residual_plot(data: ReportData) -> Plot:
    title = "Residual-stream RMS by layer"
    caption = ("Root mean square of the residual stream after each layer (mean over batches "
               "and seeds): how the activations' scale grows with depth.")
    rows = data.rows
    part = rows[(rows["metric"] == "residual_rms") & rows["layer"].notna()]
    if not len(part):
        return Plot("residual", title, caption, skipped="no residual_rms rows")
    fig, (ax,) = _new()
    _stack_lines(ax, part, data.order, dict(zip(data.order, styles(len(data.order)))))
    ax.set_title(title)
    ax.set_xlabel("layer index")
    ax.set_ylabel("residual RMS (activation units)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend(fig, ax, len(data.order))
    return Plot("residual", title, caption + _stack_caption(part), fig)


def timing_plot(data: ReportData) -> Plot:
    title = "Time per pass"
    caption = ("Median wall time per pass over repeats (mean over seeds); whiskers span the "
               "interquartile range.")
    rows = data.rows[data.rows["probe"] == "timing"]
    passes = [p for p in PASS_NAMES if (rows["metric"] == f"{p}_median_s").any()]
    if not passes:
        return Plot("timing", title, caption, skipped="no timing rows (the timing probe did "
                    "not run)")
    variants = [v for v in data.order if v in set(rows["variant"])]
    fig, axes = _new(1, len(passes), height=1.2 + 0.28 * _label_lines(variants),
                     width=2.6 * len(passes) + 2.4)
    colors = styles(len(variants))
    for ax, key in zip(axes, passes):
        med = _mean_by(rows[rows["metric"] == f"{key}_median_s"], ["variant"]).set_index("variant")
        iqr = _mean_by(rows[rows["metric"] == f"{key}_iqr_s"], ["variant"]).set_index("variant")
        vals = [med["value"].get(v, float("nan")) * 1e3 for v in variants]
        errs = [iqr["value"].get(v, 0.0) * 1e3 / 2 for v in variants]
        ax.barh(range(len(variants)), vals, xerr=errs, capsize=2,
                color=[c["color"] for c in colors])
        ax.set_yticks(range(len(variants)), [shown(v) for v in variants] if ax is axes[0]
                      else [""] * len(variants))
        ax.invert_yaxis()
        ax.set_title(PASS_NAMES[key])
        ax.set_xlabel("median time (ms)")
        ax.set_ylabel("variant")
    fig.suptitle(title)
    return Plot("timing", title, caption, fig)


def loss_plot(data: ReportData) -> Plot:
    title = "Training loss"
    caption = "Training loss per step (mean over seeds) of the short AdamW run."
    rows = data.rows
    part = rows[(rows["probe"] == "training") & (rows["metric"] == "loss") & rows["step"].notna()]
    if not len(part):
        return Plot("training", title, caption, skipped="no training curves (the training "
                    "probe did not run)")
    fig, (ax,) = _new()
    mean = _mean_by(part, ["variant", "step"])
    for variant, style in zip(data.order, styles(len(data.order))):
        line = mean[mean["variant"] == variant].sort_values("step")
        if len(line):
            style = dict(style, marker=None)
            ax.plot(line["step"].astype(int), line["value"], label=variant, **style)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (nats per token)" if _is_lm(data) else "loss")
    _legend(fig, ax, len(data.order))
    return Plot("training", title, caption, fig)


def _is_lm(data: ReportData) -> bool:
    families = {s.get("family") for s in data.variants["spec"] if isinstance(s, dict)}
    return bool(families) and families <= {"gpt", "decoder", "encoder_decoder", "encoder"}


def params_plot(data: ReportData) -> Plot:
    title = "Parameters by slot"
    caption = "Parameter count of each slot, stacked per variant (tied weights counted once)."
    rows = data.rows
    part = rows[(rows["probe"] == "params") & (rows["scope"] == "slot")]
    if not len(part):
        return Plot("params", title, caption, skipped="no per-slot parameter rows")
    mean = _mean_by(part, ["variant", "name"])
    variants = [v for v in data.order if v in set(mean["variant"])]
    slots = sorted(set(mean["name"]), key=lambda s: (SLOT_ORDER.index(s) if s in SLOT_ORDER
                                                     else 99, s))
    fig, (ax,) = _new(height=1.4 + 0.28 * _label_lines(variants))
    table = mean.pivot(index="variant", columns="name", values="value").reindex(variants)
    left = [0.0] * len(variants)
    colors = _palette("tab10")
    for slot, color in zip(slots, islice(cycle(colors), len(slots))):
        vals = table[slot].fillna(0).tolist()
        ax.barh(range(len(variants)), vals, left=left, label=slot, color=color)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(variants)), [shown(v) for v in variants])
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel("parameters (count)")
    ax.set_ylabel("variant")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, title="slot",
              fontsize=8)
    return Plot("params", title, caption, fig)


def build_plots(data: ReportData, focus: Sequence[str] | None = None,
                why: str = "") -> list[Plot]:
    """Every plot of a report, in order; absent data gives a skipped plot with its reason.
    ``focus``: the variants to draw (default: all), ``why`` says in each caption how they
    were chosen."""
    if focus is not None:
        keep = set(focus)
        data = replace(data, order=list(focus), rows=data.rows[data.rows["variant"].isin(keep)])
    with plt.rc_context(RC):
        plots = [gradient_plot(data), residual_plot(data), timing_plot(data), loss_plot(data),
                 params_plot(data)]
    if why:
        for plot in plots:
            plot.caption += " " + why
    return plots


def heatmap(table: pd.DataFrame, key: str, title: str, caption: str, what: str) -> Plot:
    """A heatmap of ``table`` (one axis's values down, another's across) with each cell's
    number written in it."""
    rows, cols = len(table.index), len(table.columns)
    fig, (ax,) = _new(height=1.4 + 0.4 * rows, width=2.6 + 0.9 * cols)
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
    """Deterministic SVG text: fixed hash salt, no date in the metadata."""
    buf = io.StringIO()
    with plt.rc_context(RC):
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
