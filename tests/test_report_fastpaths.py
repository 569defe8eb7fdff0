"""The report's vectorised paths (issue 26.2) equal plain-Python references: the summary
over seeds (NaN counts included), the stack split of layer names and each row's
invocation; the main effects (one groupby per metric); log axes label their ticks in
plain text (no mathtext)."""

from __future__ import annotations

import math
import statistics

import matplotlib
import numpy as np
import pandas as pd
import pytest

from variantlab.report.frame import _invocations, gather, split_stacks
from variantlab.report.plots import log_scale, new_axes, to_svg
from variantlab.report.tables import seed_metrics, summarize
from variantlab.testing.sample import sample_run


def _reference_summary(per_seed: pd.DataFrame) -> dict:
    """(variant, metric) -> (mean, std, min, max, n, nan) by loops over the rows."""
    groups: dict = {}
    for rec in per_seed.to_dict("records"):
        groups.setdefault((rec["variant"], rec["metric"]), []).append(rec["value"])
    out = {}
    for key, values in groups.items():
        finite = [v for v in values if not math.isnan(v)]
        std = statistics.stdev(finite) if len(finite) > 1 else math.nan
        out[key] = (statistics.fmean(finite) if finite else math.nan, std,
                    min(finite) if finite else math.nan, max(finite) if finite else math.nan,
                    len(finite), len(values) - len(finite))
    return out


def test_summary_equals_a_loop_over_the_seeds_nan_counted():
    run = sample_run(seeds=(0, 1, 2))
    rows = run.rows
    hit = (rows["probe"] == "training") & (rows["metric"] == "final_loss") & (rows["seed"] == 1)
    rows.loc[hit, "value"] = math.nan  # a NaN seed in every variant's final loss
    data = gather([run])
    per_seed = seed_metrics(data)
    assert per_seed["value"].isna().any()
    got = summarize(data, per_seed)
    want = _reference_summary(per_seed)
    assert len(got) == len(want)
    for rec in got.to_dict("records"):
        ref = want[(rec["variant"], rec["metric"])]
        values = (rec["mean"], rec["spread"], rec["min"], rec["max"], rec["n"], rec["nan"])
        assert values == pytest.approx(ref, nan_ok=True), (rec["variant"], rec["metric"])
    assert (got["nan"] > 0).any() and got["nan"].dtype.kind == "i"


def test_stack_split_equals_the_loop():
    rows = pd.DataFrame({"scope": ["layer", "layer", "model", "layer", "slot", "layer"],
                         "name": ["encoder/attention", "all", "a/b", None, "x/y",
                                  "decoder/ffn/up"]})
    stacks, names = [], []
    for scope, name in zip(rows["scope"], rows["name"]):
        name = "" if name is None or (isinstance(name, float) and math.isnan(name)) else name
        stack, rest = name.split("/", 1) if scope == "layer" and "/" in name else ("", name)
        stacks.append(stack)
        names.append(rest)
    assert split_stacks(rows) == (stacks, names)
    assert split_stacks(rows.iloc[0:0]) == ([], [])


def test_invocations_equal_the_loop():
    units = pd.DataFrame({"key": ["a", "b", "c"], "invocation": ["2025-1", None, np.nan]})
    rows = pd.DataFrame({"unit_key": ["a", "b", "c", "d", "a"]})
    assert _invocations(rows, units) == ["2025-1", None, None, None, "2025-1"]


def test_log_axes_label_in_plain_text():
    fig, (ax,) = new_axes()
    ax.plot([1, 2, 3], [1e-3, 1e-1, 10.0])
    log_scale(ax, "y")
    svg = to_svg(fig)
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ax.get_yscale() == "log" and labels
    assert not any("$" in t for t in labels) and {"1", "10"} <= set(labels)
    assert "<svg" in svg
    assert matplotlib.get_backend().lower() == "agg"


def _reference_main_effects(effects) -> dict:
    """(axis, value, metric) -> (effect, low, high, n) by loops over the grid's cell values:
    per (run, seed, other axes' values) the mean of each axis value's cell, paired with the
    baseline value's; differences within float rounding count as 0; averaged per seed."""
    from variantlab.report.effects import ROUNDING, interval

    grid, out = effects.grid, {}
    for metric, _, _ in grid.metrics:
        recs = [r for r in effects.values.to_dict("records") if r["metric"] == metric]
        tol = ROUNDING * statistics.fmean(abs(r["value"]) for r in recs
                                          if not math.isnan(r["value"]))
        for axis, vals in grid.axes.items():
            cells: dict = {}
            for r in recs:
                key = (r["run"], r["seed"], *(r[a] for a in grid.axes if a != axis))
                cells.setdefault(key, {}).setdefault(r[axis], []).append(r["value"])

            def mean(values: list) -> float:
                finite = [v for v in values if not math.isnan(v)]
                return statistics.fmean(finite) if finite else math.nan

            base = grid.baseline[axis]
            for value in vals:
                if value == base:
                    continue
                per_seed: dict = {}
                for key, by_value in cells.items():
                    if value in by_value and base in by_value:
                        d = mean(by_value[value]) - mean(by_value[base])
                        if not math.isnan(d):
                            per_seed.setdefault(key[:2], []).append(d if abs(d) > tol else 0.0)
                seeds = pd.Series([statistics.fmean(ds) for ds in per_seed.values()],
                                  dtype=float)
                out[(axis, value, metric)] = interval(seeds)
    return out


def test_main_effects_equal_the_loop_over_cells():
    from variantlab.report.effects import compute_effects
    from variantlab.testing.sample import sample_grid

    run = sample_grid({"norm.kind": ["layer", "rms", "batch"], "emb_dim": [32, 64]},
                      {("norm.kind", "rms"): 0.2, ("emb_dim", 64): -0.1}, seeds=(0, 1, 2))
    rows = run.rows.copy()
    rng = np.random.default_rng(0)
    rows["value"] = rows["value"] + rng.normal(0, 0.01, len(rows))  # seeds differ
    one = rows["variant"] == rows["variant"].iloc[-1]
    rows.loc[one & (rows["seed"] == 1), "value"] = math.nan  # a NaN cell
    run.rows = rows[~(one & (rows["seed"] == 2))]  # a missing cell
    data = gather([run])
    effects = compute_effects(data, seed_metrics(data))
    assert effects is not None
    got = {(r.axis, r.value, r.metric): (r.effect, r.low, r.high, r.n)
           for r in effects.main.itertuples()}
    want = _reference_main_effects(effects)
    assert set(got) == set(want) and len(got) >= 6
    for key, (effect, low, high, n) in want.items():
        assert got[key][3] == n, key
        assert got[key][:3] == pytest.approx((effect, low, high), rel=1e-9, nan_ok=True), key
