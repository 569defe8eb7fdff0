"""Issue 37 item 7: the numbers the dynamics reading and the findings rows quote (the largest
attention logit and its growth, the last layer's residual RMS, the first token's and the
sink's share, the load imbalance) are lines of the summary, so summary.csv holds them with
their per-seed range; checked on hand-made rows against hand-computed values."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from variantlab.report.builtin.dynamics_summary import dynamics_metrics
from variantlab.report.builtin.timing import metrics as timing_metrics
from variantlab.report.builtin.timing import speedups
from variantlab.report.frame import ReportData
from variantlab.report.tables import summarize, summary_csv


def layer_rows(variant: str, seed: int, metric: str, values: dict[tuple[int, int], float]):
    return [{"variant": variant, "seed": seed, "probe": "dynamics", "metric": metric,
             "scope": "layer", "name": "", "layer": layer, "step": step, "value": v}
            for (step, layer), v in values.items()]


def data(rows: list[dict]) -> ReportData:
    return ReportData(runs=[], variants=pd.DataFrame(), units=pd.DataFrame(),
                      rows=pd.DataFrame(rows), baseline="a", order=["a", "b"])


def sample() -> ReportData:
    rows = []
    for seed, (end, imbalance) in enumerate([(250.0, 2.5), (125.0, 3.0), (62.5, 2.0)]):
        # a: largest logit 2 at step 0 (layer 0), `end` at step 10; b: 4 -> 5 on each seed
        rows += layer_rows("a", seed, "max_attn_logit",
                           {(0, 0): 2.0, (0, 1): 1.0, (10, 0): end, (10, 1): end / 2})
        rows += layer_rows("b", seed, "max_attn_logit",
                           {(0, 0): 2.0, (0, 1): 4.0, (10, 0): 5.0, (10, 1): 3.0})
        # residual RMS: layer 0 and layer 1 (the last) at steps 0 and 10
        rows += layer_rows("a", seed, "residual_rms",
                           {(0, 0): 1.0, (0, 1): 1.5, (10, 0): 2.0, (10, 1): 10.0 * (seed + 1)})
        rows += layer_rows("b", seed, "residual_rms",
                           {(0, 0): 1.0, (0, 1): 1.2, (10, 0): 1.0, (10, 1): 1.5})
        # first-token share: mean over the two layers at the last step only
        rows += layer_rows("a", seed, "first_token_mass",
                           {(0, 0): 0.9, (0, 1): 0.9, (10, 0): 0.1, (10, 1): 0.2})
        # load imbalance per routed layer at step 10: (imbalance, imbalance + 1)
        rows += layer_rows("b", seed, "load_imbalance",
                           {(0, 0): 8.0, (10, 0): imbalance, (10, 1): imbalance + 1})
    return data(rows)


def values(frame: pd.DataFrame, variant: str, metric: str) -> list[float]:
    mine = frame[(frame["variant"] == variant) & (frame["metric"] == metric)]
    return mine.sort_values("seed")["value"].tolist()


def test_each_quantity_has_one_value_per_variant_and_seed():
    per_seed = dynamics_metrics(sample())
    assert values(per_seed, "a", "first_max_attn_logit") == [2.0, 2.0, 2.0]
    assert values(per_seed, "a", "final_max_attn_logit") == [250.0, 125.0, 62.5]
    assert values(per_seed, "a", "max_attn_logit_growth") == [125.0, 62.5, 31.25]
    assert values(per_seed, "b", "max_attn_logit_growth") == [1.25, 1.25, 1.25]
    assert values(per_seed, "a", "first_residual_rms") == [1.5, 1.5, 1.5]
    assert values(per_seed, "a", "final_residual_rms") == [10.0, 20.0, 30.0]
    assert values(per_seed, "a", "residual_rms_depth_ratio") == [5.0, 10.0, 15.0]
    assert values(per_seed, "b", "residual_rms_depth_ratio") == [1.5, 1.5, 1.5]
    assert values(per_seed, "a", "final_first_token_mass") == pytest.approx([0.15] * 3)
    assert values(per_seed, "b", "final_first_token_mass") == []  # not recorded
    assert values(per_seed, "b", "dynamics.final_load_imbalance") == [3.0, 3.5, 2.5]
    assert set(per_seed["section"]) == {"dynamics"}


def test_summary_csv_holds_the_mean_and_the_per_seed_range():
    d = sample()
    summary = summarize(d, dynamics_metrics(d))
    csv = pd.read_csv(io.StringIO(summary_csv(summary)))
    line = csv[(csv["variant"] == "b") & (csv["metric"] == "dynamics.final_load_imbalance")]
    assert line[["mean", "min", "max", "n"]].values.tolist() == [[3.0, 2.5, 3.5, 3]]
    growth = csv[(csv["variant"] == "a") & (csv["metric"] == "max_attn_logit_growth")]
    assert growth[["min", "max"]].values.tolist() == [[31.25, 125.0]]
    # the ratio column: b's depth ratio over a's baseline mean of 10
    depth = csv[(csv["variant"] == "b") & (csv["metric"] == "residual_rms_depth_ratio")]
    assert depth["ratio"].tolist() == [0.15]


def test_no_dynamics_rows_no_lines():
    rows = [{"variant": "a", "seed": 0, "probe": "training", "metric": "eval_loss",
             "scope": "model", "name": "", "layer": None, "step": None, "value": 2.0}]
    assert dynamics_metrics(data(rows)).empty


def test_timing_speed_ups_over_the_baseline_are_per_seed_lines():
    rows = [{"variant": v, "seed": s, "probe": "timing", "metric": "backward_median_s",
             "scope": "model", "name": "", "layer": None, "step": None, "value": t}
            for v, times in (("a", [0.2, 0.3, 0.4]), ("b", [0.1, 0.2, 0.5]))
            for s, t in enumerate(times)]
    d = data(rows)
    per_seed = speedups(d, "backward")
    assert per_seed.sort_values("seed")["value"].tolist() == [2.0, 1.5, 0.8]
    assert set(per_seed["variant"]) == {"b"}  # the baseline has no speed-up over itself
    summary = summarize(d, timing_metrics(d))
    line = summary[summary["metric"] == "backward_speedup"]
    assert line[["variant", "min", "max", "n"]].values.tolist() == [["b", 0.8, 2.0, 3]]
    assert line["ratio"].isna().all()  # a speed-up is already a ratio to the baseline
