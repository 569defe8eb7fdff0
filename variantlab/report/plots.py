"""Matplotlib figures (Agg backend) and their deterministic SVG text."""

from __future__ import annotations

import io
import math
import multiprocessing
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from ..plugin.registry import Registry  # noqa: E402
from .frame import ReportData  # noqa: E402
from .guard import Failure  # noqa: E402
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


def can_share() -> bool:
    """Whether :func:`draw_all` may fork a helper: on Linux, from a process with no other
    thread (a fork copies only the calling thread; a lock another thread held would stay
    held in the copy)."""
    return (sys.platform.startswith("linux") and threading.active_count() == 1
            and "fork" in multiprocessing.get_all_start_methods())


def draw_all(figures: Sequence[Figure], draw_here: Callable[[int], str | None],
             share: bool | None = None) -> list[str | None]:
    """The SVG text of each figure, ``draw_here(i)`` drawing figure ``i`` in this process
    (the caller's, which says why a drawing failed). With ``share`` (default
    :func:`can_share`) and more than one figure, a forked helper process draws at the same
    time (:func:`to_svg`), each process taking the next figure neither has taken, while the
    other core would idle (benchmarks/throughput.md). A figure the helper could not
    draw, or did not send back (it died), is drawn here."""
    n = len(figures)
    if not (can_share() if share is None else share) or n < 2:
        return [draw_here(i) for i in range(n)]
    context = multiprocessing.get_context("fork")
    taken = context.Value("i", 0)
    receive, send = context.Pipe(duplex=False)
    helper = context.Process(target=_help_draw, args=(figures, taken, send), daemon=True)
    helper.start()
    send.close()  # the helper's end: its exit closes the pipe
    out: list[str | None] = [None] * n
    here: set[int] = set()
    try:
        while (i := _take(taken)) < n:
            out[i] = draw_here(i)
            here.add(i)
        try:
            helped: dict[int, str | None] = receive.recv()
        except (EOFError, OSError):  # the helper died: what it took is drawn below
            helped = {}
    finally:
        receive.close()
        helper.join(timeout=5.0)
        if helper.is_alive():
            helper.kill()
            helper.join()
    for i in range(n):
        if i not in here:
            out[i] = helped.get(i) or draw_here(i)
    return out


def _take(taken: Any) -> int:
    """The next figure's index (shared by the processes drawing)."""
    with taken.get_lock():
        i = int(taken.value)
        taken.value = i + 1
    return i


def _help_draw(figures: Sequence[Figure], taken: Any, send: Any) -> None:
    """The helper's part of :func:`draw_all`: the figures it takes, sent back at the end in
    one message (index -> SVG text, None for a failed drawing, which the parent repeats to
    say why)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    drawn: dict[int, str | None] = {}
    while (i := _take(taken)) < len(figures):
        try:
            drawn[i] = to_svg(figures[i])
        except Exception:  # noqa: BLE001 - drawn again in the parent, which says why
            drawn[i] = None
    send.send(drawn)
    send.close()


def inline_svg(svg: str, prefix: str) -> str:
    """SVG for embedding in HTML: no prolog, metadata or namespace URLs; ids made unique."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}-{m.group(1)}"', svg)
    return svg
