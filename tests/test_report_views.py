"""Built-in probes' report views go through the registry like a plugin probe's: the report
core names no probe, so a probe registered without its views loses its section, plots,
reading and summary lines, and a plugin probe's pieces join the same shared parts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

import variantlab as vl
from variantlab import ProbeSettings
from variantlab.errors import PluginLoadError
from variantlab.plugin.probe import ProbeView, make_probe
from variantlab.plugin.registry import Registry
from variantlab.report import build_context, gather
from variantlab.report.render import render_markdown
from variantlab.report.tables import MetricRows, select, summary_section
from variantlab.testing.sample import sample_run

BUILTIN = {p.name: p for p in vl.get_registry().probes()}
CORE = ("params", "gradients", "timing", "training")


def registry_of(views: dict[str, tuple], extra=None) -> Registry:
    """A registry whose one plugin registers the built-in probes' runs with ``views``
    (what a third-party plugin could pass), and ``extra(register)`` after them."""

    def register_probes(register):
        for name in CORE:
            probe = BUILTIN[name]
            register(name, probe.settings_cls, probe.run, views=views[name])
        if extra is not None:
            extra(register)

    reg = Registry()
    reg.load_module(SimpleNamespace(register_probes=vl.hookimpl(register_probes)),
                    "test:views", "module")
    return reg


@pytest.fixture(scope="module")
def data():
    return gather([sample_run()])


def _parts(context) -> dict:
    return {"sections": [t.title for t in context["sections"]],
            "plots": [p.key for p in context["plots"]],
            "reading": context["reading"],
            "warnings": context["warnings"].rows,
            "summary": context["summary"]}


def test_builtin_views_passed_by_a_plugin_give_the_same_report(data):
    same = registry_of({n: BUILTIN[n].views for n in CORE})
    ours, theirs = build_context(data, vl.get_registry())[0], build_context(data, same)[0]
    assert render_markdown(ours) == render_markdown(theirs)
    got = _parts(ours)
    assert got["sections"] == ["Parameters", "Timing", "Training", "Gradients"]
    assert got["plots"] == ["gradients", "residual", "timing", "training", "params"]


def test_a_builtin_probe_without_its_views_loses_its_parts(data):
    full = _parts(build_context(data, vl.get_registry())[0])
    bare = registry_of({n: () if n == "timing" else BUILTIN[n].views for n in CORE})
    got = _parts(build_context(data, bare)[0])
    # its section becomes the generic table of its rows; the others' are unchanged
    assert got["sections"] == ["Parameters", "Training", "Gradients", "Probe: timing"]
    assert got["plots"] == ["gradients", "residual", "training", "params"]
    assert any(s.startswith("forward+backward:") for s in full["reading"])
    assert not any(s.startswith("forward+backward:") for s in got["reading"])
    # its summary lines are its rows as stored (seconds, no IQR), no longer its view's
    # (milliseconds with the IQR); the other probes' lines are unchanged
    mine = got["summary"][got["summary"]["section"] == "timing"]
    theirs = full["summary"][full["summary"]["section"] == "timing"]
    assert set(mine["unit"]) == {"s", "tokens/s", "bytes", "FLOP"} != set(theirs["unit"])
    assert mine["iqr"].isna().all() and not theirs["iqr"].isna().all()
    assert "forward_iqr_s" in set(mine["metric"])
    kept = full["summary"][full["summary"]["section"] != "timing"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        got["summary"][got["summary"]["section"] != "timing"].reset_index(drop=True), kept)
    # training's warnings piece: the diverged seed is a warning only while it is registered
    assert ["batch", "training", "seed 1: training diverged"] in full["warnings"]
    quiet = registry_of({n: () if n == "training" else BUILTIN[n].views for n in CORE})
    assert ["batch", "training", "seed 1: training diverged"] not in \
        _parts(build_context(data, quiet)[0])["warnings"]


class NormSettings(ProbeSettings):
    pass


def _norm_rows(data):
    """weight_norms rows: 2.0 + variant index + seed / 10, per variant and seed."""
    base = data.rows[(data.rows["probe"] == "params") & (data.rows["metric"] == "total")]
    rows = base.assign(probe="weight_norms", metric="weight_norm",
                       value=[2.0 + data.order.index(v) + s / 10
                              for v, s in zip(base["variant"], base["seed"])])
    flag = rows.assign(metric="clipped", value=1.0)
    return pd.concat([data.rows, rows, flag], ignore_index=True)


def test_plugin_probe_pieces_join_the_shared_parts(data):
    def metrics(d):
        out = MetricRows()
        out.add(select(d.rows, "weight_norms", "weight_norm"), "weight_norms", "weight_norm",
                "weight norm", "")
        out.add(select(d.rows, "weight_norms", "clipped"), "weight_norms", "clipped",
                "clipped", "", ratio=False)
        return out.frame()

    def section(d, summary):
        return summary_section(d, summary, "weight_norms", "Weight norms", "L2 norm")

    view = ProbeView(metrics=metrics, section=section, rank=15,
                     reading=lambda d, s: ["Weight norms were measured."],
                     warnings=lambda d: [[d.baseline, "weight_norms", "a warning"]])

    def extra(register):
        register("weight_norms", NormSettings, lambda *a, **k: [], views=(view,))

    reg = registry_of({n: BUILTIN[n].views for n in CORE}, extra)
    mine = gather([sample_run()])
    mine.rows = _norm_rows(mine)
    context = build_context(mine, reg)[0]
    got = _parts(context)
    # rank 15: after the params section (10), before timing's (20)
    assert got["sections"] == ["Parameters", "Weight norms", "Timing", "Training", "Gradients"]
    assert "Probe: weight_norms" not in got["sections"]
    summary = got["summary"]
    order = list(dict.fromkeys(summary["section"]))
    assert order.index("params") < order.index("weight_norms") < order.index("timing")
    norm = summary[summary["metric"] == "weight_norm"].set_index("variant")
    assert norm.loc["pre_norm", "mean"] == pytest.approx(2.05)  # seeds 0, 1 of variant 0
    assert norm.loc["post_norm", "ratio"] == pytest.approx(3.05 / 2.05)
    assert summary[summary["metric"] == "clipped"]["ratio"].map(math.isnan).all()
    assert got["reading"].index("Weight norms were measured.") > 0
    assert [mine.baseline, "weight_norms", "a warning"] in got["warnings"]


def test_probe_view_pieces_must_be_callable():
    with pytest.raises(PluginLoadError, match="ProbeView pieces must be callable"):
        make_probe("p", "x", NormSettings, lambda: [], views=[ProbeView(section="no")])  # type: ignore[arg-type]
    with pytest.raises(PluginLoadError, match="every view must be callable"):
        make_probe("p", "x", NormSettings, lambda: [], views=["no"])  # type: ignore[list-item]


def test_the_probes_page_views_make_a_section(data):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "probes.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "ProbeView(" in b)
    scope: dict = {}
    exec(compile(code, "probes.md#4-report-views", "exec"), scope)

    def extra(register):
        register("weight_norms", NormSettings, lambda *a, **k: [], views=scope["VIEWS"])

    mine = gather([sample_run()])
    rows = _norm_rows(mine)
    mine.rows = rows.assign(metric=rows["metric"].replace("weight_norm", "total_weight_norm"))
    got = _parts(build_context(mine, registry_of({n: BUILTIN[n].views for n in CORE}, extra))[0])
    assert got["sections"] == ["Parameters", "Weight norms", "Timing", "Training", "Gradients"]
    line = got["summary"][got["summary"]["metric"] == "total_weight_norm"]
    assert list(line["label"].unique()) == ["total weight norm"]
    assert line.set_index("variant").loc["post_norm", "mean"] == pytest.approx(3.05)


def test_the_fair_comparison_is_the_training_probes_piece():
    from dataclasses import replace

    from test_report_tuned import GRID, held_out, tuning_run, val_of

    from variantlab.report.fair.compare import fair_piece

    data = gather([tuning_run(GRID, val_of, held_out)])
    full = build_context(data, vl.get_registry())[0]
    assert [t.title for t in full["fair"]] == ["Axes", "Tuned comparison"]
    assert list(full["fair_parts"].tuned["variant"]) == ["activation=gelu",
                                                         "activation=relu"]
    unfair = {n: tuple(replace(v, fair=None) if isinstance(v, ProbeView) else v
                       for v in BUILTIN[n].views) for n in CORE}
    bare = build_context(data, registry_of(unfair))[0]
    assert [t.title for t in bare["fair"]] == ["Axes"] and bare["fair_parts"].tuned is None
    assert "loss_vs_lr" not in [p.key for p in bare["plots"]]

    def extra(register):  # another probe asking for the same comparison of training's losses
        register("tuner", NormSettings, lambda *a, **k: [],
                 views=(ProbeView(fair=fair_piece("training", "params")),))

    again = build_context(data, registry_of(unfair, extra))[0]
    assert render_markdown(again) == render_markdown(full)
    pd.testing.assert_frame_equal(again["fair_parts"].tuned, full["fair_parts"].tuned)
