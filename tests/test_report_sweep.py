"""Reports of sweeps: effects of each axis with intervals, a short reading, plots and tables
that stay readable at hundreds of variants, runs side by side."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest
import yaml
from conftest import TINY, store_of

import variantlab as vl
from variantlab.report import build_context, gather, write_report
from variantlab.report.effects import find_grid, interval, run_grid, t975
from variantlab.testing.sample import sample_grid, sample_run

REG = vl.get_registry()


def _effects(path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


@pytest.mark.slow
def test_effects_rank_the_axis_that_matters_over_the_one_that_does_not(tmp_path):
    """What it must show 1: shortcut on/off moves eval loss; naive vs sdpa attention
    computes the same numbers (up to float rounding), so its effect is 0."""
    from variantlab.config.experiment import experiment_from_text
    from variantlab.executors.runner import run_experiment

    doc = {"name": "sweep", "seeds": [0, 1, 2],
           "model": {**TINY, "vocab_size": 256, "attention": {"kind": "mha", "impl": "naive"}},
           "grid": {"residual.shortcut": [True, False], "attention.impl": ["naive", "sdpa"]},
           "data": {"source": "stdlib", "max_files": 5},
           "measure": {"training": {"steps": 30, "lr": 3e-3, "batch_size": 8, "seq_len": 32}}}
    exp = experiment_from_text(yaml.safe_dump(doc), "sweep.yaml", base_dir=tmp_path)
    run_dir = run_experiment(exp, tmp_path / "runs").run_dir
    files = write_report([run_dir], tmp_path / "report", registry=REG)
    eff = _effects(files.effects)
    loss = eff[eff["metric"] == "eval_loss"].reset_index(drop=True)
    assert list(loss["axis"]) == ["residual.shortcut", "attention.impl"], eff.to_string()
    # the interaction is given on the headline metric (test loss), where it is exactly 0:
    # sdpa changes nothing, with or without the shortcut
    inter = eff[eff["axis"] == "residual.shortcut × attention.impl"]
    assert list(inter["metric"]) == ["test_loss"] and (inter["effect"] == 0).all()
    top, none = loss.iloc[0], loss.iloc[1]
    assert top["value"] == "false" and top["n"] == 3  # 3 seeds (each averages 2 impls)
    assert top["effect"] > 0.05 and top["low"] > 0  # without the shortcut: worse, surely
    assert none["value"] == "sdpa" and none["effect"] == 0
    assert none["low"] <= 0 <= none["high"]
    reading = build_context(gather([run_dir]), registry=REG)[0]["reading"]
    # the averages come from the claims' average rows, on the headline (test loss)
    assert any(line.startswith("Averaged over the grid's other axes (on test_loss;")
               and "residual.shortcut=false higher than residual.shortcut=true" in line
               and line.endswith("not clearly different from the baseline value: "
                                 "attention.impl.") for line in reading), reading
    assert not any("matters" in line for line in reading)


def test_main_effects_are_paired_differences_with_t_intervals():
    shifts = {("a", 1): 0.5, ("a", 2): -0.25, ("b", "y"): 0.1}
    run = sample_grid({"a": [0, 1, 2], "b": ["x", "y"]}, shifts, seeds=(0, 1, 2))
    noisy = run.rows["metric"].eq("eval_loss") & run.rows["variant"].eq("a=1,b=y")
    run.rows.loc[noisy, "value"] += 0.03 * run.rows.loc[noisy, "seed"].astype(float)
    context, _ = build_context(gather([run]), registry=REG)
    main = context["effects_frame"].main
    loss = main[main["metric"] == "eval_loss"].set_index(["axis", "value"])
    # a=1 vs a=0: 0.5 in every pair but those of b=y, where seed s adds 0.03 s; the pairs
    # of a seed are averaged over b first (0.5 + 0.015 s), then the interval is over seeds
    mean, low, high, n = interval(pd.Series([0.5, 0.515, 0.53]))
    assert n == 3 and loss.loc[("a", "1"), "n"] == 3
    assert loss.loc[("a", "1"), "effect"] == pytest.approx(mean) == pytest.approx(0.515)
    assert loss.loc[("a", "1"), "low"] == pytest.approx(low)
    assert loss.loc[("a", "1"), "high"] == pytest.approx(high)
    assert loss.loc[("a", "2"), "effect"] == pytest.approx(-0.25)
    assert loss.loc[("a", "2"), "low"] == pytest.approx(-0.25)  # the same in every pair
    assert loss.loc[("b", "y"), "n"] == 3  # seeds, not the 9 pairs
    assert list(loss.index.get_level_values("axis"))[0] == "a"  # the largest effect first
    assert ("b", "x") not in loss.index  # the baseline value has no effect row


def test_interval_and_t_quantiles():
    mean, low, high, n = interval(pd.Series([1.0, 2.0, 3.0]))
    assert (mean, n) == (2.0, 3)
    assert high - mean == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert interval(pd.Series([0.3, 0.3])) == (0.3, 0.3, 0.3, 2)
    one = interval(pd.Series([0.7]))
    assert one[0] == 0.7 and math.isnan(one[1]) and one[3] == 1
    assert t975(1) == pytest.approx(12.7062047, abs=1e-6)
    assert t975(30) == pytest.approx(2.0422725, abs=1e-6)
    assert t975(40) == pytest.approx(2.0210754, abs=1e-6)
    assert t975(120) == pytest.approx(1.9799304, abs=1e-6)


def test_interactions_find_an_effect_that_depends_on_another_axis():
    run = sample_grid({"a": [0, 1], "b": [0, 1], "c": [0, 1]}, {("a", 1): 1.0}, seeds=(0, 1))
    both = run.rows["variant"].str.contains("a=1,b=1") & run.rows["metric"].eq("eval_loss")
    run.rows.loc[both, "value"] += 2.0  # a's effect is 2.0 larger where b=1
    effects = build_context(gather([run]), registry=REG)[0]["effects_frame"]
    pair = effects.pairs.set_index("axis")
    assert pair.loc["a × b", "effect"] == pytest.approx(2.0)
    assert pair.loc["a × b", "low"] == pytest.approx(2.0)
    assert effects.top[0] == "a" and set(effects.top) == {"a", "b", "c"}


def test_grid_comes_from_the_stored_yaml_when_the_meta_has_none(tmp_path):
    run = sample_grid({"norm.kind": ["layer", "rms"]}, {("norm.kind", "rms"): -0.5})
    grid = run.meta.grid
    run.meta = replace(run.meta, grid=None)
    assert find_grid(gather([run])) is None
    run.meta = replace(run.meta, yaml=yaml.safe_dump({"name": "g", "grid": grid}))
    assert run_grid(run.meta) == {"norm.kind": ["layer", "rms"]}
    store = store_of(run, tmp_path / "g")
    effects = _effects(write_report([store], tmp_path / "r", registry=REG).effects)
    row = effects[(effects["metric"] == "eval_loss")].iloc[0]
    assert (row["axis"], row["value"]) == ("norm.kind", "rms")


def test_named_variants_keep_the_per_variant_reading(tmp_path):
    files = write_report([sample_run()], tmp_path, registry=REG)
    assert files.effects.read_text() == "axis,value,metric,effect,low,high,n,role\n"
    md = files.markdown.read_text()
    assert "## Effects of each axis" not in md
    assert "pre\\_norm lower than post\\_norm (-0.09 \\[-0.09, -0.09\\])" in md


def test_reading_stays_short_on_a_large_grid():
    grid = {"a": [0, 1, 2, 3], "b": ["x", "y", "z"], "c": [True, False], "d": [1, 2, 3, 4],
            "e": ["p", "q", "r"], "f": [0.1, 0.2]}  # 576 variants
    run = sample_grid(grid, {("c", False): 1.0}, seeds=(0,))
    warned = run.variants.index[:40]
    run.variants.loc[warned, "warnings"] = pd.Series([["attention: odd head size"]] * 40,
                                                     index=warned, dtype=object)
    context, plots = build_context(gather([run]), registry=REG)
    reading = context["reading"]
    assert len(reading) <= 10
    assert sum(len(line) for line in reading) < 3000
    assert any("Spec warnings: attention: odd head size (40: " in line and "and 38 more" in line
               for line in reading)
    # 575 pairs, each against the baseline (too many variants for all pairs), one seed each
    assert reading[0] == ("A fixed synthetic run for tests. Answer: On eval_loss, each variant "
                          "against the baseline (more than 24 compared) (a minus b, 95% "
                          "interval; Holm over all pairs): 575 pairs not estimated (one seed or "
                          "no paired seeds).")
    assert reading[2] == ("Averaged over the grid's other axes (on eval_loss; averages, not "
                          "verdicts on one combination): one seed, so no interval: a, b, c, d.")
    # per-variant plots draw the baseline and the extremes, not 576 lines
    gradients = next(p for p in plots if p.key == "gradients")
    assert len(gradients.figure.legends[0].get_texts()) <= 7
    assert "Of 576 variants" in gradients.caption
    heatmaps = [p for p in plots if p.key.startswith("heatmap")]
    assert len(heatmaps) == 3 and heatmaps[0].title.startswith("eval loss: c × ")
    # the HTML variant table has the axes (filterable) and the headline metrics
    browse = context["browse"]
    assert len(browse.rows) == 576 and "eval loss" in browse.columns
    assert [browse.columns[i] for i in browse.filters] == ["a", "b", "c", "d", "e", "f"]


def test_the_same_variant_in_two_runs_is_shown_side_by_side(tmp_path):
    before = store_of(sample_run(fail=None, diverge=None), tmp_path / "before" / "sample")
    after_run = sample_run(fail=None, diverge=None)
    slower = (after_run.rows["metric"] == "eval_loss") & (after_run.rows["variant"] == "batch")
    after_run.rows.loc[slower, "value"] += 0.5
    after = store_of(after_run, tmp_path / "after" / "sample")
    context, _ = build_context(gather([before, after]), registry=REG)
    across = context["across"]
    assert across.columns == ["variant", "metric", "before/sample", "after/sample",
                              "after/sample − before/sample"]
    rows = {(r[0], r[1]): r for r in across.rows}
    assert rows[("batch", "eval loss")][-1] == "+0.5"
    assert rows[("pre_norm", "eval loss")][-1] == "0"
    files = write_report([before, after], tmp_path / "r", registry=REG)
    assert "## Across runs" in files.markdown.read_text()


def test_effects_of_two_runs_come_from_one_run_only(tmp_path):
    grid = {"a": [0, 1], "b": [0, 1]}
    first = store_of(sample_grid(grid, {("a", 1): 1.0}), tmp_path / "x" / "g")
    second = store_of(sample_grid(grid, {("a", 1): 5.0}), tmp_path / "y" / "g")
    context, _ = build_context(gather([first, second]), registry=REG)
    main = context["effects_frame"].main
    a = main[(main["axis"] == "a") & (main["metric"] == "eval_loss")].iloc[0]
    assert a["effect"] == pytest.approx(1.0) and a["n"] == 2  # x's seeds only, never pooled
    assert "Effects are of run x/g only" in context["effects"].note
    across = {(r[0], r[1]): r[-1] for r in context["across"].rows}
    assert across[("a=1,b=0", "eval loss")] == "+4"


def test_a_grid_of_one_value_per_axis_has_no_effects(tmp_path):
    files = write_report([sample_grid({"a": [0], "b": ["x"]})], tmp_path, registry=REG)
    assert files.effects.read_text() == "axis,value,metric,effect,low,high,n,role\n"
    assert "## Effects of each axis" not in files.markdown.read_text()


def test_heatmaps_of_an_earlier_report_do_not_stay_behind(tmp_path):
    grid = sample_grid({"a": [0, 1], "b": [0, 1], "c": [0, 1]}, {("a", 1): 1.0, ("b", 1): 0.5})
    files = write_report([grid], tmp_path, registry=REG)
    assert sorted(p.name for p in files.plots if p.name.startswith("heatmap")) == [
        "heatmap1.svg", "heatmap2.svg", "heatmap3.svg"]
    write_report([sample_run()], tmp_path, registry=REG)  # no grid: no heatmaps
    assert not list(tmp_path.glob("heatmap*.svg"))


def test_cli_reports_two_runs_side_by_side_and_effects_csv_is_spreadsheet_safe(tmp_path):
    import csv
    import io

    from click.testing import CliRunner

    from variantlab.cli.main import main

    evil = "=HYPERLINK(\"http://evil.example\")"
    grid = {"norm.kind": ["layer", evil]}
    a = store_of(sample_grid(grid, {("norm.kind", evil): 0.25}), tmp_path / "a" / "g")
    b = store_of(sample_grid(grid, {("norm.kind", evil): 0.5}), tmp_path / "b" / "g")
    result = CliRunner().invoke(main, ["report", str(a), str(b), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    assert "## Across runs" in md and "| b/g − a/g |" in md
    cells = [c for row in csv.reader(io.StringIO((tmp_path / "r" / "effects.csv").read_text()))
             for c in row]
    assert evil not in cells and "'" + evil in cells
    effects = _effects(tmp_path / "r" / "effects.csv")
    loss = effects[effects["metric"] == "eval_loss"].iloc[0]
    assert loss["effect"] == pytest.approx(0.25)  # run a/g only


def test_a_named_variant_repeating_a_grid_combination_is_not_a_second_cell():
    run = sample_grid({"a": [0, 1]}, {("a", 1): 1.0}, seeds=(0, 1))
    extra = sample_run((("again", {"a": 1}, 1.0),), seeds=(0, 1), fail=None, diverge=None)
    extra.rows.loc[extra.rows["metric"] == "eval_loss", "value"] = 100.0  # would show if pooled
    run.variants = pd.concat([run.variants, extra.variants.assign(position=2)],
                             ignore_index=True)
    run.rows = pd.concat([run.rows, extra.rows], ignore_index=True)
    run.units = pd.concat([run.units, extra.units], ignore_index=True)
    effects = build_context(gather([run]), registry=REG)[0]["effects_frame"]
    assert list(effects.grid.cells["variant"]) == ["a=0", "a=1"]
    loss = effects.main[effects.main["metric"] == "eval_loss"].iloc[0]
    assert loss["effect"] == pytest.approx(1.0) and loss["n"] == 2


def test_identical_pairs_within_a_seed_give_the_seed_level_interval():
    """Issue 23.4: the seed is the unit of replication. Within each seed the effect of a is
    the same in every cell of b and c (8 identical pairs per seed); across 3 seeds it is
    0.1, 0.2, 0.6. The interval is the t-interval of those 3 numbers (df 2), not a
    narrower one over 24 pairs."""
    run = sample_grid({"a": [0, 1], "b": [0, 1, 2, 3], "c": [0, 1]}, seeds=(0, 1, 2))
    moved = run.rows["metric"].eq("eval_loss") & run.rows["variant"].str.startswith("a=1")
    by_seed = {0: 0.1, 1: 0.2, 2: 0.6}
    run.rows.loc[moved, "value"] += run.rows.loc[moved, "seed"].astype(int).map(by_seed)
    main = build_context(gather([run]), registry=REG)[0]["effects_frame"].main
    row = main[(main["axis"] == "a") & (main["metric"] == "eval_loss")].iloc[0]
    mean, low, high, n = interval(pd.Series([0.1, 0.2, 0.6]))
    assert row["n"] == n == 3
    assert (row["effect"], row["low"], row["high"]) == pytest.approx((mean, low, high))
    assert high - mean == pytest.approx(4.303 * float(pd.Series([0.1, 0.2, 0.6]).std())
                                        / math.sqrt(3), rel=1e-4)
    pairs = interval(pd.Series([by_seed[s] for s in (0, 1, 2) for _ in range(8)]))
    assert pairs[2] - pairs[1] < (high - low) / 3  # what counting pairs would have claimed


def test_one_seed_gives_no_interval_and_the_report_says_so(tmp_path):
    run = sample_grid({"a": [0, 1], "b": [0, 1]}, {("a", 1): 0.5}, seeds=(0,))
    files = write_report([run], tmp_path, registry=REG)
    eff = _effects(files.effects)
    row = eff[(eff["axis"] == "a") & (eff["metric"] == "eval_loss")].iloc[0]
    assert row["n"] == 1 and math.isnan(row["low"]) and math.isnan(row["high"])
    md = files.markdown.read_text()
    assert "One seed: no interval can be given" in md and "one seed: no interval" in md
