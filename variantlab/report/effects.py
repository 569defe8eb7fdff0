"""Effects of a grid's axes: which choice matters, by how much, and how sure.

The main effect of an axis value ``v`` on a metric is built from paired differences
``y(v) - y(b)`` against the axis's baseline value ``b`` (the baseline variant's value, else
the first listed), each pair sharing its run, its seed and the values of every other axis.
The seed is the unit of replication: the pairs of one seed (the cells of the other axes)
are averaged into one difference per seed, and the effect is the mean of those with a 95%
Student-t interval over seeds (mean ± t(0.975, n-1) · sd/√n, ``n`` = number of seeds;
:mod:`.stats`).
Pairs of one seed share its initialisation and its batches, so counting them as separate
replicates would make the interval too narrow. One seed gives no interval; seeds that all
agree give a zero-width one. A paired difference smaller than 1e-6 of the metric's mean
magnitude (float32 rounding: naive and fused attention compute the same numbers in a
different order) counts as 0.

A two-way interaction of axes A and B at ``(a, b)`` is the paired contrast
``y(a, b) - y(a0, b) - y(a, b0) + y(a0, b0)``: how much the effect of A changes when B moves
off its baseline value, with the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations

import pandas as pd

from ..config.metrics import headline_of
from ..config.roles import stored_roles
from .frame import ReportData
from .labels import GridLabels, run_grid
from .stats import interval as stats_interval
from .stats import t_quantile

#: metric in seed_metrics -> how the report names it, and whether lower is better
HEADLINE: tuple[tuple[str, str, bool | None], ...] = (
    ("eval_loss", "eval loss", True),
    ("final_loss", "final loss", True),
    ("first_layer_mean_abs_grad", "first-layer mean |grad|", None),
    ("grad_norm_ratio.all", "last/first grad norm", None),
    ("backward_median_s", "forward+backward time (ms)", True),
    ("forward_median_s", "forward time (ms)", True),
    ("total", "parameters", None),
)
EFFECT_COLUMNS = ("axis", "value", "metric", "effect", "low", "high", "n")
TOP_AXES = 3  # interactions are computed among this many top axes
ROUNDING = 1e-6  # float32 rounding, relative: smaller paired differences count as 0
def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (:func:`.stats.t_quantile`)."""
    return t_quantile(0.975, df)


def interval(diffs: pd.Series) -> tuple[float, float, float, int]:
    """Mean, low, high (95% t-interval) and n of paired differences (:mod:`.stats`)."""
    return stats_interval(diffs)


def clear(low: float, high: float) -> bool:
    """An interval that excludes 0 (so the effect's sign is sure at 95%)."""
    return not (math.isnan(low) or math.isnan(high)) and (low > 0 or high < 0)


@dataclass
class Grid:
    """A report's grid: axes with their values (as text), each grid variant's values."""

    axes: dict[str, list[str]]
    baseline: dict[str, str]  # axis -> its baseline value
    cells: pd.DataFrame  # variant, run, one column per axis (text values)
    run: str = ""  # the run whose grid this is
    metrics: list[tuple[str, str, bool | None]] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)  # axis -> compared, tuned or condition


def find_grid(data: ReportData) -> Grid | None:
    """The grid of the report's first run that has one (None without): only its variants
    whose overrides are one combination of it belong to it. Effects come from one run, so
    runs (before and after a change, say) are never pooled; the across-runs table compares
    them."""
    found = next(((m.run, g) for m in data.runs if (g := run_grid(m))), None)
    if found is None:
        return None
    run, first = found
    labels = GridLabels.of(next(m for m in data.runs if m.run == run))
    axes = {a: list(dict.fromkeys(labels.value(a, v) for v in vals)) for a, vals in first.items()}
    records = []
    for rec in data.variants[data.variants["run"] == run].itertuples():
        over = rec.overrides
        if not isinstance(over, Mapping) or set(over) != set(axes):
            continue
        texts = {a: labels.value(a, over[a]) for a in axes}
        if all(texts[a] in axes[a] for a in axes):
            records.append({"variant": rec.variant, "run": run, **texts})
    if not records:
        return None
    # a named variant that sets exactly the grid's axes repeats a combination: the grid's
    # own variant (listed first) stands for it, so no cell averages two variants
    cells = pd.DataFrame(records).drop_duplicates(subset=list(axes), keep="first")
    base_row = cells[cells["variant"] == data.baseline]
    baseline = {a: (str(base_row[a].iloc[0]) if len(base_row) else vals[0])
                for a, vals in axes.items()}
    meta = next(m for m in data.runs if m.run == run)
    roles = stored_roles(meta, [o for o in data.variants.loc[data.variants["run"] == run,
                                                              "overrides"]
                                if isinstance(o, Mapping)])
    return Grid(axes, baseline, cells, run=run, roles=dict(roles))


