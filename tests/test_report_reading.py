"""A reading that says only what the numbers support (issue 31; labels of issue 28.5):
every recorded scalar in the summary, "nothing learned", verdict words only with a clear
lead, labels that name every axis's value, named axis values, never raw JSON."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import stdev

import pandas as pd
import pytest

import variantlab as vl
from variantlab.config.named import auto_labels, axis_labels, named_axes, value_names
from variantlab.errors import InputError
from variantlab.report import build_context, gather, write_report
from variantlab.report.labels import short_axes
from variantlab.report.learned import learned_frame
from variantlab.report.tables import apart
from variantlab.report.verdict import lead
from variantlab.report.words import lead_phrase
from variantlab.testing.sample import sample_grid, sample_run

REG = vl.get_registry()
FF = [{"kind": "glu", "hidden_mult": 2.6666666667},
      {"kind": "moe", "n_experts": 8, "top_k": 2, "expert": {"hidden_mult": 1.3333333333}}]


# -- labels --------------------------------------------------------------------------------
def test_short_axis_names_drop_prefixes_and_kind_and_grow_only_when_they_clash():
    got = short_axes(["attention.kind", "measure.training.lr", "data.n_pairs", "norm.eps",
                      "attention.qk_norm.eps", "emb_dim"])
    assert got == {"attention.kind": "attention", "measure.training.lr": "lr",
                   "data.n_pairs": "n_pairs", "norm.eps": "norm.eps",
                   "attention.qk_norm.eps": "qk_norm.eps", "emb_dim": "emb_dim"}


def test_dict_values_are_labelled_by_the_keys_that_differ_rounded_never_json():
    assert auto_labels(FF) == ["kind=glu hidden_mult=2.67",
                               "kind=moe n_experts=8 top_k=2 expert.hidden_mult=1.33"]
    assert auto_labels([{"kind": "layer"}, {"kind": "rms"}]) == ["layer", "rms"]
    assert auto_labels([{"kind": "rms", "eps": 1e-6}, {"kind": "rms", "eps": 1e-5}]) == \
        ["eps=1e-06", "eps=1e-05"]
    assert auto_labels([0.001, 0.0030000001, True, None]) == ["0.001", "0.003", "true", "null"]
    # rounding would merge two values: their full text instead
    assert auto_labels([1.00001, 1.00002]) == ["1.00001", "1.00002"]
    # a dict value alone has no key that differs: every key, never "default"
    assert auto_labels([FF[0]]) == ["kind=glu hidden_mult=2.67"]
    assert axis_labels(FF, {'{"hidden_mult": 2.6666666667, "kind": "glu"}': "dense"}) == \
        ["dense", "kind=moe n_experts=8 top_k=2 expert.hidden_mult=1.33"]


def test_a_named_axis_is_its_values_with_names_and_the_extended_form_is_not_named():
    raw = {"grid": {"feedforward": {"dense": FF[0], "moe": FF[1]},
                    "measure.training.lr": {"values": [1e-3, 1e-2], "extend": True}}}
    assert named_axes(raw)["grid"] == {"feedforward": FF,
                                       "measure.training.lr": raw["grid"]["measure.training.lr"]}
    assert list(value_names(raw)) == ["feedforward"]
    assert sorted(value_names(raw)["feedforward"].values()) == ["dense", "moe"]


NAMED = """\
name: named
seeds: [0]
model: {family: gpt, vocab_size: 32, context_length: 8, emb_dim: 16, n_heads: 2, n_layers: 1}
grid:
  feedforward:
    dense: {kind: glu}
    wide: {kind: mlp, hidden_mult: 8}
  norm.kind: [layer, rms]
