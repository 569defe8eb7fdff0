"""Issue 10 item 9 (b, c): encoder-decoder rows say their stack, and the report compares
layers within one stack; timings say which invocation of ``run`` measured them, and the
report says when compared timings were not measured side by side."""

import sqlite3
from contextlib import closing

import pandas as pd
import pytest
from torch import nn

import variantlab as vl
from variantlab.probes import run_probe
from variantlab.probes.common import layer_stacks, param_index, stack_roots
from variantlab.report import build_context, gather
from variantlab.report.findings import timing_speed
from variantlab.report.tables import depth_ratios, summarize
from variantlab.store.store import Store, UnitRecord, load_run
from variantlab.testing.sample import sample_run

REG = vl.get_registry()

ENC_DEC = {"family": "encoder_decoder", "vocab_size": 64, "context_length": 32, "emb_dim": 32,
           "n_heads": 4, "n_layers": 2, "drop_rate": 0.0}
GRADS = {"batch_size": 2, "seq_len": 16, "batches": 1}


@pytest.fixture(scope="module")
def enc_dec_rows():
    return run_probe("gradients", dict(ENC_DEC), GRADS, seed=0, registry=REG)


def _layer(rows, metric):
    return {(r["layer"], r["name"]): r["value"] for r in rows
            if r["scope"] == "layer" and r["metric"] == metric}


def test_encoder_decoder_layer_rows_name_their_stack(enc_dec_rows):
    norms = _layer(enc_dec_rows, "grad_norm")
    stacks = {layer: name.split("/")[0] for layer, name in norms}
    assert stacks == {0: "encoder", 1: "encoder", 2: "decoder", 3: "decoder"}
    assert {name.split("/")[1] for _, name in norms} >= {"all", "weights", "attention",
                                                        "feedforward", "norm"}
    assert set(_layer(enc_dec_rows, "residual_rms")) == {(0, "encoder/"), (1, "encoder/"),
                                                         (2, "decoder/"), (3, "decoder/")}
    params = run_probe("params", dict(ENC_DEC), {}, seed=0, registry=REG)
    per_layer = _layer(params, "params")
    # a decoder layer holds a cross-attention beside its self-attention: 16,800 vs 12,608
    assert per_layer == {(0, "encoder/"): 12608, (1, "encoder/"): 12608,
                         (2, "decoder/"): 16800, (3, "decoder/"): 16800}


def test_one_stack_models_keep_plain_names(tiny):
    rows = run_probe("gradients", tiny, GRADS, seed=0, registry=REG)
    names = {n for (_, n) in _layer(rows, "grad_norm")}
    assert "/" not in "".join(names) and "all" in names
    assert set(_layer(rows, "residual_rms")) == {(0, ""), (1, "")}


def _frame(rows, variant="v", seed=0):
    frame = pd.DataFrame(rows)
    frame["variant"], frame["seed"] = variant, seed
    from variantlab.report.frame import split_stacks

    frame["stack"], frame["name"] = split_stacks(frame)
    return frame


def test_depth_ratio_stays_within_a_stack(enc_dec_rows):
    ratios = depth_ratios(_frame(enc_dec_rows))
    norms = _layer(enc_dec_rows, "grad_norm")
    for stack, first, last in (("encoder", 0, 1), ("decoder", 2, 3)):
        mine = ratios[(ratios["stack"] == stack) & (ratios["name"] == "feedforward")]
        assert mine[["first_layer", "last_layer"]].values.tolist() == [[first, last]]
        expected = norms[(last, f"{stack}/feedforward")] / norms[(first, f"{stack}/feedforward")]
        assert mine["value"].iloc[0] == pytest.approx(expected)
    assert not ((ratios["first_layer"] == 0) & (ratios["last_layer"] == 3)).any()


def test_report_names_each_stack(enc_dec_rows):
    run = sample_run((("a", {}, 1.0), ("b", {}, 1.0)), seeds=(0,), fail=None, diverge=None)
    rows = run.rows[run.rows["probe"] != "gradients"]
    extra = []
    for variant in ("a", "b"):
        for r in enc_dec_rows:
            scale = 2.0 if variant == "b" else 1.0
            extra.append(dict(r, value=r["value"] * scale, variant=variant, label=variant,
                              seed=0, unit_key=f"{variant}-g", status="ok", error=None,
                              experiment="sample", run="sample"))
    run.rows = pd.concat([rows, pd.DataFrame(extra)], ignore_index=True)
    data = gather([run])
    summary = summarize(data)
    labels = set(summary.loc[summary["section"] == "gradients", "label"])
    assert {"encoder first-layer mean |grad|", "decoder first-layer mean |grad|",
            "encoder last/first layer grad norm (feedforward)",
            "decoder last/first layer grad norm (feedforward)"} <= labels
    assert not any(label.startswith("first-layer") for label in labels)
    first = summary[(summary["variant"] == "a")
                    & (summary["metric"] == "first_layer_mean_abs_grad.decoder")]
    assert first["mean"].iloc[0] == pytest.approx(
        _layer(enc_dec_rows, "mean_abs_grad")[(2, "decoder/weights")])
    context, plots = build_context(data, registry=REG)
    reading = " ".join(context["reading"])
    assert "Encoder: " in reading and "Decoder: " in reading
    assert "from layer 0 to layer 1" in reading and "from layer 2 to layer 3" in reading
    assert "Decoder first-layer mean |grad|: a" in reading  # b's gradients are 2x a's
    grad_plot = next(p for p in plots if p.key == "gradients")
    assert "separate lines" in grad_plot.caption
    # two lines (one per stack) per variant in each panel, one legend entry per variant
    ax = grad_plot.figure.axes[0]
    assert len(ax.lines) == 4
    assert [line.get_xdata().tolist() for line in ax.lines[:2]] == [[0, 1], [2, 3]]


