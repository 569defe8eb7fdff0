"""Issue 40.2: plots that mix conditions draw one panel per condition on shared axes with
one legend; loss-vs-size draws every compared variant with the sizes it has; an accuracy
stays on a linear axis; a line drawn over an equal one is marked and named."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from test_report_tuned import tuning_run

import variantlab as vl
from variantlab.config.roles import TUNED
from variantlab.report import build_context, gather
from variantlab.report.panels import step_lines

REG = vl.get_registry()
LRS = [1e-3, 3e-3, 1e-2]


def plots_of(run) -> dict:
    _, plots = build_context(gather([run]), REG)
    return {p.key: p for p in plots}


def data_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid() != "guide"
            and not line.get_label().startswith("_")]


def val(over, seed):  # relu better at width 32, worse at 64; both best at 3e-3
    relu = over["activation.kind"] == "relu"
    shift = {32: -0.1, 64: 0.2}[over.get("emb_dim", 32)] if relu else 0.0
    return 3.0 + abs(over.get("measure.training.lr", 3e-3) - 3e-3) * 50 + shift + 0.01 * seed


def test_metric_vs_lr_draws_one_panel_per_condition_with_one_legend():
    run = tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64],
                      "measure.training.lr": LRS}, val, val)
    plot = plots_of(run)["loss_vs_lr"]
    panels = [ax for ax in plot.figure.axes if ax.get_subplotspec() is not None]
    assert [ax.get_title() for ax in panels] == ["emb_dim=32", "emb_dim=64"]
    assert panels[0].get_shared_y_axes().joined(panels[0], panels[1])
    assert panels[0].get_shared_x_axes().joined(panels[0], panels[1])
    for ax in panels:
        assert [line.get_label() for line in data_lines(ax)] == ["activation=gelu",
                                                                 "activation=relu"]
        assert all(list(line.get_xdata()) == LRS for line in data_lines(ax))
        assert len(ax.collections) >= 2  # a seed band per line
    (legend,) = plot.figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["activation=gelu", "activation=relu"]
    assert "One panel per condition (emb_dim), on shared axes." in plot.caption
    relu64 = data_lines(panels[1])[1].get_ydata()
    assert min(relu64) == pytest.approx(3.0 + 0.2 + 0.01)  # mean over seeds 0, 1, 2 at 3e-3


def test_per_variant_curves_draw_one_panel_per_condition_and_a_band_over_seeds():
    run = tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64]}, val, val)
    plots = plots_of(run)
    training = plots["training"].figure
    panels = [ax for ax in training.axes if ax.get_subplotspec() is not None]
    assert [ax.get_title() for ax in panels] == ["emb_dim=32", "emb_dim=64"]
    assert all(len(ax.collections) == 2 for ax in panels)  # two seeds-bands each
    assert [t.get_text() for t in training.legends[0].get_texts()] == ["activation=gelu",
                                                                       "activation=relu"]
    gradients = plots["gradients"].figure
    rows = [ax for ax in gradients.axes if ax.get_subplotspec() is not None]
    assert len(rows) % 2 == 0 and rows[0].get_title().endswith("emb_dim=32")
    assert rows[-1].get_title().endswith("emb_dim=64")


def test_no_condition_keeps_one_panel():
    run = tuning_run({"activation.kind": ["gelu", "relu"], "measure.training.lr": LRS}, val, val)
    plots = plots_of(run)
    for key in ("loss_vs_lr", "training"):
        panels = [ax for ax in plots[key].figure.axes if ax.get_subplotspec() is not None]
        assert len(panels) == 1, key
        assert "One panel per condition" not in plots[key].caption


def test_equal_curves_are_marked_and_named_in_the_caption():
    same = tuning_run({"activation.kind": ["gelu", "relu"], "measure.training.lr": LRS},
                      lambda over, seed: 3.0 + 0.01 * seed, lambda over, seed: 3.0)
    plot = plots_of(same)["loss_vs_lr"]
    gelu, relu = data_lines(plot.figure.axes[0])
    assert (gelu.get_linestyle(), relu.get_linestyle()) == ("-", "--")
    assert relu.get_marker() != gelu.get_marker()
    assert "Lines that coincide are drawn dashed with markers over one another: " \
        "activation=gelu = activation=relu." in plot.caption
    apart = plots_of(tuning_run({"activation.kind": ["gelu", "relu"],
                                 "measure.training.lr": LRS},
                                val, None))
    assert "coincide" not in apart["loss_vs_lr"].caption


def recall_run(grid, value):
    """A sweep scored on recall accuracy (higher is better) with ``value(over, seed)`` as
    its validation and test recall."""
    run = tuning_run(grid, value, value)
    rows = run.rows
    rows["metric"] = rows["metric"].replace({"val_loss": "val_recall_accuracy",
                                             "test_loss": "test_recall_accuracy"})
    run.meta = replace(run.meta, compare_on="recall_accuracy")
    return run


def test_accuracy_is_drawn_on_a_linear_axis_and_loss_on_a_log_one():
    def recall(over, seed):
        return {32: 0.5, 64: 0.9}[over["emb_dim"]] - abs(over["measure.training.lr"] - 3e-3)

    plot = plots_of(recall_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64],
                                "measure.training.lr": LRS}, recall))["loss_vs_size"]
    assert plot.title == "test_recall_accuracy vs size"
    assert {ax.get_yscale() for ax in plot.figure.axes} == {"linear"}
    assert plot.figure.axes[0].get_xscale() == "log"
    loss = plots_of(tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64],
                                "measure.training.lr": LRS}, val, val))["loss_vs_size"]
    assert loss.figure.axes[0].get_yscale() == "log"


def test_loss_vs_size_draws_every_compared_variant_through_the_sizes_it_has():
    """dyt-vs-layernorm: norm.alpha0 is tuned for DyT only, so LayerNorm's variants lack
    it; each compared variant (layer, dyt) is one line through both widths, whatever
    setting its group chose at each."""
    def loss(over, seed):  # best at lr 3e-3 and alpha0 0.5; 0.2 lower at width 64
        return (3.0 + 0.1 * (over.get("norm.alpha0") == 1.0)
                + abs(over["measure.training.lr"] - 3e-3) * 50
                - 0.2 * (over["emb_dim"] == 64) + 0.01 * seed)

    run = tuning_run({"norm.kind": ["layer", "dyt"], "norm.alpha0": [0.5, 1.0],
                      "emb_dim": [32, 64], "measure.training.lr": LRS}, loss, loss)
    variants = run.variants
    layer = [o.get("norm.kind") == "layer" for o in variants["overrides"]]
    twin = [v for v, o, is_layer in zip(variants["name"], variants["overrides"], layer)
            if is_layer and o["norm.alpha0"] == 1.0]
    keep = ~variants["name"].isin(twin)
    variants = variants[keep].copy()
    variants["overrides"] = [{k: v for k, v in o.items()
                              if not (o["norm.kind"] == "layer" and k == "norm.alpha0")}
                             for o in variants["overrides"]]
    run.variants = variants.reset_index(drop=True)
    run.rows = run.rows[~run.rows["variant"].isin(twin)].reset_index(drop=True)
    run.units = run.units[~run.units["variant"].isin(twin)].reset_index(drop=True)
    run.meta = replace(run.meta, roles={"norm.alpha0": TUNED})
    plot = plots_of(run)["loss_vs_size"]
    params = plot.figure.axes[0]
    lines = {line.get_label(): line for line in data_lines(params)}
    assert sorted(lines) == ["norm=dyt", "norm=layer"]
    assert all(len(line.get_xdata()) == 2 for line in lines.values())  # both widths
    for line in lines.values():  # test loss at the chosen setting, mean over 3 seeds
        assert list(line.get_ydata()) == pytest.approx([3.01, 2.81])


def test_step_lines_give_a_row_of_metric_panels_per_condition():
    """The dynamics and routing views' curves over steps (plots.step_lines)."""
    run = tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64]}, val, val)
    data = gather([run])
    part = pd.DataFrame([{"variant": v, "metric": m, "step": s, "value": s * (1 + i)}
                         for i, v in enumerate(data.order) for m in ("a", "b")
                         for s in range(4)])
    fig, said = step_lines(data, part, list(data.order), ["a", "b"], {"a": "A", "b": "B"})
    panels = [ax for ax in fig.axes if ax.get_subplotspec() is not None]
    assert [ax.get_title() for ax in panels] == ["A — emb_dim=32", "B — emb_dim=32",
                                                 "A — emb_dim=64", "B — emb_dim=64"]
    assert all(len(ax.get_lines()) == 2 for ax in panels)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["activation=gelu",
                                                                  "activation=relu"]
    assert said == " One row of panels per condition, on shared axes."


def test_the_committed_zoology_report_draws_one_panel_per_condition():
    """Issue 40's done-when on reports/zoology-mqar as committed: its plots that mix the
    four conditions draw one panel (matplotlib axes) per condition, each titled by it."""
    import re
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "reports" / "zoology-mqar"
    conditions = [f"n_pairs={p}, emb_dim={w}" for w in (64, 128) for p in (4, 8)]
    for name in ("loss_vs_lr.svg", "training.svg"):
        svg = (folder / name).read_text(encoding="utf-8")
        assert len(set(re.findall(r'id="axes_(\d+)"', svg))) == 4, name
        for condition in conditions:
            assert condition in svg, (name, condition)