measure: {params: {}}
"""


def test_named_values_name_the_stored_variants():
    from variantlab.config.experiment import experiment_from_text

    exp = experiment_from_text(NAMED, "<named>")
    assert [v.name for v in exp.variants] == ["feedforward=dense", "feedforward=dense,norm.kind=rms",
                                              "feedforward=wide", "feedforward=wide,norm.kind=rms"]
    assert exp.variants[2].spec.feedforward.kind == "mlp"


def test_report_labels_name_every_axis_value_defaults_included(tmp_path):
    run = sample_grid({"feedforward": FF, "norm.kind": ["layer", "rms"],
                       "measure.training.lr": [0.001, 0.01]})
    files = write_report([run], tmp_path, registry=REG)
    summary = pd.read_csv(files.csv)
    assert list(dict.fromkeys(summary["variant"]))[:2] == [
        "feedforward=kind=glu hidden_mult=2.67, norm=layer, lr=0.001",
        "feedforward=kind=glu hidden_mult=2.67, norm=layer, lr=0.01"]
    for path in (files.markdown, files.html, files.csv, files.effects, files.tuned):
        assert '{"' not in path.read_text(encoding="utf-8"), path.name  # never raw JSON
    effects = pd.read_csv(files.effects)
    assert set(effects.loc[effects["axis"] == "feedforward", "value"]) == \
        {"kind=moe n_experts=8 top_k=2 expert.hidden_mult=1.33"}
    tuned = pd.read_csv(files.tuned)
    assert list(tuned["variant"][:2]) == ["feedforward=kind=glu hidden_mult=2.67, norm=layer",
                                          "feedforward=kind=glu hidden_mult=2.67, norm=rms"]


# -- every recorded scalar -------------------------------------------------------------------
def _with_rows(run, extra):
    """``run`` with ``extra(variant, seed) -> [(probe, metric, value, unit)]`` model rows."""
    rows = run.rows
    new = []
    for (variant, seed), _ in rows.groupby(["variant", "seed"], sort=False):
        for probe, metric, value, unit in extra(variant, int(seed)):
            new.append({**rows.iloc[0].to_dict(), "variant": variant, "seed": seed,
                        "probe": probe, "metric": metric, "value": value, "unit": unit,
                        "scope": "model", "name": "", "layer": None, "step": None})
    run.rows = pd.concat([rows, pd.DataFrame(new)], ignore_index=True)
    return run


def test_every_scalar_a_probe_recorded_is_in_the_summary_with_its_direction(tmp_path):
    run = _with_rows(sample_run(fail=None, diverge=None), lambda v, s: [
        ("training", "test_loss", 3.0 + s, ""), ("training", "val_recall_accuracy", 0.5, "fraction"),
        ("training", "recall_accuracy", 0.25 + 0.25 * s, "fraction"),
        ("params", "state_bytes", 4096.0, "bytes"), ("my_probe", "my_score", 7.0 + s, "")])
    files = write_report([run], tmp_path, registry=REG)
    summary = pd.read_csv(files.csv, keep_default_na=False)
    pre = summary[summary["variant"] == "pre_norm"].set_index("metric")
    assert pre.loc["test_loss", ["mean", "better", "section"]].tolist() == [3.5, "lower", "training"]
    assert pre.loc["recall_accuracy", ["mean", "better", "label"]].tolist() == \
        [0.375, "higher", "test recall accuracy"]
    assert pre.loc["val_recall_accuracy", "label"] == "val recall accuracy"
    assert pre.loc["state_bytes", ["mean", "label", "unit"]].tolist() == [4096, "state size", "bytes"]
    assert pre.loc["my_score", ["mean", "section", "better"]].tolist() == [7.5, "my_probe", ""]
    assert pre.loc["total", "better"] == "" and pre.loc["forward_median_s", "better"] == "lower"
    md = files.markdown.read_text(encoding="utf-8")
    assert "| val recall accuracy (fraction) | test recall accuracy (fraction) |" in md
    assert "state size (bytes)" in md and "| my\\_score |" in md


# -- verdicts ----------------------------------------------------------------------------------
def _values(a: list[float], b: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "seed": s, "value": x}
                         for v, xs in (("A", a), ("B", b)) for s, x in enumerate(xs)])


def test_best_only_when_the_paired_interval_excludes_zero():
    clear = lead(_values([3.0, 3.1, 3.2], [3.1, 3.2, 3.31]), lower=True)
    assert clear is not None and clear.first == "A" and clear.clear
    assert lead_phrase("test loss", clear).startswith(
        "Best variant by test loss: A (3.1), ahead of B (3.203) by 0.1033 [")
    tie = lead(_values([3.4881, 3.5, 3.47], [3.4882, 3.49, 3.481]), lower=True)
    assert tie is not None and not tie.clear
    text = lead_phrase("test loss", tie)
    assert "not clearly different" in text and "Best" not in text and "includes 0" in text
    one = lead(_values([3.48811], [3.48812]), lower=True)
    assert lead_phrase("test loss", one) == \
        "Test loss: A 3.48811, B 3.48812 (one seed: no interval, so no verdict)"
    higher = lead(_values([0.2, 0.21, 0.22], [0.3, 0.33, 0.34]), lower=False)
    assert higher.first == "B" and higher.clear and higher.margin == pytest.approx(0.34 / 3)
    # issue 37.1: the lead is a claims row (first minus second), and the words follow it
    assert (clear.row["kind"], clear.row["a"], clear.row["b"], clear.row["verdict"]) == \
        ("lead", "A", "B", "lower")
    assert clear.row["estimate"] == pytest.approx(-0.31 / 3)
    assert higher.row["verdict"] == "higher" and tie.row["verdict"] == "not clearly different"
    # A's mean is better only through a seed B lacks: on the paired seeds A is higher
    odd = lead(_values([3.0, 3.0, 2.0], [2.9, 2.9]), lower=True)
    assert odd.first == "A" and odd.row["verdict"] == "higher" and not odd.clear
    assert lead_phrase("test loss", odd) == (
        "Test loss: on the seeds both ran, A (2.667) higher than B (2.9) (paired difference "
        "-0.1, 95% interval [-0.1, -0.1] over 2 seeds)")


def test_numbers_get_the_digits_that_tell_them_apart():
    assert apart(3.48811, 3.48823) == ("3.4881", "3.4882")
    assert apart(2.958, 2.971) == ("2.958", "2.971")
    assert apart(3.0, 3.0) == ("3", "3")


# -- nothing learned -----------------------------------------------------------------------
def _recall_rows(accuracy):
    def extra(variant, seed):
        return [("training", "recall_accuracy", accuracy(variant, seed), "fraction"),
                ("training", "val_recall_accuracy", accuracy(variant, seed), "fraction"),
                ("training", "chance_recall_accuracy", 1 / 32, "fraction"),
                ("training", "recall_noise", 0.006, "fraction"),
                ("training", "test_loss", 3.47 + 0.001 * seed, ""),
                ("training", "init_loss", 4.17, ""), ("training", "loss_noise", 0.05, "")]
    return extra


def test_a_chance_level_run_says_nothing_was_learned_and_names_no_best():
    grid = sample_grid({"attention.kind": ["mha", "linear_attention", "token_shift"]},
                       seeds=(0, 1))
    at_chance = _with_rows(grid, _recall_rows(lambda v, s: 1 / 32 + 0.004 * s))
    data = gather([at_chance])
    frame = learned_frame(data)
    assert list(frame["learned"]) == [False] * 3 and set(frame["metric"]) == {"recall_accuracy"}
    assert frame["start"].tolist() == pytest.approx([1 / 32] * 3)
    reading = build_context(data, REG)[0]["reading"]
    assert reading[0].startswith("Nothing was learned: every variant's test recall accuracy "
                                 "within 3x its noise of chance (attention=mha 0.03325 vs 0.03125;")
    assert "no variant is named best" in reading[0]
    assert not any(w in line for line in reading[1:] for w in ("Best", "best variant", "beats"))


def test_variants_that_learned_nothing_are_named_beside_those_that_did():
    from dataclasses import replace

    grid = sample_grid({"attention.kind": ["mha", "linear_attention"]}, seeds=(0, 1, 2))
    run = _with_rows(grid, _recall_rows(lambda v, s: 0.9 - 0.01 * s if "mha" in v else 0.035))
    data = gather([run])
    assert learned_frame(data)["learned"].tolist() == [True, False]
    reading = build_context(data, REG)[0]["reading"]
    assert reading[0] == ("Learned nothing: attention=linear_attention (each one's test recall "
                          "accuracy within 3x its noise of chance (attention=linear_attention "
                          "0.035 vs 0.03125)).")
    # the headline metric (loss, by default): every pair, here one that is the same on
    # every seed, so equal within the default margin of 0.02 nats
    assert reading[1] == ("A fixed synthetic run for tests. Answer: On test_loss, every pair "
                          "compared (a minus b, 95% interval; Holm over all pairs): "
                          "attention=mha and attention=linear_attention equal within ±0.02 "
                          "(90% interval [0, 0]).")
    assert not any(line.startswith("By test recall accuracy") for line in reading)
    run.meta = replace(run.meta, compare_on="recall_accuracy")
    reading = build_context(gather([run]), REG)[0]["reading"]
    # recall 0.9 - 0.01 s against 0.035: 0.865, 0.855, 0.845, t(2) 4.3027 x 0.01 / sqrt 3
    assert reading[1] == ("A fixed synthetic run for tests. Answer: On recall_accuracy, every "
                          "pair compared (a minus b, 95% interval; Holm over all pairs): "
                          "attention=mha higher than attention=linear_attention (0.855 "
                          "[0.8302, 0.8798]).")
    assert not any(line.startswith(("By test loss", "Best variant")) for line in reading)


def test_a_variant_that_solved_on_some_seeds_learned_though_its_seeds_disagree():
    # recall 1.00, 1.00 and 0.10 over three seeds: a mean gain of 0.67 below 3 standard
    # errors of the gain (3 x 0.31), yet two seeds are far beyond their own noise
    grid = sample_grid({"attention.kind": ["mha", "linear_attention"]}, seeds=(0, 1, 2))
    run = _with_rows(grid, _recall_rows(lambda v, s: (1.0 if s < 2 else 0.1) if "mha" in v
                                        else 0.035))
    frame = learned_frame(gather([run]))
    assert frame["learned"].tolist() == [True, False]
    gains = [1.0 - 1 / 32] * 2 + [0.1 - 1 / 32]
    assert frame["gain"].iloc[0] == pytest.approx(sum(gains) / 3)
    assert frame["noise"].iloc[0] == pytest.approx(stdev(gains) / math.sqrt(3))
    assert frame["gain"].iloc[0] < 3 * frame["noise"].iloc[0]  # the mean alone would not


def test_a_loss_that_moved_from_its_start_learned_and_one_at_chance_did_not():
    grid = sample_grid({"norm.kind": ["layer", "rms"]}, seeds=(0, 1))

    def extra(variant, seed):
        test = 2.1 if "layer" in variant else math.log(64) + 0.01
        return [("training", "test_loss", test + 0.01 * seed, ""),
                ("training", "init_loss", 4.3, ""), ("training", "loss_noise", 0.05, ""),
                ("training", "chance_loss", math.log(64), "")]
    frame = learned_frame(gather([_with_rows(grid, extra)]))
    assert frame["metric"].tolist() == ["test_loss", "test_loss"]
    assert frame["start"].tolist() == pytest.approx([math.log(64)] * 2)
    assert frame["learned"].tolist() == [True, False]


# -- messages ------------------------------------------------------------------------------
PLUGIN = '''\
from typing import Literal
from variantlab import ComponentSpec, hookimpl

class ShiftSpec(ComponentSpec):
    kind: Literal["token_shift"] = "token_shift"

@hookimpl
def register_attentions(register):
    register("token_shift", ShiftSpec, lambda spec, **kw: None)
'''


def test_an_unknown_kind_a_file_beside_the_experiment_registers_says_how_to_load_it(tmp_path):
    from variantlab.config.experiment import load_experiment

    (tmp_path / "token_shift.py").write_text(PLUGIN)
    exp = tmp_path / "exp.yaml"
    exp.write_text(NAMED.replace("norm.kind: [layer, rms]", "attention.kind: [mha, token_shift]"))
    with pytest.raises(InputError) as err:
        load_experiment(exp)
    text = "\n".join(err.value.messages)
    assert "unknown attention 'token_shift'" in text
    assert ("token_shift.py beside the experiment registers 'token_shift' but is not loaded: "
            "add `plugins: [token_shift.py]` to the experiment, or pass --plugin token_shift.py"
            ) in text


def test_declare_role_returns_the_linear_and_knows_the_gate_role():
    from torch import nn

    from variantlab.model.roles import declare_role, role_of

    linear = nn.Linear(4, 4)
    assert declare_role(linear, "attn_gate") is linear and role_of(linear) == "attn_gate"
    with pytest.raises(ValueError, match="unknown role 'gate'"):
        declare_role(nn.Linear(2, 2), "gate")


def test_docs_say_which_split_each_recall_metric_is_scored_on():
    docs = Path(__file__).resolve().parent.parent / "docs"
    text = (docs / "experiments.md").read_text(encoding="utf-8")
    assert "reports `val_recall_accuracy` and `test_recall_accuracy`" in text
    assert "on the fixed validation and test sets" in text
    assert "`chance_recall_accuracy` and `recall_noise`" in text
    mixers = (docs / "mixers.md").read_text(encoding="utf-8")
    assert "zeroes the padded inputs *before* the shift or convolution" in mixers


def test_named_values_label_the_report_tables_csv_files_and_plots(tmp_path):
    from dataclasses import replace

    import yaml

    run = sample_grid({"feedforward": FF, "norm.kind": ["layer", "rms"]})
    run.meta = replace(run.meta, yaml=yaml.safe_dump(
        {"name": "grid", "grid": {"feedforward": {"dense": FF[0], "moe": FF[1]},
                                  "norm.kind": ["layer", "rms"]}}))
    files = write_report([run], tmp_path, registry=REG)
    names = ["feedforward=dense, norm=layer", "feedforward=dense, norm=rms",
             "feedforward=moe, norm=layer", "feedforward=moe, norm=rms"]
    assert list(dict.fromkeys(pd.read_csv(files.csv)["variant"])) == names
    effects = pd.read_csv(files.effects)
    assert set(effects.loc[effects["axis"] == "feedforward", "value"]) == {"moe"}
    md = files.markdown.read_text(encoding="utf-8")
    assert "| eval loss | feedforward | moe vs dense |" in md
    # the effect averaged over norm.kind, rendered from its average row in verdicts.csv: on
    # the headline (eval loss, which no axis changes here), never on a metric without a
    # direction (the gradient-norm ratio, where moe's +0.0406 is)
    assert "+0.0406" in md and "matters" not in md
    assert "Averaged over the grid's other axes (on eval_loss; averages, not verdicts on " \
        "one combination): not clearly different from the baseline value: feedforward, " \
        "norm.kind." in md.replace("\\", "")
    verdicts = pd.read_csv(files.verdicts, keep_default_na=False)
    moe = verdicts[verdicts["a"] == "feedforward=moe"].iloc[0]
    assert (moe["kind"], moe["metric"], moe["verdict"], moe["caveats"]) == (
        "average", "eval_loss", "not clearly different", "averaged over (norm.kind)")
    training = (tmp_path / "training.svg").read_text(encoding="utf-8")
    assert all(name in training for name in names)  # the plot's legend
