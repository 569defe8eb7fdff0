"""The report's vectorised paths (issue 26.2) equal plain-Python references: the summary
over seeds (NaN counts included), the stack split of layer names and each row's
invocation; log axes label their ticks in plain text (no mathtext)."""

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
