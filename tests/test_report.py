"""Reports from a fixed synthetic run: golden tables, numbers, escaping, plots, stores."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import store_of

import variantlab as vl
from variantlab.report import build_context, gather, write_report
from variantlab.report.plots import build_plots, styles, to_svg
from variantlab.report.render import browse_script, md_escape
from variantlab.report.tables import summarize
from variantlab.testing.sample import sample_run

REG = vl.get_registry()

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("VARIANTLAB_UPDATE_GOLDEN") == "1"
EVIL = "<img src=x onerror=alert(1)>"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with VARIANTLAB_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return write_report([sample_run()], out, registry=REG)


def _summary(**kw) -> tuple[pd.DataFrame, object]:
    data = gather([sample_run(**kw)])
    return summarize(data), data


def _value(summary: pd.DataFrame, variant: str, metric: str, col: str = "mean") -> float:
    hit = summary[(summary["variant"] == variant) & (summary["metric"] == metric)]
    assert len(hit) == 1, (variant, metric)
    return float(hit[col].iloc[0])


def test_markdown_and_csv_match_golden(report):
    _golden("sample_report.md", report.markdown.read_text(encoding="utf-8"))
    _golden("sample_summary.csv", report.csv.read_text(encoding="utf-8"))


def test_summary_numbers_follow_the_sample_formulas():
    summary, _ = _summary()
    assert _value(summary, "pre_norm", "total") == 43200
    assert _value(summary, "post_norm", "total", "ratio") == pytest.approx(43232 / 43200)
    assert _value(summary, "post_norm", "params.feedforward") == 24992
    # gradient norm grows 2x per layer for post_norm: layer 2 / layer 0 = 4
    assert _value(summary, "post_norm", "grad_norm_ratio.feedforward") == pytest.approx(4.0)
    assert _value(summary, "pre_norm", "grad_norm_ratio.all") == pytest.approx(1.05 ** 2)
    # forward median: 10 ms + 0.2 ms * seed, mean over seeds 0 and 1
    assert _value(summary, "pre_norm", "forward_median_s") == pytest.approx(10.1)
    assert _value(summary, "pre_norm", "forward_median_s", "iqr") == pytest.approx(1.0)
    assert _value(summary, "post_norm", "forward_median_s", "ratio") == pytest.approx(15.1 / 10.1)
    assert _value(summary, "pre_norm", "final_loss") == pytest.approx(3.305)
    assert _value(summary, "pre_norm", "final_loss", "spread") == pytest.approx(math.sqrt(5e-5))
    # batch seed 1 diverged (NaN final loss) and its timing unit failed
    assert _value(summary, "batch", "final_loss", "n") == 1
    assert _value(summary, "batch", "final_loss", "nan") == 1
    assert _value(summary, "batch", "diverged") == 0.5
    assert _value(summary, "batch", "forward_median_s", "n") == 1


def test_reading_is_computed_from_the_numbers():
    data = gather([sample_run()])
    context, _ = build_context(data, registry=REG)
    text = "\n".join(context["reading"])
    assert "post_norm: FFN gradient norm rises 4.0x from layer 0 to layer 2" in text
    assert "pre_norm: 1.1x" in text
    assert "post_norm is 1.50x slower than pre_norm on every seed (n=2" in text
    # every pair: pre_norm - post_norm is -0.09 on both seeds; batch ran one seed, so its
    # pairs have no interval and show the paired seed's numbers
    assert ("every pair compared (a minus b, 95% interval; Holm over all pairs): pre_norm "
            "lower than post_norm (-0.09 [-0.09, -0.09]); pre_norm 3.35, batch 3.53 (one "
            "seed: no interval, so no verdict); post_norm 3.44, batch 3.53 (one seed: no "
            "interval, so no verdict).") in text
    assert "Training diverged for batch" in text
    # change the numbers, the reading changes with them
    faster = sample_run((("naive", {}, 1.0), ("sdpa", {"norm.kind": "rms"}, 1.0)),
                        fail=None, diverge=None)
    # sdpa (index 1) runs 15 ms per forward; a third of that is 2.0x faster than 10 ms
    faster.rows.loc[(faster.rows["variant"] == "sdpa")
                    & faster.rows["metric"].str.endswith("_median_s"), "value"] /= 3
    context, _ = build_context(gather([faster]), registry=REG)
    assert any("forward+backward: sdpa is 2.01x faster than naive on every seed" in line
               for line in context["reading"])


def test_variant_table_shows_only_differing_axes(report):
    md = report.markdown.read_text(encoding="utf-8")
    assert "| variant | norm.kind | residual.kind |" in md
    assert "emb\\_dim" not in md.split("## Variants")[1].split("## Summary")[0]


def test_warnings_and_failures_listed(report):
    md = report.markdown.read_text(encoding="utf-8")
    assert "BatchNorm in a causal model" in md
    assert "seed 1: training diverged" in md
    assert "RuntimeError: out of memory \\| &lt;b&gt;bad&lt;/b&gt;" in md
    html = report.html.read_text(encoding="utf-8")
    assert "out of memory | &lt;b&gt;bad&lt;/b&gt;" in html and "<b>bad" not in html


def test_markdown_escape():
    assert md_escape("a|b") == "a\\|b"
    assert md_escape(EVIL) == "&lt;img src=x onerror=alert(1)&gt;"
    assert md_escape("*x* _y_ `z`\nnext") == "\\*x\\* \\_y\\_ \\`z\\` next"


def test_hostile_variant_name_is_escaped_everywhere(tmp_path):
    run = sample_run(((EVIL, {}, 1.0), ("b|c", {"norm.kind": "rms"}, 2.0)), fail=None,
                     diverge=None)
    files = write_report([run], tmp_path, registry=REG)
    html = files.html.read_text(encoding="utf-8")
    assert EVIL not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    md = files.markdown.read_text(encoding="utf-8")
    assert EVIL not in md and "b\\|c" in md
    for svg in files.plots:
        assert "<img" not in svg.read_text(encoding="utf-8")


def test_html_is_self_contained(report):
    html = report.html.read_text(encoding="utf-8")
    assert html.count("<svg") == 5 and "<style>" in html
    # one script: the package's own, inline, exactly as shipped (it sorts and filters)
    assert html.count("<script") == 1
    assert "<script>\n" + browse_script() + "\n</script>" in html
    for bad in ("http://", "https://", "<link", "src=", "@import", "xlink:href=\"http"):
        assert bad not in html, bad
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "duplicate ids across inline SVGs"


def test_svg_output_is_deterministic(tmp_path):
    a = write_report([sample_run()], tmp_path / "a", registry=REG)
    b = write_report([sample_run()], tmp_path / "b", registry=REG)
    for pa, pb in zip(a.plots, b.plots):
        assert pa.read_bytes() == pb.read_bytes(), pa.name
    assert a.html.read_bytes() == b.html.read_bytes()
    assert "<dc:date>" not in a.plots[0].read_text(encoding="utf-8")


def test_every_plot_has_title_and_labelled_axes():
    plots = build_plots(gather([sample_run()]))
    assert [p.key for p in plots] == ["gradients", "residual", "timing", "training", "params"]
    for plot in plots:
        assert plot.figure is not None, plot.key
        for ax in plot.figure.axes:
            assert ax.get_title(), plot.key
            assert ax.get_xlabel() and ax.get_ylabel(), (plot.key, ax.get_title())
        units = " ".join(ax.get_xlabel() + ax.get_ylabel() for ax in plot.figure.axes)
        assert "(" in units, f"{plot.key}: an axis label names its unit"
    grad = plots[0].figure.axes[0]
    assert grad.get_yscale() == "log"


def test_plot_without_data_is_skipped_with_a_reason(tmp_path):
    run = sample_run(fail=None, diverge=None)
    run.rows = run.rows[run.rows["probe"] != "training"]
    files = write_report([run], tmp_path, registry=REG)
    md = files.markdown.read_text(encoding="utf-8")
    assert "Skipped: no training curves" in md
    assert not (tmp_path / "training.svg").exists()
    assert "### Training\n" not in md


@pytest.mark.slow  # 72 log-scale panels drawn to SVG: 14-16 s
def test_many_variants_stay_readable():
    variants = [(f"v{i:02d}", {"emb_dim": 32 + 4 * i}, 1.0 + i / 10) for i in range(24)]
    data = gather([sample_run(variants, seeds=(0,), fail=None, diverge=None)])
    pairs = {(s["color"], s["linestyle"], s["marker"]) for s in styles(24)}
    assert len(pairs) == 24
    plots = build_plots(data)
    legend = plots[0].figure.legends[0]
    assert len(legend.get_texts()) == 24 and legend._ncols >= 2
    assert plots[2].figure.get_figheight() > 6  # timing bars grow with the variant count
    assert len(to_svg(plots[0].figure)) > 0


def test_baseline_choice_and_unknown_baseline(tmp_path):
    summary = summarize(gather([sample_run()], baseline="post_norm"))
    assert _value(summary, "post_norm", "total", "ratio") == 1.0
    assert _value(summary, "pre_norm", "forward_median_s", "ratio") == pytest.approx(10.1 / 15.1)
    with pytest.raises(ValueError, match="no such variant; choose one of: pre_norm"):
        write_report([sample_run()], tmp_path, baseline="nope", registry=REG)


def test_several_runs_prefix_clashing_names(tmp_path):
    a = sample_run(experiment="exp-a", fail=None, diverge=None)
    b = sample_run((("pre_norm", {}, 1.0), ("rms", {"norm.kind": "rms"}, 1.0)),
                   experiment="exp-b", fail=None, diverge=None)
    data = gather([a, b])
    assert data.order == ["exp-a/pre_norm", "post_norm", "batch", "exp-b/pre_norm", "rms"]
    assert data.baseline == "exp-a/pre_norm"
    files = write_report([a, b], tmp_path, registry=REG)
    md = files.markdown.read_text(encoding="utf-8")
    assert "## Run: exp-a" in md and "## Run: exp-b" in md
    assert "| variant | experiment |" in md


def _store_sample(path: Path) -> Path:
    return store_of(sample_run(), path)


def test_report_from_a_real_store_matches_the_in_memory_one(tmp_path):
    store = _store_sample(tmp_path / "sample")
    from_store = write_report([store], tmp_path / "out", registry=REG)
    direct = write_report([sample_run()], tmp_path / "direct", registry=REG)
    assert from_store.csv.read_text() == direct.csv.read_text()
    assert from_store.markdown.read_text() == direct.markdown.read_text()


def test_loss_gap_is_judged_by_the_paired_interval_over_seeds():
    """Seeds share data, so a gap that holds on every seed is clear even when the seeds'
    own spread is larger than the gap (a zero-width paired interval); a gap whose sign
    flips between seeds is not clearly different (its paired interval includes 0)."""
    import pandas as pd

    from variantlab.report.claims import Arm, pair_rows

    base = {0: 3.0, 1: 3.5, 2: 4.0}  # seed spread 0.5
    gaps = {"a": {0: 0.0, 1: 0.0, 2: 0.0}, "b": {0: 0.1, 1: 0.1, 2: 0.1},
            "c": {0: -0.1, 1: 0.1, 2: 0.1}}
    arms = [Arm(v, "", "", pd.Series({s: base[s] + g[s] for s in base})) for v, g in gaps.items()]
    rows = {(r["a"], r["b"]): r for r in pair_rows(arms, "test_loss", 0.02)}
    # b - a: 0.1 on every seed: p = 0, clear after Holm over the three pairs
    ab = rows[("a", "b")]
    assert ab["estimate"] == pytest.approx(-0.1) and ab["holm_p"] < 1e-12
    # c - a per seed: -0.1, 0.1, 0.1: mean 0.0333, sd 0.1155, t(2) 4.3027: [-0.2535, 0.3202]
    ac = rows[("a", "c")]
    assert (ac["estimate"], ac["low"], ac["high"]) == pytest.approx(
        (-1 / 30, -0.3202, 0.2535), abs=1e-4)
    assert ac["holm_p"] > 0.05
    from variantlab.report.claims import verdict_of

    assert verdict_of(ab) == "lower" and verdict_of(ac) == "not clearly different"
    one = [Arm(a.name, "", "", a.values.loc[[0]]) for a in arms]
    assert {verdict_of(r) for r in pair_rows(one, "test_loss", 0.02)} == {"not estimated"}


def _timing_said(ratios, caveats=""):
    """A timing claims row from per-seed time ratios (variant over baseline), its verdict
    and its sentence."""
    from variantlab.report.claims import measured_row, verdict_of
    from variantlab.report.timing_claims import TIMING_MARGIN
    from variantlab.report.words import speed_phrase

    row = measured_row("", "v", "base", "backward_median_s", "timing",
                       pd.Series([math.log(r) for r in ratios]), caveats, TIMING_MARGIN)
    row["verdict"] = verdict_of(row)
    return row["verdict"], speed_phrase(pd.Series(row), ratios)


def test_a_timing_row_judges_the_time_ratio_seed_by_seed():
    """Issue 37.1: speed words are rendered from a ``timing`` claims row (the log time
    ratio's interval over seeds), with how many seeds agree."""
    assert _timing_said([0.5, 0.5, 0.5]) == (
        "lower", "v is 2.00x faster than base on every seed (n=3, per-seed 2.00x to 2.00x)")
    assert _timing_said([2.0, 1.98]) == (
        "higher", "v is 1.99x slower than base on every seed (n=2, per-seed 1.98x to 2.00x)")
    # clear over 7 seeds although one seed is slower: said with the count and the interval
    ratios = [0.5] * 6 + [1.01]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 7
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 6)
    half = 2.446912 * sd / math.sqrt(7)  # t(6) at 97.5%
    assert _timing_said(ratios) == (
        "lower", f"v is {math.exp(-mean):.2f}x faster than base on 6 of 7 seeds (n=7, per-seed "
        f"0.99x to 2.00x; 95% interval {math.exp(-mean - half):.2f}x to "
        f"{math.exp(-mean + half):.2f}x speed-up)")
    # within 2% only when the 90% interval of the time ratio is: equal within ±log(1.02)
    verdict, text = _timing_said([1.001, 0.999, 1.0, 1.0005])
    assert verdict == f"equal within ±{math.log(1.02):g}"
    assert text.startswith("v is as fast as base (within 2%: n=4, 90% interval of its time "
                           "1.00x to 1.00x base's)")
    assert _timing_said([1.98]) == (
        "not estimated", "v took 1.98x base's time (one timing unit each: no interval, so no "
        "verdict; more seeds would show the run-to-run spread)")
    verdict, text = _timing_said([0.5, 0.5, 0.5], "timed on a busy machine (v); timed apart "
                                 "(seeds 0, 2)")
    assert verdict == "lower" and text.endswith(
        "(but timed in different invocations of `variantlab run` on seed(s) 0, 2, not side by "
        "side: rerun both together to compare) (but v was timed while the machine was busy: "
        "its load average was above the cores the run could use, so the times read slow by "
        "an unknown factor; rerun on an idle machine)")