def test_stack_tag_and_untagged_fallback():
    class Layer(nn.Linear):
        pass

    def layers(start):
        out = nn.ModuleList([Layer(2, 2), Layer(2, 2)])
        for i, m in enumerate(out):
            m.variantlab_layer = start + i
        return out

    model = nn.Module()
    model.left, model.right = layers(0), layers(2)
    assert stack_roots(model) == {"left": "left", "right": "right"}
    assert [s for _, _, s in layer_stacks(model)] == ["left", "left", "right", "right"]
    model.right.variantlab_stack = "decoder"
    model.left.variantlab_stack = "encoder"
    assert {p.name: p.stack for p in param_index(model)}["right.1.bias"] == "decoder"
    single = nn.Module()
    single.blocks = layers(0)
    assert stack_roots(single) == {}


# -- which invocation measured a timing ---------------------------------------------------
def _save(store, run, variants):
    for _, u in run.units.iterrows():
        if u["variant"] not in variants:
            continue
        rows = run.rows[(run.rows["unit_key"] == u["key"]) & (run.rows["status"] == "ok")]
        records = [{k: (None if pd.isna(v) else v) if k in ("layer", "step") else v
                    for k, v in r.items()} for r in rows.to_dict("records")]
        store.save_unit(UnitRecord(key=u["key"], variant=u["variant"], seed=int(u["seed"]),
                                   probe=u["probe"], settings_json="{}", status="ok",
                                   device="cpu"), records)


def _stored(tmp_path, sessions):
    """The sample run stored by one Store session per group of variants."""
    run = sample_run(seeds=(0, 1), fail=None, diverge=None)
    variants = [{"name": r["name"], "label": r["label"], "spec": r["spec"],
                 "overrides": {}, "warnings": []} for _, r in run.variants.iterrows()]
    plan = [(u["key"], u["variant"], int(u["seed"]), u["probe"]) for _, u in run.units.iterrows()]
    for group in sessions:
        with Store(tmp_path) as store:
            store.write_experiment(run.meta, variants, plan)
            _save(store, run, group)
    return tmp_path


def test_units_record_their_invocation(tmp_path):
    path = _stored(tmp_path, [("pre_norm",), ("post_norm", "batch")])
    units = load_run(path).units
    per_variant = units.groupby("variant")["invocation"].unique().to_dict()
    assert all(len(v) == 1 for v in per_variant.values())
    assert per_variant["post_norm"][0] == per_variant["batch"][0]
    assert per_variant["pre_norm"][0] != per_variant["post_norm"][0]
    assert per_variant["pre_norm"][0] < per_variant["post_norm"][0]  # starts with its time


def test_timings_from_different_invocations_are_said_so(tmp_path):
    data = gather([_stored(tmp_path / "split", [("pre_norm",), ("post_norm", "batch")])])
    summary = summarize(data)
    text = timing_speed(data, summary)
    assert "timed in different invocations of `variantlab run` on seed(s) 0, 1" in text
    context, _ = build_context(data, registry=REG)
    timing = next(t for t in context["sections"] if t.title == "Timing")
    assert timing.columns[:3] == ["variant", "n", "timed in run"]
    assert [row[2] for row in timing.rows] == ["#1", "#2", "#2"]
    assert "2 invocations of `variantlab run`" in timing.note

    together = gather([_stored(tmp_path / "one", [("pre_norm", "post_norm", "batch")])])
    text = timing_speed(together, summarize(together))
    assert "invocations" not in text
    context, _ = build_context(together, registry=REG)
    timing = next(t for t in context["sections"] if t.title == "Timing")
    assert "timed in run" not in timing.columns and "invocations" not in timing.note


def test_a_store_without_the_invocation_column_is_migrated(tmp_path):
    path = tmp_path / "results.sqlite"
    with closing(sqlite3.connect(path)) as conn:  # the units table as it was before
        conn.executescript(
            "CREATE TABLE units (key TEXT PRIMARY KEY, variant TEXT, seed INTEGER, probe TEXT,"
            " settings_json TEXT, status TEXT, error TEXT, traceback TEXT, started_at TEXT,"
            " finished_at TEXT, duration_s REAL, version TEXT, device TEXT);"
            "INSERT INTO units (key, variant, seed, probe, status) VALUES ('old', 'a', 0,"
            " 'params', 'ok');")
    with Store(path) as store:
        store.save_unit(UnitRecord(key="new", variant="a", seed=1, probe="params",
                                   settings_json="{}", status="ok"), [])
        invocation = store.invocation
    units = load_run(path).units.set_index("key")
    assert units.loc["new", "invocation"] == invocation
    assert pd.isna(units.loc["old", "invocation"])