def grid_values(data: ReportData, grid: Grid, per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per-seed headline values of the grid's variants, with their run and axis values;
    the run's ``compare_on`` metric (its test value, when a probe's summary metrics have
    it for every variant of the grid) leads."""
    mine = per_seed[per_seed["variant"].isin(set(grid.cells["variant"]))]
    every = set(grid.cells["variant"])
    # a metric only some variants have (a tuned sweep's test split, scored at the chosen
    # settings alone) cannot lead the grid's effects
    present = {m for m, names in mine.groupby("metric")["variant"] if set(names) >= every}
    headlines = lead_with(data, grid, present)
    wanted = [m for m, _, _ in headlines]
    part = per_seed[per_seed["metric"].isin(wanted)][["variant", "seed", "metric", "value"]]
    out = part.merge(grid.cells, on="variant", how="inner")
    grid.metrics = [h for h in headlines if h[0] in set(out["metric"])]
    return out


def lead_with(data: ReportData, grid: Grid, present: set[str]
              ) -> list[tuple[str, str, bool | None]]:
    """HEADLINE with the grid run's headline metric first: the first of its test columns
    (``test_M``, then older names) that ``present`` has, else its validation column
    (``val_M``: a tuned sweep scores the test split at the chosen settings only, so only
    validation covers every setting of the grid), labelled by its name."""
    meta = next((m for m in data.runs if m.run == grid.run), None)
    head = headline_of(meta, data.registry) if meta is not None else None
    if head is None or not getattr(meta, "compare_on", ""):
        return list(HEADLINE)
    first = next((m for m in (*head.report, *head.choose) if m in present), None)
    if first is None:
        return list(HEADLINE)
    label = next((lab for m, lab, _ in HEADLINE if m == first), first.replace("_", " "))
    return [(first, label, head.lower_is_better), *(h for h in HEADLINE if h[0] != first)]


def _pivot(values: pd.DataFrame, index: list[str], columns: list[str]) -> pd.DataFrame:
    return values.pivot_table(index=index, columns=columns, values="value", aggfunc="mean",
                              dropna=False)


def rounding(values: pd.Series) -> float:
    """Differences at most this large are float rounding (ROUNDING of the values' mean
    magnitude) and count as 0."""
    scale = float(values.abs().mean()) if len(values) else 0.0
    return ROUNDING * scale if math.isfinite(scale) else 0.0


def _paired(diff: pd.Series, tol: float) -> tuple[float, float, float, int]:
    """Effect, interval and number of seeds of paired differences indexed by (run, seed,
    other axes...): averaged within each (run, seed) first, then over seeds."""
    d = diff.where(diff.abs() > tol, 0.0).where(diff.notna())
    per_seed = d.groupby(level=["run", "seed"]).mean() if len(d) else d
    return interval(per_seed)


def main_effects(grid: Grid, values: pd.DataFrame) -> pd.DataFrame:
    """``axis, value, metric, effect, low, high, n``: every non-baseline value of every
    axis on every headline metric, ranked within each metric by the effect's size."""
    records = []
    for metric, _, _ in grid.metrics:
        mine = values[values["metric"] == metric]
        tol = rounding(mine["value"])
        # the cell means once per metric; each axis's table (its values across) is an
        # unstack of it: what _pivot(mine, others, [axis]) gives, without its own groupby
        cube = mine.groupby(["run", "seed", *grid.axes], sort=True, dropna=False)["value"] \
            .mean()
        for axis, vals in grid.axes.items():
            table = cube.unstack(axis)
            base = grid.baseline[axis]
            for value in vals:
                if value == base or value not in table or base not in table:
                    continue
                effect, low, high, n = _paired(table[value] - table[base], tol)
                records.append((axis, value, metric, effect, low, high, n))
    return _ranked(pd.DataFrame(records, columns=list(EFFECT_COLUMNS)), grid)