def test_a_speed_verdict_needs_a_paired_interval_that_excludes_no_change():
    """Issue 31.3: "faster"/"slower" only when the 95% t-interval over seeds of the log
    speed-ups excludes 0; every seed agreeing in sign is not enough with n=2 or 3."""
    assert _timing_said([1 / 2.0] * 3)[0] == "lower"
    assert _timing_said([1 / 1.9, 1 / 2.0, 1 / 2.1])[0] == "lower"
    assert _timing_said([1 / 0.5, 1 / 0.8])[0] == "not clearly different"  # t(1) = 12.7
    ups = [1.04, 1.19, 0.98]
    logs = [math.log(r) for r in ups]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302653 * sd / math.sqrt(3)  # t(2) at 97.5%
    low, high = math.exp(mean - half), math.exp(mean + half)
    assert _timing_said([1 / u for u in ups]) == (
        "not clearly different", "v and base are not clearly different in speed (n=3, per-seed "
        f"0.98x to 1.19x, 95% interval {low:.2f}x to {high:.2f}x faster: includes 1)")
    # in the reading: a noisy slow-down is "not clearly different in speed", no verdict word
    noisy = sample_run((("naive", {}, 1.0), ("sdpa", {"norm.kind": "rms"}, 1.0)),
                       fail=None, diverge=None)
    timed = noisy.rows["metric"].str.endswith("_median_s")
    for seed, factor in ((0, 1.3), (1, 0.8)):
        noisy.rows.loc[(noisy.rows["variant"] == "sdpa") & timed
                       & (noisy.rows["seed"] == seed), "value"] *= factor
    context, _ = build_context(gather([noisy]), registry=REG)
    lines = [line for line in context["reading"] if "forward" in line and "sdpa" in line]
    assert lines and all("not clearly different in speed" in line for line in lines), lines
    assert not any("faster than" in line or "slower than" in line for line in lines)
