"""Size as an axis: when a run's grid varies ``emb_dim`` or ``n_layers``, the loss against
non-embedding parameters and training FLOPs (log axes, one line per architecture variant,
a power law ``loss = a · x^(-b)`` fitted by least squares in log-log space when a line has
at least three sizes; Kaplan et al. 2020, "Scaling laws for neural language models"), and
each architecture axis's effect at each size (``effects_by_size.csv``): whether it holds
at every size (every interval excludes 0 with one sign) or flips (two intervals exclude 0
with opposite signs; :func:`..words.across_word`), else unclear.

The loss of a variant is its tuned ``test_loss`` when the run has setting axes (each
architecture variant at its own best setting, :mod:`.tuned`), else its mean over seeds of
``test_loss`` (falling back to ``eval_loss``, then ``final_loss``). Training FLOPs are
the training probe's own count when its rows have one (a metric ending in ``flops``), else
the estimate ``6 · N · D`` (N non-embedding parameters, D = steps · batch_size · seq_len
tokens; Kaplan et al. 2020).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ...config.roles import COMPARED, CONDITION, stored_roles
from ..effects import clear, interval
from ..frame import ReportData
from ..labels import GridLabels
from ..panels import mark_coinciding, panels_legend
from ..plots import Plot, log_scale, new_axes, styles
from ..tables import Table, fmt
from ..words import across_note, across_sizes_sentence, across_word
from .tuned import REPORT, SETTING, SIZE_AXES, Sweep, arch_name, choose

MIN_FIT = 3  # sizes a line needs for a fitted power law
BY_SIZE_COLUMNS = ("axis", "value", "size", "metric", "effect", "low", "high", "n", "sign",
                   "across_sizes")


def scaling_parts(data: ReportData, sweep: Sweep | None, probe: str, size_probe: str,
                  count: Callable[[Any], float] | None = None
                  ) -> tuple[list[Plot], list[str], list[Table], pd.DataFrame] | None:
    """``(plots, sentences, tables, effects_by_size.csv)`` when the first run with a grid
    varies size (None otherwise): the losses of ``probe`` against the non-embedding
    parameters that ``size_probe`` counts (``count(spec)`` where it did not run)."""
    points = size_points(data, sweep, probe, size_probe, count)
    if points is None:
        return None
    frame, per_seed, axes, baseline, metric = points
    lines = fit_lines(frame, metric)
    by_size = effects_by_size(per_seed, axes, baseline, metric)
    tables = [by_size_table(by_size)] if len(by_size) else []
    said = across_sizes_sentence(by_size)
    if said:
        lines.append(said)
    higher = sweep is not None and not sweep.head.lower_is_better  # an accuracy: linear
    return [scaling_plot(frame, metric, log_y=not higher)], lines, tables, by_size


def size_points(data: ReportData, sweep: Sweep | None, probe: str, size_probe: str,
                count: Callable[[Any], float] | None = None):
    """``(points, per_seed, arch axes, baseline values, metric)`` of the first run whose
    grid varies a size axis (None without one); ``probe``'s losses, ``size_probe``'s
    non-embedding parameter counts, else ``count`` of the variant's stored spec (NaN when
    neither gives one)."""
    for meta in data.runs:
        grid = meta.grid or {}
        sizes = [a for a in SIZE_AXES if len(grid.get(a, [])) > 1]
        if not sizes:
            continue
        mine = data.variants[data.variants["run"] == meta.run]
        rows = data.rows[data.rows["run"] == meta.run]
        roles = stored_roles(meta, [o for o in mine["overrides"] if isinstance(o, Mapping)])
        arch = [a for a in grid if a not in sizes and roles.get(a) in (COMPARED, CONDITION)]
        tuned = {a for a in grid if a not in sizes and a not in arch}
        metrics = set(rows.loc[rows["probe"] == probe, "metric"])
        metric = next((m for m in REPORT if m in metrics), None)
        if sweep is not None and sweep.run == meta.run:
            metric = sweep.reported_on  # the headline's test value (compare_on)
        if metric is None:
            return None
        chosen = _chosen_variants(sweep, meta.run)
        labels = GridLabels.of(meta)
        records, seeds = [], []
        compared = [a for a in arch if roles.get(a) == COMPARED]
        panels = [a for a in arch if roles.get(a) == CONDITION]
        for variant, over, spec in zip(mine["variant"], mine["overrides"], mine["spec"]):
            over = dict(over) if isinstance(over, Mapping) else {}
            if not set(over) <= set(grid) or not set(grid) - set(over) <= tuned:
                continue  # a named variant outside the grid (it sets other keys, or fewer);
                # a tuned axis may be missing (a key under tune: that only some variants have)
            if chosen is not None and variant not in chosen:
                continue  # not its group's chosen setting
            loss = _values(rows, variant, probe, metric)
            params = _values(rows, variant, size_probe, "non_embedding")
            if not len(params) and count is not None:  # the size probe did not run
                params = pd.Series([_counted(count, spec)])
            flops = _flops(rows, variant, params, meta.measure, over, probe)
            line = arch_name({k: over[k] for k in compared if k in over}, labels=labels) \
                if compared else "all"  # one line per compared variant, its sizes its points
            panel = ", ".join(f"{labels.short.get(a, a)}={labels.value(a, over[a])}"
                              for a in panels if a in over)
            size = ",".join(f"{a}={labels.value(a, over[a])}" for a in sizes)
            records.append({"line": line, "panel": panel, "size": size,
                            "params": params.mean(), "flops": flops, "loss": loss.mean()})
            for seed, value in loss.items():
                seeds.append({"seed": seed, "size": size, "value": value,
                              **{a: labels.value(a, over[a]) for a in arch}})
        if not records:
            return None
        base = mine[mine["variant"] == data.baseline]["overrides"]
        base_over = dict(base.iloc[0]) if len(base) and isinstance(base.iloc[0], Mapping) else {}
        baseline = {a: labels.value(a, base_over[a] if a in base_over else grid[a][0])
                    for a in arch}
        frame = pd.DataFrame(records).sort_values(["panel", "line", "params"], kind="stable")
        return frame, pd.DataFrame(seeds), arch, baseline, metric
    return None


def _counted(count: Callable[[Any], float], spec: Any) -> float:
    """``count(spec)``; NaN when the spec cannot be built (a plugin the report lacks)."""
    try:
        return float(count(spec))
    except Exception:  # a point without a size is left off the plot, not the report
        return math.nan


def _chosen_variants(sweep: Sweep | None, run: str) -> set[str] | None:
    """The variants chosen for each compared variant and condition (None: ``run`` is not
    the sweep's)."""
    if sweep is None or sweep.run != run:
        return None
    return {str(c["variant"]) for arch in sweep.archs if (c := choose(sweep, arch)) is not None}


def _values(rows: pd.DataFrame, variant: str, probe: str, metric: str) -> pd.Series:
    part = rows[(rows["variant"] == variant) & (rows["probe"] == probe)
                & (rows["metric"] == metric) & (rows["scope"] == "model")]
    return part.groupby("seed")["value"].mean()


def _flops(rows: pd.DataFrame, variant: str, params: pd.Series, measure: Mapping[str, Any],
           over: Mapping[str, Any], probe: str) -> float:
    """The training probe's FLOP count when it stores one, else 6 · N · D (D from its
    settings: steps · batch_size · seq_len)."""
    mine = rows[(rows["variant"] == variant) & (rows["probe"] == probe)
                & (rows["scope"] == "model")]
    counted = mine[mine["metric"].str.endswith("flops")]["value"]
    if len(counted):
        return float(counted.mean())
    settings = dict(measure.get(probe) or {})
    settings.update({k.split(".", 2)[2]: v for k, v in over.items()
                     if k.startswith(f"{SETTING}{probe}.")})
    tokens = 1.0
    for key in ("steps", "batch_size", "seq_len"):
        value = settings.get(key)
        if not isinstance(value, (int, float)):
            return math.nan
        tokens *= value
    return 6.0 * float(params.mean()) * tokens


def power_law(x: pd.Series, y: pd.Series) -> tuple[float, float] | None:
    """``(a, b)`` of ``y = a · x^(-b)`` fitted in log-log space; None with fewer than
    MIN_FIT distinct finite positive points."""
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    lx, ly = np.log(x[ok].astype(float)), np.log(y[ok].astype(float))
    if lx.nunique() < MIN_FIT:
        return None
    slope, intercept = np.polyfit(lx, ly, 1)
    return float(math.exp(intercept)), float(-slope)


def fit_lines(frame: pd.DataFrame, metric: str) -> list[str]:
    fits = []
    keys = ["panel", "line"] if "panel" in frame.columns else ["line"]
    for key, part in frame.groupby(keys, sort=False):
        *panel, line = key
        fit = power_law(part["params"], part["loss"])
        if fit is not None:
            where = f" ({panel[0]})" if panel and panel[0] else ""
            fits.append(f"{line}{where}: {metric} ∝ N^-{fmt(fit[1])}")
    if not fits:
        return [f"Size varies; fewer than {MIN_FIT} sizes per line, so no power law is fitted "
                "(see Loss vs size)."]
    return ["Power laws in non-embedding parameters N (see Loss vs size): "
            + "; ".join(fits[:4]) + "."]


def scaling_plot(frame: pd.DataFrame, metric: str, log_y: bool = True) -> Plot:
    """Loss against non-embedding parameters and training FLOPs, one row of panels per
    condition (shared axes) and in each one line per compared variant through the sizes it
    has; an axis is logarithmic only when every value drawn on it is positive (else linear),
    y only when ``log_y`` (a loss: an accuracy stays linear); points without a size or a
    loss are left off, and with none left the plot is skipped saying why."""
    title = "Loss vs size" if log_y else f"{metric} vs size"
    panels = list(dict.fromkeys(frame["panel"])) if "panel" in frame.columns else [""]
    per = (" One row of panels per condition, on shared axes." if len(panels) > 1 else "")
    scale = "log axes where every value is positive" if log_y else \
        "log x where every value is positive, linear y"
    caption = (f"{metric} against non-embedding parameters (left) and training FLOPs (right, "
               "the probe's count, else 6·N·tokens), one line per compared variant through "
               f"every size it has, {scale}; dashed: a power law fitted where a "
               f"line has at least {MIN_FIT} sizes.{per}")
    finite = frame[np.isfinite(frame["loss"].astype(float))]
    drawn = {x: finite[np.isfinite(finite[x].astype(float))] for x in ("params", "flops")}
    if not len(drawn["params"]) and not len(drawn["flops"]):
        return Plot("loss_vs_size", title, caption, skipped="no variant has both a loss and "
                    "a parameter count (or FLOPs) to draw")
    fig, axes = new_axes(len(panels), 2, width=9.0, height=3.2 * len(panels) + 0.4,
                         share=len(panels) > 1)
    rows = [axes[2 * i:2 * i + 2] for i in range(len(panels))]
    lines = list(dict.fromkeys(frame["line"]))
    for line, style in zip(lines, styles(len(lines))):
        for (ax_p, ax_f), panel in zip(rows, panels):
            for ax, x in ((ax_p, "params"), (ax_f, "flops")):
                part = drawn[x][(drawn[x]["line"] == line)
                                & ((drawn[x]["panel"] == panel) if "panel" in frame else True)]
                if not len(part):
                    continue
                ax.plot(part[x], part["loss"], marker="o", color=style["color"],
                        linestyle=style["linestyle"], label=line)
                fit = power_law(part[x], part["loss"]) if log_y else None
                if fit is not None:
                    pos = part[x][part[x] > 0]
                    xs = np.geomspace(float(pos.min()), float(pos.max()), 20)
                    ax.plot(xs, fit[0] * xs ** (-fit[1]), color=style["color"],
                            linestyle="--", linewidth=0.8, label="_fit", gid="guide")
    caption += mark_coinciding(axes)
    for (ax_p, ax_f), panel in zip(rows, panels):
        for ax, x, label in ((ax_p, "params", "non-embedding parameters"),
                             (ax_f, "flops", "training FLOPs")):
            part = drawn[x]
            if not len(part):
                ax.text(0.5, 0.5, f"no {label}", ha="center", va="center",
                        transform=ax.transAxes)
            if len(part) and (part[x] > 0).all():
                log_scale(ax, "x")
            if log_y and len(part) and (part["loss"] > 0).all():
                log_scale(ax, "y")
            ax.set_xlabel(label)
            ax.set_ylabel(metric)
            if len(panels) > 1:
                ax.set_title(panel, fontsize=9)
    fig.suptitle(title)
    panels_legend(fig, axes)
    return Plot("loss_vs_size", title, caption, fig)


def effects_by_size(per_seed: pd.DataFrame, axes: list[str], baseline: Mapping[str, str],
                    metric: str, over: str = "size") -> pd.DataFrame:
    """effects_by_size.csv: each architecture axis value's effect at each size (paired per
    seed, averaged within a seed over the other axes, t-interval over seeds) and whether
    its sign holds at every size. ``over``: the column of ``per_seed`` that says the size
    (``condition`` for effects_by_condition.csv, the same rule over every condition)."""
    records = []
    for axis in axes:
        others = ["seed", over] + [a for a in axes if a != axis]
        table = per_seed.pivot_table(index=others, columns=axis, values="value",
                                     aggfunc="mean")
        base = baseline[axis]
        for value in table.columns:
            if value == base or base not in table.columns:
                continue
            diff = (table[value] - table[base]).dropna()
            rows = []
            present = set(diff.index.get_level_values(over))
            for size in [z for z in dict.fromkeys(per_seed[over]) if z in present]:
                part = diff[diff.index.get_level_values(over) == size]
                effect, low, high, n = interval(part.groupby(level="seed").mean())
                sign = "positive" if effect > 0 else "negative" if effect < 0 else "zero"
                rows.append([axis, value, size, metric, effect, low, high, n, sign])
            said = [("lower" if r[4] < 0 else "higher") if clear(r[5], r[6]) else "unclear"
                    for r in rows]  # a sign is said only where its interval excludes 0
            holds = f"one {over}" if len(rows) < 2 else across_word(said)
            records += [r + [holds] for r in rows]
    columns = [over if c == "size" else f"across_{over}s" if c == "across_sizes" else c
               for c in BY_SIZE_COLUMNS]
    return pd.DataFrame(records, columns=columns)


def by_size_table(frame: pd.DataFrame, over: str = "size") -> Table:
    """The Effects by size table (``over="condition"``: Effects by condition)."""
    body = [[r["axis"], r["value"], r[over], fmt(r["effect"]),
             f"[{fmt(r['low'])}, {fmt(r['high'])}]" if math.isfinite(r["low"]) else "— (one seed)",
             str(r["n"]), r[f"across_{over}s"]] for r in frame.to_dict("records")]
    note = across_note(over)
    return Table(f"Effects by {over}", ["axis", "value", over, "effect", "95% interval",
                                        "n seeds", f"across {over}s"], body, note)