def _ranked(frame: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    order = {m: i for i, (m, _, _) in enumerate(grid.metrics)}
    frame = frame.assign(_m=frame["metric"].map(order), _s=-frame["effect"].abs().fillna(-1))
    return frame.sort_values(["_m", "_s"], kind="stable").drop(columns=["_m", "_s"]) \
        .reset_index(drop=True)


def top_axes(grid: Grid, effects: pd.DataFrame, metric: str, k: int = TOP_AXES) -> list[str]:
    """Axes by the largest |effect| of any of their values on ``metric``."""
    mine = effects[effects["metric"] == metric]
    size = mine.assign(size=mine["effect"].abs()).groupby("axis")["size"].max()
    ranked = sorted(grid.axes, key=lambda a: -float(size.get(a, -1.0)))
    return [a for a in ranked if len(grid.axes[a]) > 1][:k]


def interactions(grid: Grid, values: pd.DataFrame, metric: str,
                 axes: list[str]) -> pd.DataFrame:
    """Two-way interaction contrasts of each pair of ``axes`` on ``metric``."""
    mine = values[values["metric"] == metric]
    tol = rounding(mine["value"])
    records = []
    for a, b in combinations(axes, 2):
        others = ["run", "seed"] + [x for x in grid.axes if x not in (a, b)]
        table = _pivot(mine, others, [a, b])
        a0, b0 = grid.baseline[a], grid.baseline[b]
        for va in grid.axes[a]:
            for vb in grid.axes[b]:
                keys = [(va, vb), (a0, vb), (va, b0), (a0, b0)]
                if va == a0 or vb == b0 or any(k not in table for k in keys):
                    continue
                diff = table[keys[0]] - table[keys[1]] - table[keys[2]] + table[keys[3]]
                effect, low, high, n = _paired(diff, tol)
                records.append((f"{a} × {b}", f"{va} × {vb}", metric, effect, low, high, n))
    frame = pd.DataFrame(records, columns=list(EFFECT_COLUMNS))
    return frame.assign(_s=-frame["effect"].abs().fillna(-1)).sort_values(
        "_s", kind="stable").drop(columns="_s").reset_index(drop=True)


def cell_means(grid: Grid, values: pd.DataFrame, metric: str, a: str, b: str) -> pd.DataFrame:
    """Mean of ``metric`` over seeds and the other axes, ``a`` down and ``b`` across, in
    the grid's value order."""
    mine = values[values["metric"] == metric]
    table = mine.pivot_table(index=a, columns=b, values="value", aggfunc="mean")
    return table.reindex(index=grid.axes[a], columns=grid.axes[b])


@dataclass
class Effects:
    """Everything the report shows about a grid."""

    grid: Grid
    main: pd.DataFrame
    pairs: pd.DataFrame  # interactions on the primary metric
    primary: str
    top: list[str]
    values: pd.DataFrame
    several_runs: bool = False  # the report has runs beside the grid's

    def csv_frame(self) -> pd.DataFrame:
        return pd.concat([self.main, self.pairs], ignore_index=True)


def compute_effects(data: ReportData, per_seed: pd.DataFrame) -> Effects | None:
    """The grid's main effects and the top axes' interactions (None without a grid or
    without headline numbers)."""
    grid = find_grid(data)
    if grid is None:
        return None
    values = grid_values(data, grid, per_seed)
    if not grid.metrics:
        return None
    main = main_effects(grid, values)
    if not len(main):  # every axis has one value: nothing to compare
        return None
    moved = set(main.loc[main["effect"].abs() > 0, "metric"])
    primary = next((m for m, _, _ in grid.metrics if m in moved), grid.metrics[0][0])
    top = top_axes(grid, main, primary)
    pairs = interactions(grid, values, primary, top)
    return Effects(grid, main, pairs, primary, top, values, len(data.runs) > 1)


def effects_csv(effects: Effects | None) -> str:
    """effects.csv: main effects, then the interactions (axis ``A × B``), each with its
    axis's role (``compared × tuned`` for an interaction); a header only when the report
    has no grid."""
    from .tables import csv_safe

    frame = effects.csv_frame() if effects is not None else \
        pd.DataFrame(columns=list(EFFECT_COLUMNS))
    roles = effects.grid.roles if effects is not None else {}
    frame = frame.assign(role=[" × ".join(roles.get(a, "") for a in str(axis).split(" × "))
                               for axis in frame["axis"]])
    return csv_safe(frame).to_csv(index=False, float_format="%.6g", lineterminator="\n")


def label_of(metric: str) -> str:
    return next((label for m, label, _ in HEADLINE if m == metric), metric)
