"""variantlab.report.effects function by function on small hand-made frames (issue 30.4):
the t quantile against a numerical integral of Student's density, paired effects and
interactions against differences worked out by hand per seed, the ranking, the grid a
report reads and effects.csv. No report is built: each test runs in milliseconds, so the
mutation runner (docs/mutation.md) can afford them per mutant."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace

import pandas as pd
import pytest

from variantlab.report.effects import (
    HEADLINE,
    Effects,
    Grid,
    cell_means,
    clear,
    compute_effects,
    effects_csv,
    find_grid,
    grid_values,
    interactions,
    interval,
    label_of,
    lead_with,
    main_effects,
    rounding,
    t975,
    top_axes,
)
from variantlab.report.frame import ReportData
from variantlab.store.contract import RunMeta

# the two-sided 95% critical values of Student's t (df 2, 3), for the intervals
T2, T3 = 4.302652729749462, 3.182446305284263  # t(0.975; 2, 3 df)


def _t_quantile(df: int, p: float = 0.975) -> float:
    """Student's t quantile by Newton's method on the density integrated by Simpson's rule
    (written from the density, shares nothing with the module)."""
    const = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def pdf(x: float) -> float:
        return const * (1 + x * x / df) ** (-(df + 1) / 2)

    def cdf(x: float, steps: int = 600) -> float:
        h = x / steps
        inner = sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, steps))
        return 0.5 + h / 3 * (pdf(0.0) + inner + pdf(x))

    x = math.tan(math.pi * (p - 0.5)) if df == 1 else 2.0 + 2.5 / df
    for _ in range(30):
        step = (cdf(x) - p) / pdf(x)
        x -= step
        if abs(step) < 1e-10:
            break
    return x


def _t_interval(per_seed: list[float], t: float) -> tuple[float, float, float, int]:
    mean = statistics.fmean(per_seed)
    half = t * statistics.stdev(per_seed) / math.sqrt(len(per_seed))
    return mean, mean - half, mean + half, len(per_seed)


# --- t975, interval, clear, rounding ---------------------------------------------------------


def test_t975_is_students_quantile_from_scipy():
    assert math.isnan(t975(0)) and math.isnan(t975(-1))
    for df in (1, 2, 5, 30, 31, 120, 1000):  # a few decimals of the independent quantile
        assert abs(t975(df) - _t_quantile(df)) < 5.5e-4, df
    # closed forms: 1 df is tan(0.475 pi), 2 df is (2p-1) sqrt(2 / (4p(1-p)))
    assert t975(1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-9)
    assert t975(2) == pytest.approx(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), rel=1e-9)
    assert t975(30) == pytest.approx(2.0422724563, rel=1e-9)


def test_interval_is_the_mean_and_a_t_interval_over_the_values():
    mean, low, high, n = interval(pd.Series([1.0, 2.0, 3.0, 6.0, math.nan]))
    sd = math.sqrt((4 + 1 + 0 + 9) / 3)  # about the mean 3
    assert n == 4 and mean == pytest.approx(3.0)
    assert (low, high) == pytest.approx((3 - T3 * sd / 2, 3 + T3 * sd / 2), rel=1e-12)
    one = interval(pd.Series([0.25]))
    assert one[0] == 0.25 and math.isnan(one[1]) and math.isnan(one[2]) and one[3] == 1
    none = interval(pd.Series([math.nan, math.nan]))
    assert all(math.isnan(v) for v in none[:3]) and none[3] == 0
    assert interval(pd.Series([], dtype=float))[3] == 0
    assert interval(pd.Series([2.0, 2.0, 2.0])) == (2.0, 2.0, 2.0, 3)  # seeds that agree
    two = interval(pd.Series([1, 3]))  # integers are averaged as floats
    t1 = math.tan(0.475 * math.pi)  # t(0.975) with 1 df
    assert two == pytest.approx((2.0, 2.0 - t1, 2.0 + t1, 2), rel=1e-12)


def test_clear_is_an_interval_that_excludes_zero():
    assert clear(0.1, 0.2) and clear(-0.2, -0.1)
    assert not clear(-0.1, 0.1) and not clear(0.0, 0.1) and not clear(-0.1, 0.0)
    assert not clear(math.nan, 0.2) and not clear(0.1, math.nan) and not clear(-0.2, math.nan)
    assert not clear(math.nan, -0.1)


def test_rounding_is_a_millionth_of_the_mean_magnitude():
    assert rounding(pd.Series([1.0, -3.0])) == pytest.approx(2e-6, rel=1e-12)
    assert rounding(pd.Series([2.0, math.nan])) == pytest.approx(2e-6, rel=1e-12)
    assert rounding(pd.Series([], dtype=float)) == 0.0
    assert rounding(pd.Series([1.0, math.inf])) == 0.0
    assert rounding(pd.Series([math.nan])) == 0.0


# --- main effects on a hand-made grid --------------------------------------------------------

A = {"x": 1.0, "y": 1.5, "z": 0.8}
B = {"p": 0.0, "q": 0.25}
SEEDS = (0, 1, 2)


def _value(a: str, b: str, s: int) -> float:
    """y(a, b, seed): main terms, seed terms, and an interaction at (y, q) and (z, q)."""
    out = A[a] + B[b] + 0.1 * s * (a == "y") + 0.05 * s * s * (b == "q")
    if (a, b) == ("y", "q"):
        out += 0.3 + 0.02 * s
    if (a, b) == ("z", "q"):
        out -= 0.1
    return out


def _grid(axes: dict[str, list[str]], baseline: dict[str, str], metrics: list[str],
          run: str = "r") -> Grid:
    cells = pd.DataFrame([{"variant": "/".join(c), "run": run, **dict(zip(axes, c))}
                          for c in pd.MultiIndex.from_product(list(axes.values()))])
    return Grid(axes, baseline, cells, run=run,
                metrics=[(m, m.replace("_", " "), True) for m in metrics])


def _values(grid: Grid, fns: dict[str, object], seeds=SEEDS) -> pd.DataFrame:
    recs = []
    for cell in grid.cells.to_dict("records"):
        for s in seeds:
            for metric, fn in fns.items():
                v = fn(*(cell[a] for a in grid.axes), s)  # type: ignore[operator]
                if v is not None:
                    recs.append({"variant": cell["variant"], "seed": s, "metric": metric,
                                 "value": v, "run": cell["run"],
                                 **{a: cell[a] for a in grid.axes}})
    return pd.DataFrame(recs)


def _row(frame: pd.DataFrame, axis: str, value: str, metric: str) -> tuple:
    hit = frame[(frame["axis"] == axis) & (frame["value"] == value) & (frame["metric"] == metric)]
    assert len(hit) == 1, (axis, value, metric)
    r = hit.iloc[0]
    return float(r["effect"]), float(r["low"]), float(r["high"]), int(r["n"])


def test_main_effects_pair_within_seed_and_average_per_seed():
    grid = _grid({"a": ["x", "y", "z"], "b": ["p", "q"]}, {"a": "x", "b": "p"}, ["m"])
    main = main_effects(grid, _values(grid, {"m": _value}))
    # y - x per seed, averaged over b: 0.5 + 0.1 s, and half the (y, q) interaction
    y = [0.5 + 0.1 * s + (0.3 + 0.02 * s) / 2 for s in SEEDS]
    assert _row(main, "a", "y", "m") == pytest.approx(_t_interval(y, T2), rel=1e-9)
    # z - x: -0.2, and half of -0.1 at q: -0.25 on every seed
    effect, low, high, n = _row(main, "a", "z", "m")
    assert (effect, low, high, n) == pytest.approx((-0.25, -0.25, -0.25, 3), abs=1e-12)
    # q - p per seed, averaged over a: 0.25 + 0.05 s^2 and a third of each interaction
    q = [0.25 + 0.05 * s * s + (0.3 + 0.02 * s - 0.1) / 3 for s in SEEDS]
    assert _row(main, "b", "q", "m") == pytest.approx(_t_interval(q, T2), rel=1e-9)
    # ranked by |effect|: y (0.76), q (0.39), z (0.25); no baseline row
    assert list(zip(main["axis"], main["value"])) == [("a", "y"), ("b", "q"), ("a", "z")]
    assert list(main.columns) == ["axis", "value", "metric", "effect", "low", "high", "n"]


def test_main_effects_rank_within_metrics_in_their_order_nan_last():
    grid = _grid({"a": ["x", "y", "z"]}, {"a": "x"}, ["m_2", "m"])

    def m(a: str, s: int) -> float:
        return {"x": 1.0, "y": 1.1, "z": 0.5}[a] + 0.01 * s

    def m2(a: str, s: int) -> float | None:
        if a == "z":
            return math.nan
        return 2.0 + 1e-9 * (a == "y")  # within float rounding of the values: 0

    main = main_effects(grid, _values(grid, {"m": m, "m_2": m2}))
    assert list(zip(main["metric"], main["value"])) == [("m_2", "y"), ("m_2", "z"),
                                                        ("m", "z"), ("m", "y")]
    assert _row(main, "a", "y", "m_2") == (0.0, 0.0, 0.0, 3)
    nan = _row(main, "a", "z", "m_2")
    assert all(math.isnan(v) for v in nan[:3]) and nan[3] == 0
    assert _row(main, "a", "z", "m") == pytest.approx((-0.5, -0.5, -0.5, 3), abs=1e-9)
    grid.axes["a"] = ["x", "z", "y"]  # the NaN effect first: still after the zero one
    main = main_effects(grid, _values(grid, {"m_2": m2}))
    assert list(main["value"]) == ["y", "z"]


def test_a_difference_of_exactly_the_rounding_counts_as_zero():
    grid = _grid({"a": ["x", "y"], "b": ["p", "q"]}, {"a": "x", "b": "p"}, ["m"])
    # the values' mean magnitude is 1.0, so the rounding is 1e-6 exactly
    table = {("x", "p"): 0.0, ("y", "p"): 1e-6, ("x", "q"): 2.0 - 2.5e-6, ("y", "q"): 2.0 + 1.5e-6}
    main = main_effects(grid, _values(grid, {"m": lambda a, b, s: table[(a, b)]}, seeds=(0,)))
    # y - x: 1e-6 at p (at most the rounding: 0), 4e-6 at q (kept); averaged over b
    effect, low, high, n = _row(main, "a", "y", "m")
    assert effect == pytest.approx(2e-6, rel=1e-6) and n == 1
    assert math.isnan(low) and math.isnan(high)


def test_values_a_grid_lists_without_cells_are_skipped():
    grid = _grid({"a": ["x", "y"], "c": ["u", "v"]}, {"a": "x", "c": "u"}, ["m"])
    grid.axes["a"] = ["x", "y", "w"]  # w has no cell
    values = _values(grid, {"m": lambda a, c, s: {"x": 1.0, "y": 2.0}[a] + (c == "v")})
    main = main_effects(grid, values)
    assert sorted(zip(main["axis"], main["value"])) == [("a", "y"), ("c", "v")]
    no_base = values[values["c"] != "u"]  # c's baseline has no cell: nothing to pair with
    main = main_effects(grid, no_base)
    assert list(zip(main["axis"], main["value"])) == [("a", "y")]
    assert _row(main, "a", "y", "m") == pytest.approx((1.0, 1.0, 1.0, 3))


def test_seeds_of_other_runs_are_paired_apart():
    grid = _grid({"a": ["x", "y"]}, {"a": "x"}, ["m"])
    one = _values(grid, {"m": lambda a, s: 1.0 + (a == "y") * (0.5 + s)}, seeds=(0, 1))
    two = one.assign(run="r2", value=one["value"] + (one["variant"] == "y") * 1.0)
    main = main_effects(grid, pd.concat([one, two], ignore_index=True))
    # four (run, seed) pairs: 0.5, 1.5 in r; 1.5, 2.5 in r2
    assert _row(main, "a", "y", "m") == pytest.approx(_t_interval([0.5, 1.5, 1.5, 2.5], T3))


# --- top axes, interactions, cell means ------------------------------------------------------


def test_top_axes_rank_by_the_largest_effect_of_any_value():
    grid = _grid({"a": ["x", "y", "z"], "b": ["p", "q"], "c": ["u"], "d": ["s", "t"]},
                 {"a": "x", "b": "p", "c": "u", "d": "s"}, ["m"])
    effects = pd.DataFrame({"axis": ["a", "a", "b", "c", "b", "d"],
                            "value": ["y", "z", "q", "u", "q", "t"],
                            "metric": ["m", "m", "m", "m", "other", "a_metric"],
                            "effect": [0.1, -0.5, 0.3, 9.0, 7.0, 8.0]})
    assert top_axes(grid, effects, "m") == ["a", "b", "d"]
    assert top_axes(grid, effects, "m", k=2) == ["a", "b"]
    assert top_axes(grid, effects, "other", k=1) == ["b"]
    assert top_axes(grid, effects, "other", k=3) == ["b", "a", "d"]  # no effect: grid order
    # an axis without an effect comes after one whose effect is 0, wherever it is listed
    zero = pd.DataFrame({"axis": ["b"], "value": ["q"], "metric": ["m"], "effect": [0.0]})
    assert top_axes(grid, zero, "m") == ["b", "a", "d"]


def _junk(*_: object) -> float:
    return 50.0


def test_interactions_are_the_paired_contrast_per_seed():
    grid = _grid({"a": ["x", "y", "z"], "b": ["p", "q"]}, {"a": "x", "b": "p"}, ["m"])
    values = _values(grid, {"a_metric": _junk, "m": _value, "z_metric": _junk})
    pairs = interactions(grid, values, "m", ["a", "b"])
    assert list(pairs["axis"]) == ["a × b", "a × b"]
    assert list(pairs["value"]) == ["y × q", "z × q"]  # by |contrast|
    yq = [0.3 + 0.02 * s for s in SEEDS]
    assert _row(pairs, "a × b", "y × q", "m") == pytest.approx(_t_interval(yq, T2), rel=1e-9)
    assert _row(pairs, "a × b", "z × q", "m") == pytest.approx((-0.1, -0.1, -0.1, 3), abs=1e-9)
    assert not len(interactions(grid, _values(grid, {"m": _value}), "m", ["a"]))
    # baselines listed last: every other value pairs with them
    last = replace(grid, baseline={"a": "y", "b": "q"})
    pairs = interactions(last, values, "m", ["a", "b"])
    assert list(pairs["value"]) == ["z × p", "x × p"]
    zp = [0.4 + 0.02 * s for s in SEEDS]  # -I(z, q) + I(y, q)
    assert _row(pairs, "a × b", "z × p", "m") == pytest.approx(_t_interval(zp, T2), rel=1e-9)
    xp = [0.3 + 0.02 * s for s in SEEDS]  # I(y, q)
    assert _row(pairs, "a × b", "x × p", "m") == pytest.approx(_t_interval(xp, T2), rel=1e-9)
    # a cell with no finite value: its contrast is there, without a number
    # (listed first, ranked after the zero contrast)
    gaps = _values(grid, {"m": lambda a, b, s: math.nan if (a, b) == ("y", "q") else 1.0})
    pairs = interactions(grid, gaps, "m", ["a", "b"])
    assert list(pairs["value"]) == ["z × q", "y × q"]
    assert _row(pairs, "a × b", "z × q", "m") == (0.0, 0.0, 0.0, 3)
    nan = _row(pairs, "a × b", "y × q", "m")
    assert all(math.isnan(v) for v in nan[:3]) and nan[3] == 0


def test_interactions_of_three_axes_pair_over_the_third():
    axes = {"a": ["x", "y"], "b": ["p", "q"], "c": ["u", "v"]}
    grid = _grid(axes, {"a": "x", "b": "p", "c": "u"}, ["m"])

    def m(a: str, b: str, c: str, s: int) -> float:
        return 1.0 + 0.4 * (a == "y" and b == "q") * (1 + s) + 0.2 * (b == "q" and c == "v") \
            + 0.05 * s * (c == "v")

    pairs = interactions(grid, _values(grid, {"m": m}, seeds=(0, 1)), "m", ["a", "b", "c"])
    got = {(r.axis, r.value): (r.effect, r.n) for r in pairs.itertuples()}
    assert set(got) == {("a × b", "y × q"), ("a × c", "y × v"), ("b × c", "q × v")}
    assert got[("a × b", "y × q")] == pytest.approx((0.6, 2))  # 0.4 (1 + s): 0.4, 0.8
    assert got[("b × c", "q × v")] == pytest.approx((0.2, 2))
    assert got[("a × c", "y × v")] == pytest.approx((0.0, 2), abs=1e-12)
    assert list(pairs["axis"])[:2] == ["a × b", "b × c"]  # by |contrast|


def test_cell_means_are_over_seeds_and_other_axes_in_grid_order():
    grid = _grid({"a": ["z", "x"], "b": ["q", "p"], "c": ["u", "v"]},
                 {"a": "z", "b": "q", "c": "u"}, ["m"])

    def m(a: str, b: str, c: str, s: int) -> float:
        return {"x": 1.0, "z": 3.0}[a] + {"p": 0.0, "q": 10.0}[b] + (c == "v") + s

    table = cell_means(grid, _values(grid, {"a_metric": _junk, "m": m, "other": _junk}), "m",
                       "a", "b")
    assert list(table.index) == ["z", "x"] and list(table.columns) == ["q", "p"]
    # mean over c (0 or 1) and seeds 0..2: +0.5 + 1
    assert table.loc["z", "q"] == pytest.approx(14.5) and table.loc["x", "p"] == pytest.approx(2.5)
    assert table.loc["x", "q"] == pytest.approx(12.5) and table.loc["z", "p"] == pytest.approx(4.5)


# --- the grid of a report, its values and effects.csv ----------------------------------------


def _data(grid: dict, overrides: list, baseline: str = "", runs: list | None = None,
          compare_on: str = "", roles: dict | None = None,
          names: list[str] | None = None) -> ReportData:
    meta = RunMeta(experiment="e", run="r", grid=grid, seeds=[0, 1], compare_on=compare_on,
                   roles=roles)
    names = names or [f"v{i}" for i in range(len(overrides))]
    variants = pd.DataFrame({"run": "r", "variant": names, "overrides": overrides,
                             "spec": [{}] * len(names)})
    others = [RunMeta(experiment=r, run=r) for r in (runs or [])]
    return ReportData(runs=[*others, meta], variants=variants, units=pd.DataFrame(),
                      rows=pd.DataFrame(), baseline=baseline)


GRID = {"norm.kind": ["layer", "rms"], "emb_dim": [32, 64]}
CELLS = [{"norm.kind": n, "emb_dim": e} for n in ("layer", "rms") for e in (32, 64)]


def test_the_grid_is_its_runs_cells_with_the_baseline_and_roles():
    overs = [*CELLS, {"norm.kind": "rms"}, "not a mapping", {"norm.kind": "batch", "emb_dim": 32},
             {"norm.kind": "rms", "emb_dim": 64}]  # v4..v7: a subset, junk, off-grid, a repeat
    grid = find_grid(_data(GRID, overs, baseline="v3", runs=["other"]))
    assert grid is not None and grid.run == "r"
    assert grid.axes == {"norm.kind": ["layer", "rms"], "emb_dim": ["32", "64"]}
    assert list(grid.cells["variant"]) == ["v0", "v1", "v2", "v3"]
    assert list(grid.cells.columns) == ["variant", "run", "norm.kind", "emb_dim"]
    assert list(grid.cells["emb_dim"]) == ["32", "64", "32", "64"]
    assert grid.baseline == {"norm.kind": "rms", "emb_dim": "64"}  # v3's values
    assert grid.roles == {"norm.kind": "compared", "emb_dim": "condition"}
    assert find_grid(_data(GRID, overs)).baseline == {"norm.kind": "layer", "emb_dim": "32"}
    # the baseline variant by its name, wherever the names sort
    named = find_grid(_data(GRID, CELLS, baseline="mid", names=["zeta", "alpha", "mid", "beta"]))
    assert named is not None and named.baseline == {"norm.kind": "rms", "emb_dim": "32"}
    tuned = find_grid(_data(GRID, CELLS, roles={"norm.kind": "tuned"}))
    assert tuned is not None and tuned.roles == {"norm.kind": "tuned", "emb_dim": "condition"}


def test_no_grid_without_a_grid_or_a_variant_in_it():
    assert find_grid(_data({}, CELLS)) is None
    assert find_grid(_data(GRID, [{"norm.kind": "batch", "emb_dim": 32}, {}])) is None


def _per_seed(rows: list[tuple[str, int, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["variant", "seed", "metric", "value"])


def test_grid_values_keep_the_grids_variants_and_headline_metrics():
    data = _data(GRID, CELLS)
    grid = find_grid(data)
    assert grid is not None
    per_seed = _per_seed([("v0", 0, "eval_loss", 3.0), ("v1", 0, "eval_loss", 2.5),
                          ("v0", 0, "total", 10.0), ("v0", 0, "odd_metric", 1.0),
                          ("other", 0, "eval_loss", 9.0)])
    values = grid_values(data, grid, per_seed)
    assert sorted(zip(values["variant"], values["metric"], values["value"])) == [
        ("v0", "eval_loss", 3.0), ("v0", "total", 10.0), ("v1", "eval_loss", 2.5)]
    assert set(values.columns) == {"variant", "seed", "metric", "value", "run", "norm.kind",
                                   "emb_dim"}
    assert grid.metrics == [("eval_loss", "eval loss", True), ("total", "parameters", None)]


def test_the_effects_lead_with_the_runs_headline_test_column():
    data = _data(GRID, CELLS, compare_on="recall_accuracy")
    grid = find_grid(data)
    assert grid is not None
    got = lead_with(data, grid, {"recall_accuracy", "eval_loss"})
    assert got == [("recall_accuracy", "recall accuracy", False), *HEADLINE]
    got = lead_with(data, grid, {"test_recall_accuracy", "recall_accuracy"})
    assert got[0] == ("test_recall_accuracy", "test recall accuracy", False)
    assert lead_with(data, grid, {"eval_loss"}) == list(HEADLINE)  # no recall column
    # a tuned sweep scores its test split at the chosen settings only: the validation
    # column, which every setting has, leads; a test column present everywhere still wins
    got = lead_with(data, grid, {"val_recall_accuracy", "eval_loss"})
    assert got == [("val_recall_accuracy", "val recall accuracy", False), *HEADLINE]
    got = lead_with(data, grid, {"val_recall_accuracy", "test_recall_accuracy"})
    assert got[0] == ("test_recall_accuracy", "test recall accuracy", False)
    loss = _data(GRID, CELLS, compare_on="loss")
    got = lead_with(loss, grid, {"eval_loss", "final_loss"})
    assert got[0] == ("eval_loss", "eval loss", True) and got[1:] == [
        h for h in HEADLINE if h[0] != "eval_loss"]
    assert lead_with(_data(GRID, CELLS), grid, {"test_loss"}) == list(HEADLINE)  # no compare_on
    grid.run = "elsewhere"
    assert lead_with(data, grid, {"recall_accuracy"}) == list(HEADLINE)


def test_compute_effects_picks_the_first_moved_metric_and_its_top_axes():
    data = _data(GRID, CELLS, runs=["before"])
    # eval loss: norm rms -0.2 (seeds 0, 1), emb_dim 64 -0.05; total: emb_dim 64 doubles it
    loss = {("layer", 32): 3.0, ("layer", 64): 2.95, ("rms", 32): 2.8, ("rms", 64): 2.75}
    rows = []
    for i, c in enumerate(CELLS):
        for s in (0, 1):
            rows.append((f"v{i}", s, "eval_loss", loss[(c["norm.kind"], c["emb_dim"])] + 0.1 * s))
            rows.append((f"v{i}", s, "total", 1000.0 * c["emb_dim"]))
    effects = compute_effects(data, _per_seed(rows))
    assert isinstance(effects, Effects) and effects.several_runs
    assert effects.primary == "eval_loss" and effects.top == ["norm.kind", "emb_dim"]
    assert _row(effects.main, "norm.kind", "rms", "eval_loss")[:1] == pytest.approx((-0.2,))
    assert _row(effects.main, "emb_dim", "64", "total") == pytest.approx(
        (32000.0, 32000.0, 32000.0, 2))
    assert list(effects.pairs["value"]) == ["rms × 64"]
    assert _row(effects.pairs, "norm.kind × emb_dim", "rms × 64", "eval_loss")[0] == \
        pytest.approx(0.0, abs=1e-12)
    both = effects.csv_frame()
    assert len(both) == len(effects.main) + 1 and list(both.index) == list(range(len(both)))
    assert list(both["axis"])[-1] == "norm.kind × emb_dim"
    # a grid whose headline does not move: the first metric that does leads
    flat = [(v, s, "eval_loss", 3.0) if m == "eval_loss" else (v, s, m, x)
            for v, s, m, x in rows]
    moved = compute_effects(_data(GRID, CELLS), _per_seed(flat))
    assert moved is not None and moved.primary == "total" and moved.top == ["emb_dim",
                                                                            "norm.kind"]
    assert not moved.several_runs
    # a headline whose effects have no number has not moved either
    gaps = [(v, s, m, math.nan if m == "eval_loss" and v != "v0" else x) for v, s, m, x in rows]
    moved = compute_effects(_data(GRID, CELLS), _per_seed(gaps))
    assert moved is not None and moved.primary == "total"
    assert math.isnan(_row(moved.main, "norm.kind", "rms", "eval_loss")[0])
    still = [(v, s, m, 1.0) for v, s, m, _ in rows]
    nothing = compute_effects(_data(GRID, CELLS), _per_seed(still))
    assert nothing is not None and nothing.primary == "eval_loss"


def test_no_effects_without_a_grid_numbers_or_a_second_value():
    rows = _per_seed([("v0", 0, "eval_loss", 3.0)])
    assert compute_effects(_data({}, CELLS), rows) is None
    assert compute_effects(_data(GRID, CELLS), _per_seed([("v0", 0, "odd", 1.0)])) is None
    single = {"norm.kind": ["layer"], "emb_dim": [32]}
    data = _data(single, [{"norm.kind": "layer", "emb_dim": 32}])
    assert compute_effects(data, rows) is None


def test_effects_csv_lists_main_effects_then_interactions_with_roles():
    assert effects_csv(None) == "axis,value,metric,effect,low,high,n,role\n"
    data = _data(GRID, CELLS)
    rows = [(f"v{i}", s, "eval_loss", 3.0 - 0.5 * (c["norm.kind"] == "rms") - 0.25 * s
             - 0.125 * (c["emb_dim"] == 64))
            for i, c in enumerate(CELLS) for s in (0, 1)]
    effects = compute_effects(data, _per_seed(rows))
    assert effects is not None
    assert effects_csv(effects).splitlines() == [
        "axis,value,metric,effect,low,high,n,role",
        "norm.kind,rms,eval_loss,-0.5,-0.5,-0.5,2,compared",
        "emb_dim,64,eval_loss,-0.125,-0.125,-0.125,2,condition",
        "norm.kind × emb_dim,rms × 64,eval_loss,0,0,0,2,compared × condition",
    ]


def test_effects_are_of_one_run_unless_told():
    grid = _grid({"a": ["x", "y"]}, {"a": "x"}, ["m"])
    empty = pd.DataFrame(columns=["axis", "value", "metric", "effect", "low", "high", "n"])
    assert Effects(grid, empty, empty, "m", [], pd.DataFrame()).several_runs is False


def test_label_of_names_headline_metrics_and_keeps_others():
    assert label_of("backward_median_s") == "forward+backward time (ms)"
    assert label_of("grad_norm_ratio.all") == "last/first grad norm"
    assert label_of("my_metric") == "my_metric"


# --- survivors of the first mutation run (docs/mutation.md) ----------------------------------


def test_headline_directions_are_the_metrics_own():
    from variantlab.config.metrics import direction

    want = {"lower": True, "higher": False, None: None}
    assert [(m, lower) for m, _, lower in HEADLINE] == [(m, want[direction(m)])
                                                       for m, _, _ in HEADLINE]


def test_interactions_are_among_the_three_top_axes():
    grid4 = {f"ax{i}": ["a", "b"] for i in range(4)}
    cells = [dict(zip(grid4, c)) for c in itertools.product(*grid4.values())]
    rows = [(f"v{i}", s, "eval_loss", 3.0 + sum((c[f"ax{k}"] == "b") * 0.1 * (k + 1)
                                                for k in range(4)) + 0.01 * s)
            for i, c in enumerate(cells) for s in (0, 1)]
    effects = compute_effects(_data(grid4, cells), _per_seed(rows))
    assert effects is not None and effects.top == ["ax3", "ax2", "ax1"]
    assert sorted(effects.pairs["axis"]) == ["ax2 × ax1", "ax3 × ax1", "ax3 × ax2"]


NAMED_YAML = "grid:\n  norm.kind: {pre: layer, root: rms}\n  emb_dim: [32, 64]\n"


def _named(first: str) -> ReportData:
    """Run ``r`` (named norm values, compare_on recall accuracy) after a run ``first``
    without a grid whose variants set the same overrides, and one more path."""
    data = _data(GRID, CELLS, compare_on="recall_accuracy")
    data.runs[-1] = replace(data.runs[-1], yaml=NAMED_YAML)
    data.runs.insert(0, RunMeta(experiment=first, run=first, roles={"emb_dim": "compared"}))
    old = pd.DataFrame({"run": first, "variant": ["old0", "old1", "old2"],
                        "overrides": [CELLS[3], CELLS[0], {"drop_rate": 0.1}],
                        "spec": [{}, {}, {}]})
    data.variants = pd.concat([old, data.variants], ignore_index=True)
    return data


@pytest.mark.parametrize("first", ["a", "zzz"])
def test_the_grid_reads_its_own_runs_labels_and_variants_only(first):
    grid = find_grid(_named(first))
    assert grid is not None and grid.run == "r"
    assert grid.axes["norm.kind"] == ["pre", "root"]
    assert list(grid.cells["variant"]) == ["v0", "v1", "v2", "v3"]
    assert set(grid.cells["run"]) == {"r"}
    assert grid.roles == {"norm.kind": "compared", "emb_dim": "condition"}  # not drop_rate
    data = _named(first)
    assert lead_with(data, grid, {"recall_accuracy"})[0] == ("recall_accuracy",
                                                             "recall accuracy", False)


def test_variants_that_set_more_or_fewer_axes_than_the_grid_are_not_cells():
    overs = [{"norm.kind": "rms", "emb_dim": 32, "drop_rate": 0.1}, {"norm.kind": "rms"},
             "junk", *CELLS]
    grid = find_grid(_data(GRID, overs))
    assert grid is not None and list(grid.cells["variant"]) == ["v3", "v4", "v5", "v6"]
