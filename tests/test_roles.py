"""Axis roles (issue 28.2), the headline metric in the tuned comparison (28.3) and edge
extension (28.6): compared / tuned / condition axes, per-condition verdicts, compare_on
chosen on validation and reported on test in its direction, edges extended and reported."""

from __future__ import annotations

import math
import re
from textwrap import dedent

import pandas as pd
import pytest
from conftest import TINY_MODEL, exp
from scipy import stats

import variantlab as vl
from variantlab.config.experiment import InputError, experiment_from_text
from variantlab.config.roles import axis_roles, next_value, spacing
from variantlab.executors.runner import run_experiment
from variantlab.plugin.rows import row
from variantlab.report import write_report
from variantlab.report.fair.extension import run_extended

REG = vl.get_registry()
TRAIN = "measure:\n  training: {steps: 2, batch_size: 2, seq_len: 16, eval_batches: 1}\n"


# -- roles in the experiment file ------------------------------------------------------------
def test_every_axis_has_a_role_by_default_and_tune_and_conditions_move_them():
    assert axis_roles(["norm.kind", "measure.training.lr", "data.n_pairs", "emb_dim",
                       "n_layers", "norm.alpha0"]) == {
        "norm.kind": "compared", "measure.training.lr": "tuned", "data.n_pairs": "condition",
        "emb_dim": "condition", "n_layers": "condition", "norm.alpha0": "compared"}
    e = experiment_from_text(exp(dedent("""\
        grid:
          activation.kind: [gelu, relu]
          norm.eps: [1.0e-5, 1.0e-6]
          measure.training.lr: [1.0e-3, 1.0e-2]
          drop_rate: [0.0, 0.1]
        tune: [norm.eps]
        conditions: [drop_rate]
        """) + TRAIN))
    assert e.roles == {"activation.kind": "compared", "norm.eps": "tuned",
                       "measure.training.lr": "tuned", "drop_rate": "condition"}


@pytest.mark.parametrize("body, where, message", [
    ("tune: [norm.eps]\n", "tune[0]", "'norm.eps' is not an axis of this experiment"),
    ("conditions: [measure.training.lr, measure.training.lr]\n", "conditions[1]",
     "is listed twice"),
    ("tune: [activation.kind]\nconditions: [activation.kind]\n", "conditions[0]",
     "listed under both tune: and conditions:"),
])
def test_bad_tune_and_conditions_entries_are_located(body, where, message):
    text = exp("grid:\n  activation.kind: [gelu, relu]\n  measure.training.lr: [1.0e-3, 1.0e-2]\n"
               + body + TRAIN)
    with pytest.raises(InputError) as info:
        experiment_from_text(text, "e.yaml")
    (msg,) = info.value.messages
    assert msg.startswith("e.yaml:") and f": {where}: " in msg and message in msg


def test_extend_on_an_axis_is_read_and_checked():
    e = experiment_from_text(exp(dedent("""\
        grid:
          activation.kind: [gelu, relu]
          measure.training.lr: {values: [1.0e-3, 1.0e-2], extend: true}
          measure.training.steps: {values: [2, 4, 6], extend: 2}
        """) + TRAIN))
    assert e.spec.grid["measure.training.lr"] == [1e-3, 1e-2] and len(e.variants) == 12
    assert e.extensions() == {"measure.training.lr": 3, "measure.training.steps": 2}
    assert experiment_from_text(exp("grid:\n  measure.training.lr: [1.0e-3, 1.0e-2]\n"
                                    + TRAIN)).extensions(edges=True) == {
        "measure.training.lr": 3}
    for axis, why in (("activation.kind: {values: [gelu, relu], extend: true}",
                       "'activation.kind' is a compared axis; only a tuned axis is extended"),
                      ("measure.training.lr: {values: [1.0e-3, 2.0e-3, 1.0e-2], extend: true}",
                       "on neither a log grid (equal ratios), the half-decade ladder"),
                      ("measure.training.lr: {values: [1.0e-3, 1.0e-2], extend: 'yes'}",
                       "extend is true, false or a whole number of extensions per edge (1 to "
                       "20), got 'yes'")):
        with pytest.raises(InputError) as info:
            experiment_from_text(exp(f"grid:\n  {axis}\n" + TRAIN), "e.yaml")
        (msg,) = info.value.messages
        assert msg.startswith("e.yaml:12:") and "grid." in msg and why in msg, msg


def test_the_next_value_keeps_the_grids_spacing():
    assert spacing([1e-3, 3e-3, 9e-3]) == ("log", pytest.approx(3.0))
    assert spacing([0.5, 1.0, 1.5]) == ("linear", pytest.approx(0.5))
    assert spacing([1e-3, 2e-3, 1e-2]) is None and spacing(["a", "b"]) is None
    # the half-decade ladder 1, 3, 10, 30 (ratios 3 and 10/3), in any order
    assert spacing([1e-2, 1e-3, 3e-3]) == ("half-decade", pytest.approx(math.sqrt(10)))
    assert spacing([3e-3, 1e-2, 3e-2, 1e-1]) == ("half-decade", pytest.approx(math.sqrt(10)))
    assert spacing([1e-3, 3e-3, 3e-2]) is None  # a rung skipped
    assert spacing([1e-3, 3e-3, 1e-2, 3e-2]) is not None
    assert next_value([3e-3, 1e-2, 3e-2], [3e-3, 1e-2, 3e-2], "high") == 0.1
    assert next_value([3e-3, 1e-2, 3e-2, 0.1], [3e-3, 1e-2, 3e-2], "high") == 0.3
    assert next_value([3e-3, 1e-2, 3e-2], [3e-3, 1e-2, 3e-2], "low") == 1e-3
    assert next_value([1e-3, 3e-3, 1e-2], [1e-3, 3e-3, 1e-2], "low") == 3e-4
    assert next_value([1e-3, 1e-2], [1e-3, 1e-2], "high") == 0.1
    assert next_value([1e-3, 1e-2, 0.1], [1e-3, 1e-2], "high") == 1.0
    assert next_value([1e-3, 1e-2], [1e-3, 1e-2], "low") == 1e-4
    assert next_value([-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0], "low") == -2.0  # linear
    assert next_value([100, 200], [100, 200], "high") == 400  # integers stay integers
    assert isinstance(next_value([100, 200], [100, 200], "high"), int)


# -- a fake training probe: exact numbers, no compute ------------------------------------------
BEST_LR = {"gelu": 0.1, "relu": 1e-2}  # gelu's best lies beyond the grid [1e-3, 1e-2]


def fake_training(name, spec, settings, *, seed, data=None, **_):
    """Rows of a training run whose validation loss is (log10 lr - log10 best)^2 + 2 and
    recall accuracy falls away from the best lr, the harder with more pairs."""
    kind = spec.activation.kind
    lr = settings.lr
    gap = (math.log10(lr) - math.log10(BEST_LR[kind])) ** 2
    pairs = getattr(data, "n_pairs", None) or 2
    acc = max(0.0, 1.0 - 0.2 * gap - (0.05 if kind == "relu" and pairs > 2 else 0.0)
              - 0.1 * (kind == "gelu" and pairs == 2))
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", 2.0 + gap + 0.01 * seed),
            row(name, "eval_loss", 2.0 + gap + 0.01 * seed),
            row(name, "test_loss", 2.1 + gap + 0.01 * seed),
            row(name, "val_recall_accuracy", acc - 0.01 * seed),
            row(name, "test_recall_accuracy", acc - 0.02 * seed)]


def fake_experiment(tmp_path, grid: str, head: str = "") -> object:
    text = (f"name: roles\nseeds: [0, 1]\nmodel: {TINY_MODEL}\n{head}grid:\n{grid}"
            "measure:\n  training: {steps: 2, batch_size: 2, seq_len: 16, eval_batches: 1}\n")
    path = tmp_path / "roles.yaml"
    path.write_text(text)
    return experiment_from_text(text, path)


def fake_run(e, out):
    return run_experiment(e, out, probe_fn=fake_training)


def test_a_best_at_the_edge_is_extended_until_it_is_inside(tmp_path):
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: {values: [1.0e-3, 1.0e-2], "
                                  "extend: true}\n")
    seen = []
    run_extended(e, lambda x: fake_run(x, tmp_path / "runs"), e.extensions(),
                        on_round=lambda n, added: seen.append((n, [(a.group, a.value)
                                                                   for a in added])))
    # gelu: 1e-2 is best -> 0.1 (best) -> 1.0 (worse): 0.1 is inside; relu's 1e-2 too
    assert seen == [(1, [("activation=gelu", 0.1), ("activation=relu", 0.1)]),
                    (2, [("activation=gelu", 1.0)])]
    rows = vl.results(tmp_path / "runs" / "roles")
    lrs = rows[rows["activation.kind"] == "gelu"]["measure.training.lr"]
    assert sorted(set(lrs)) == [1e-3, 1e-2, 0.1, 1.0]
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    gelu, relu = tuned.loc["activation=gelu"], tuned.loc["activation=relu"]
    assert gelu["measure.training.lr"] == 0.1 and relu["measure.training.lr"] == 1e-2
    assert gelu["extended"] == "measure.training.lr: 0.1, 1.0"
    assert relu["extended"] == "measure.training.lr: 0.1"
    assert not gelu["unresolved"] and not relu["unresolved"]
    # the same test loss at each one's best: equal within ±δ, one group
    assert list(tuned["group"]) == ["a", "a"]
    md = files.markdown.read_text()
    assert "Edge extension ran values beyond the grid for activation=gelu " \
        "(measure.training.lr: 0.1, 1.0); activation=relu (measure.training.lr: 0.1)" in md
    assert "| measure.training.lr | tuned | 0.001, 0.01 | 0.1, 1.0 |" in md  # Axes
    again = run_extended(e, lambda x: fake_run(x, tmp_path / "runs"), e.extensions())
    assert sum(s.done for s in again.summaries) == 0  # every extension is stored already


def test_extensions_of_named_dict_values_are_named_apart_and_labelled_by_the_grid(tmp_path):
    # two dict values of a named axis, both best at the top edge: each gets its own added
    # variant, named by the value's name (an unnamed lone dict used to print "default" for
    # both, and the second extension was dropped as a repeated name)
    e = fake_experiment(tmp_path, "  activation:\n    g: {kind: gelu}\n    r: {kind: relu}\n"
                                  "  measure.training.lr: {values: [1.0e-3, 1.0e-2], "
                                  "extend: 1}\n")
    done = run_extended(e, lambda x: fake_run(x, tmp_path / "runs"), e.extensions())
    assert [[a.name for a in r] for r in done.rounds] == [[
        "activation=g,measure.training.lr=0.1", "activation=r,measure.training.lr=0.1"]]
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    names = list(dict.fromkeys(pd.read_csv(files.csv)["variant"]))
    assert names[-2:] == ["activation=g, lr=0.1", "activation=r, lr=0.1"]
    md = files.markdown.read_text()
    assert "| activation | compared | g, r |  |" in md  # Axes: the names, not "default"
    assert "default" not in md


def test_a_named_condition_is_written_by_its_names_in_tuned_csv(tmp_path):
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  data.n_pairs: {few: 2, many: 4}\n"
                                  "  measure.training.lr: [1.0e-3, 1.0e-2, 1.0e-1]\n",
                        "data: {source: synthetic, task: recall}\n")
    run_experiment(e, tmp_path / "runs", probe_fn=fake_training)
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned)
    assert list(tuned["data.n_pairs"]) == ["few", "many", "few", "many"]
    assert list(tuned["measure.training.lr"]) == [0.1, 0.1, 0.01, 0.01]  # numbers stay numbers


def test_a_best_still_at_the_edge_is_unresolved_and_never_ranked(tmp_path):
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: {values: [1.0e-3, 1.0e-2], "
                                  "extend: 1}\n")
    done = run_extended(e, lambda x: fake_run(x, tmp_path / "runs"), e.extensions())
    # one extension per edge: gelu's best is then 0.1, the largest it may try
    assert [[a.value for a in r] for r in done.rounds] == [[0.1, 0.1]]
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    gelu, relu = tuned.loc["activation=gelu"], tuned.loc["activation=relu"]
    assert gelu["unresolved"] and gelu["edge_axes"] == "measure.training.lr"
    assert gelu["measure.training.lr"] == 0.1 and gelu["extended"] == "measure.training.lr: 0.1"
    assert not relu["unresolved"] and relu["measure.training.lr"] == 1e-2
    assert math.isnan(gelu["group"]) and relu["group"] == "a"  # gelu unresolved: no group
    md = files.markdown.read_text()
    assert "Unresolved: the best setting sits at the edge of the sweep for " \
        "activation=gelu (measure.training.lr)" in md


def saturated_training(name, spec, settings, *, seed, data=None, **_):
    """Recall accuracy 1.00 at every rate from 1e-2 up (a tie on the headline); the
    validation loss is lowest at 1e-1, which sits inside the grid [1e-3, 1e-2, 1e-1, 1]."""
    lr = settings.lr
    acc = 1.0 if lr >= 1e-2 else 0.5
    loss = 1.0 + abs(math.log10(lr) + 1.0) + 0.01 * seed
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", loss), row(name, "test_loss", loss + 0.1),
            row(name, "val_recall_accuracy", acc), row(name, "test_recall_accuracy", acc)]


def test_a_tie_on_the_headline_goes_to_the_lower_validation_loss(tmp_path):
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: [1.0e-3, 1.0e-2, 1.0e-1, 1.0]\n",
                        "compare_on: recall_accuracy\n"
                        "data: {source: synthetic, task: recall}\n")
    run_experiment(e, tmp_path / "runs", probe_fn=saturated_training)
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    # 1e-2, 1e-1 and 1.0 tie at recall 1.00; the first (1e-2) would have won before, and
    # 1.0 would sit at the edge; the validation loss picks 1e-1, inside the sweep
    assert list(tuned["measure.training.lr"]) == [0.1, 0.1]
    assert not tuned["unresolved"].any() and not tuned["at_edge"].any()


def test_a_best_at_the_ceiling_of_its_metric_is_neither_extended_nor_unresolved(tmp_path):
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: {values: [1.0e-2, 1.0e-1], "
                                  "extend: 1}\n",
                        "compare_on: recall_accuracy\n"
                        "data: {source: synthetic, task: recall}\n")
    # recall 1.00 at both rates, the lower validation loss at 1e-1: an edge, but nothing
    # beyond it can beat 1.00, so no extension runs and the choice stands
    done = run_extended(e, lambda x: run_experiment(x, tmp_path / "runs",
                                                    probe_fn=saturated_training),
                        e.extensions())
    assert done.rounds == []
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned)
    assert list(tuned["measure.training.lr"]) == [0.1, 0.1]
    assert not tuned["unresolved"].any() and list(tuned["group"]) == ["a", "a"]


def recall_report(tmp_path, lrs: str, probe_fn=fake_training) -> tuple[pd.DataFrame, str]:
    """tuned.csv and report.md of activation x data.n_pairs x lr with compare_on:
    recall_accuracy (a fake training probe)."""
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n  data.n_pairs: [2, 4]\n"
                                  f"  measure.training.lr: {lrs}\n",
                        "compare_on: recall_accuracy\n"
                        "data: {source: synthetic, task: recall}\n")
    assert e.roles["data.n_pairs"] == "condition"
    run_experiment(e, tmp_path / "runs", probe_fn=probe_fn)
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    assert files.by_condition == tmp_path / "rep" / "effects_by_condition.csv"
    return pd.read_csv(files.tuned), files.markdown.read_text()


def test_compare_on_recall_accuracy_chooses_within_each_condition(tmp_path):
    tuned, md = recall_report(tmp_path, "[1.0e-3, 1.0e-2, 1.0e-1]")
    assert list(tuned.columns[:3]) == ["variant", "data.n_pairs", "measure.training.lr"]
    assert {"val_recall_accuracy", "test_recall_accuracy"} <= set(tuned.columns)
    assert set(tuned["chosen_on"]) == {"val_recall_accuracy"}
    assert set(tuned["reported_on"]) == {"test_recall_accuracy"}
    by = tuned.set_index(["variant", "data.n_pairs"])
    # higher is better: the lr with the highest mean val accuracy, per variant and n_pairs
    assert by.loc[("activation=gelu", 2), "measure.training.lr"] == 0.1
    assert by.loc[("activation=relu", 4), "measure.training.lr"] == 1e-2
    # test accuracy at the choice: mean over seeds 0, 1 of acc - 0.02 seed
    assert by.loc[("activation=gelu", 2), "test_recall_accuracy"] == pytest.approx(0.89)
    assert by.loc[("activation=relu", 2), "test_recall_accuracy"] == pytest.approx(0.99)
    assert by.loc[("activation=relu", 4), "test_recall_accuracy"] == pytest.approx(0.94)
    # vs the baseline (gelu) of the same n_pairs, never across n_pairs
    assert by.loc[("activation=relu", 2), "vs_baseline"] == pytest.approx(0.1)
    assert by.loc[("activation=relu", 4), "vs_baseline"] == pytest.approx(0.94 - 0.99)
    # ranks within each n_pairs (relu's best lr, 1e-2, is inside the sweep; gelu's is not)
    assert by["unresolved"].tolist() == [True, True, False, False]
    assert by["group"].isna().tolist() == [True, True, False, False]  # relu alone: "a"
    assert "recall\\_accuracy vs learning rate" in md and "Loss vs learning rate" not in md
    said = "activation=gelu vs activation=relu unresolved (a best setting at an edge of the sweep)"
    reading, cards = md[md.index("## Reading"):], md[:md.index("## Details")]
    assert reading.count(said) == 2 and cards.count(said) == 2  # one per n_pairs in each


def test_a_verdict_per_condition_says_whether_it_holds_across_them(tmp_path):
    tuned, md = recall_report(tmp_path, "[1.0e-3, 1.0e-2, 1.0e-1, 1.0]")
    by = tuned.set_index(["variant", "data.n_pairs"])
    assert not by["unresolved"].any()
    assert by["group"].to_dict() == {("activation=gelu", 2): "b", ("activation=gelu", 4): "a",
                                     ("activation=relu", 2): "a", ("activation=relu", 4): "b"}
    # gelu - relu: 0.89 - 0.99 at 2 pairs, 0.99 - 0.94 at 4, the same on every seed
    assert "n\\_pairs=2: activation=gelu lower than activation=relu (-0.1 \\[-0.1, -0.1\\])" in md
    assert "n\\_pairs=4: activation=gelu higher than activation=relu (0.05 \\[0.05, 0.05\\])" in md
    assert "Across conditions: activation=gelu vs activation=relu flips: lower at " \
        "n\\_pairs=2, higher at n\\_pairs=4." in md
    by_cond = pd.read_csv(tmp_path / "rep" / "effects_by_condition.csv")
    assert list(by_cond["condition"]) == ["n_pairs=2", "n_pairs=4"]
    assert list(by_cond["effect"]) == pytest.approx([0.99 - 0.89, 0.94 - 0.99])
    assert set(by_cond["across_conditions"]) == {"flips"}
    assert set(by_cond["metric"]) == {"test_recall_accuracy"}
    axes = md[md.index("## Axes"):].splitlines()
    assert "| data.n\\_pairs | condition | 2, 4 |  |" in axes
    assert "| measure.training.lr | tuned | 0.001, 0.01, 0.1, 1.0 |  |" in axes
    effects = pd.read_csv(tmp_path / "rep" / "effects.csv")
    roles = dict(zip(effects["axis"], effects["role"]))
    assert roles["activation.kind"] == "compared" and roles["data.n_pairs"] == "condition"
    assert roles["measure.training.lr"] == "tuned"


@pytest.mark.slow
def test_a_recall_grid_is_tuned_on_recall_accuracy_within_each_n_pairs(tmp_path):
    """Issue 28's done-when: an architecture axis x data.n_pairs x lr with compare_on:
    recall_accuracy chooses each variant's rate by validation recall accuracy within each
    n_pairs, reports test recall accuracy, and never ranks variants of two n_pairs values
    against each other (real training, tiny settings)."""
    from click.testing import CliRunner

    from variantlab.cli.main import main

    path = tmp_path / "mqar.yaml"
    path.write_text(f"name: mqar\nseeds: [0, 1]\nmodel: {TINY_MODEL}\n"
                    "compare_on: recall_accuracy\n"
                    "data: {source: synthetic, task: recall}\n"
                    "grid:\n  norm.kind: [layer, rms]\n  data.n_pairs: [2, 4]\n"
                    "  measure.training.lr: [1.0e-3, 1.0e-2]\n"
                    "measure:\n  training: {steps: 6, batch_size: 4, seq_len: 16, "
                    "eval_batches: 1, device: cpu}\n")
    checked = CliRunner().invoke(main, ["validate", str(path)])
    assert checked.exit_code == 0, checked.output
    assert "  data.n_pairs: condition\n" in checked.output
    assert "compare_on: recall_accuracy (higher is better; chosen on val_recall_accuracy" \
        in checked.output
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = vl.results(out / "mqar")
    train = rows[rows["probe"] == "training"]
    reported = next(m for m in ("test_recall_accuracy", "recall_accuracy")
                    if m in set(train["metric"]))
    tuned = pd.read_csv(out / "mqar" / "report" / "tuned.csv")
    assert len(tuned) == 4  # one row per compared variant per n_pairs
    assert set(tuned["chosen_on"]) == {"val_recall_accuracy"}
    assert set(tuned["reported_on"]) == {reported}

    def means(metric):
        part = train[train["metric"] == metric]
        return part.groupby(["norm.kind", "data.n_pairs", "measure.training.lr"])["value"].mean()

    val, test, loss = means("val_recall_accuracy"), means(reported), means("val_loss")
    part = train[train["metric"] == "val_recall_accuracy"]
    per = part.groupby(["norm.kind", "data.n_pairs", "measure.training.lr", "seed"])["value"] \
        .mean()
    lrs = [1e-3, 1e-2]
    for rec in tuned.to_dict("records"):
        kind = rec["variant"].removeprefix("norm=")
        scores = [val[(kind, rec["data.n_pairs"], lr)] for lr in lrs]
        # higher is better; a rate within noise of the best (its paired difference over
        # the two seeds has a 95% t-interval with 0 in it) ties, and a tie goes to the lower
        # mean val loss
        where = (kind, rec["data.n_pairs"])
        top = lrs[scores.index(max(scores))]

        tied = []
        for lr in lrs:
            d = per[(*where, lr)] - per[(*where, top)]
            half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
            if lr == top or d.mean() == 0 or d.mean() - half <= 0 <= d.mean() + half:
                tied.append(lr)

        best = min(tied, key=lambda lr: loss[(*where, lr)])
        assert rec["measure.training.lr"] == best
        assert rec["val_recall_accuracy"] == pytest.approx(val[(*where, best)], rel=1e-5)
        assert rec["test_recall_accuracy"] == pytest.approx(
            test[(kind, rec["data.n_pairs"], best)], rel=1e-5)
    for _, part in tuned.groupby("data.n_pairs"):  # groups only within one n_pairs
        assert part["group"].isna().tolist() == part["unresolved"].tolist()
    md = (out / "mqar" / "report" / "report.md").read_text()
    for line in md.splitlines():
        if "beats" in line:  # a ranking sentence names one n_pairs value
            assert len(set(re.findall(r"n\\_pairs=(\d+)", line))) <= 1, line
    # this tiny run learns no recall (test recall 0 everywhere, chance 1/32): the reading
    # says so first and names no best variant, in any condition (issue 31.2); the
    # per-condition sentences themselves are checked on exact numbers above
    assert "Nothing was learned" in md and "no variant is named best" in md, md[:3000]
    assert "per condition: n\\_pairs=" not in md


def test_the_schema_takes_an_extended_axis_and_the_role_keys():
    import jsonschema

    from variantlab.config.schema import experiment_schema
    from variantlab.plugin.registry import build_registry

    check = jsonschema.Draft7Validator(experiment_schema(build_registry(entry_points=False)))
    doc = {"name": "x", "model": {"family": "gpt"}, "compare_on": "loss",
           "tune": ["norm.eps"], "conditions": ["drop_rate"],
           "grid": {"measure.training.lr": {"values": [1e-3, 1e-2], "extend": True},
                    "norm.eps": [1e-5, 1e-6], "drop_rate": {"values": [0.0, 0.1]}}}
    assert [e.message for e in check.iter_errors(doc)] == []
    for bad in ({"values": [1e-3], "extend": "yes"}, {"values": []}, {"extend": 2},
                {"values": [1e-3], "extend": 0}, {"values": [1e-3], "more": 1}):
        doc["grid"]["measure.training.lr"] = bad
        assert list(check.iter_errors(doc)), bad


def test_validate_lists_each_axis_role_and_its_extension(tmp_path):
    from click.testing import CliRunner

    from variantlab.cli.main import main

    path = tmp_path / "e.yaml"
    path.write_text(exp("grid:\n  activation.kind: [gelu, relu]\n  data.n_pairs: [2, 4]\n"
                        "  measure.training.lr: {values: [1.0e-3, 1.0e-2], extend: 2}\n"
                        "data: {source: synthetic, task: recall}\n" + TRAIN))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "  activation.kind: compared\n  data.n_pairs: condition\n" \
        "  measure.training.lr: tuned, extended up to 2 per edge\n" in result.output


def test_the_effects_lead_with_the_compare_on_metric_when_it_is_summarised(tmp_path):
    from variantlab.report.effects import find_grid, grid_values, main_effects
    from variantlab.report.frame import gather

    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: [1.0e-3, 1.0e-2]\n",
                        "compare_on: recall_accuracy\ndata: {source: synthetic, task: recall}\n")
    fake_run(e, tmp_path / "runs")
    data = gather([tmp_path / "runs" / "roles"])
    grid = find_grid(data)
    rows = data.rows[data.rows["metric"].isin(["eval_loss", "test_recall_accuracy"])]
    values = grid_values(data, grid, rows[["variant", "seed", "metric", "value"]])
    assert [m for m, _, _ in grid.metrics] == ["test_recall_accuracy", "eval_loss"]
    assert grid.metrics[0][2] is False  # higher is better
    main = main_effects(grid, values)
    assert main["metric"].iloc[0] == "test_recall_accuracy"
    # relu minus gelu (fake_training, 2 pairs: gelu loses 0.1) at lr 1e-3: 0.8 - 0.1, at
    # 1e-2: 1.0 - 0.7; averaged within each seed
    relu = main[(main["metric"] == "test_recall_accuracy") & (main["value"] == "relu")]
    assert relu["effect"].iloc[0] == pytest.approx((0.7 + 0.3) / 2, abs=1e-9)


def test_a_compare_on_metric_the_run_did_not_record_falls_back_to_the_loss_and_says_so(tmp_path):
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: [1.0e-3, 1.0e-2, 1.0e-1]\n",
                        "compare_on: recall_accuracy\ndata: {source: synthetic, task: recall}\n")

    def no_recall(*args, **kwargs):
        return [r for r in fake_training(*args, **kwargs) if "recall" not in r["metric"]]

    run_experiment(e, tmp_path / "runs", probe_fn=no_recall)
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    assert set(tuned["chosen_on"]) == {"val_loss"} and "val_loss" in tuned.columns
    assert tuned.loc["activation=relu", "measure.training.lr"] == 1e-2
    assert "compare\\_on: recall\\_accuracy was not recorded by this run, so the comparison is " \
        "on the loss instead" in files.markdown.read_text()


def norm_training(name, spec, settings, *, seed, data=None, **_):
    """Validation loss (log10 lr + 2)^2 + 2 for LayerNorm; for DyT also (alpha0 - 1)^2,
    so DyT's best is alpha0 1.0, inside the grid [0.5, 1.0, 2.0]."""
    gap = (math.log10(settings.lr) + 2) ** 2
    if spec.norm.kind == "dyt":
        gap += (spec.norm.alpha0 - 1.0) ** 2 + 0.1
    loss = 2.0 + gap + 0.01 * seed
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", loss), row(name, "test_loss", loss + 0.1)]


def test_a_tuned_axis_only_some_compared_variants_have_is_left_out_for_the_others(tmp_path):
    grid = ("  norm.kind: [layer, dyt]\n  norm.alpha0: [0.5, 1.0, 2.0]\n"
            "  measure.training.lr: [1.0e-3, 1.0e-2, 1.0e-1]\n")
    e = fake_experiment(tmp_path, grid, "tune: [norm.alpha0]\n")
    names = [v.name for v in e.variants]
    # LayerNorm has no alpha0: it runs once per lr (3), DyT once per (alpha0, lr) (9)
    assert len(names) == 12 and sum("dyt" not in n for n in names) == 3
    assert not any("alpha0" in n for n in names if "dyt" not in n)
    assert e.partial_axes == {"norm.alpha0": 9}  # 3 alpha0 x 3 lr, run as 3 variants
    run_experiment(e, tmp_path / "runs", probe_fn=norm_training)
    files = write_report([tmp_path / "runs" / "roles"], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    layer, dyt = tuned.loc["norm=layer"], tuned.loc["norm=dyt"]
    assert layer["measure.training.lr"] == 1e-2 and math.isnan(layer["norm.alpha0"])
    assert dyt["measure.training.lr"] == 1e-2 and dyt["norm.alpha0"] == 1.0
    assert not tuned["unresolved"].any()
    assert dyt["vs_baseline"] == pytest.approx(0.1)
    # LayerNorm's lr curve is its three runs (no alpha0 to hold fixed): (1 + 0 + 1) / 3
    assert layer["lr_sensitivity"] == pytest.approx(2 / 3)
    assert tuned["extended"].isna().all()  # nothing beyond the grid (no NaN "values")
    # no LayerNorm run shares DyT's alpha0: norm.kind has no paired main effect; the grid's
    # averages are not verdicts (the pair row is), so the reading points to them
    md = files.markdown.read_text()
    assert "(averaged over settings and conditions: see Averages over settings and " \
        "conditions, not verdicts)" in md
    assert "no axis has a clear effect" not in md
    pair = pd.read_csv(files.verdicts, keep_default_na=False).iloc[0]
    assert (pair["a"], pair["b"], pair["kind"]) == ("norm=layer", "norm=dyt", "pair")
    # an axis no combination has is still an error (a typo), not silently dropped
    with pytest.raises(InputError) as info:
        fake_experiment(tmp_path, "  norm.kind: [layer, rms]\n  norm.alpha0: [0.5, 1.0]\n",
                        "tune: [norm.alpha0]\n")
    assert any("'norm.alpha0' names no field of the model" in m for m in info.value.messages)


def edge_training(name, spec, settings, *, seed, data=None, **_):
    """As :func:`fake_training`, but relu's best rate with 4 pairs is 1.0, the top of the
    grid [1e-3, 1e-2, 1e-1, 1.0]: unresolved there; every other best is 1e-2, inside it.
    relu is 0.05 ahead of gelu at its best in both conditions."""
    kind, pairs = spec.activation.kind, getattr(data, "n_pairs", None) or 2
    best = 1.0 if (kind, pairs) == ("relu", 4) else 1e-2
    gap = (math.log10(settings.lr) - math.log10(best)) ** 2
    acc = 0.9 + 0.05 * (kind == "relu") - 0.1 * gap
    loss = 2.0 + gap + 0.01 * seed
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", loss), row(name, "test_loss", loss + 0.1),
            row(name, "val_recall_accuracy", acc - 0.01 * seed),
            row(name, "test_recall_accuracy", acc - 0.02 * seed)]


def test_an_unresolved_best_gives_no_effect_in_its_condition(tmp_path):
    """relu's best with 4 pairs sits at the edge: that condition has no effect, so the
    verdict stands in one condition, not "holds" across both (issue 38: a mutant that
    kept the edge's effect turned it into "holds")."""
    tuned, _ = recall_report(tmp_path, "[1.0e-3, 1.0e-2, 1.0e-1, 1.0]", edge_training)
    tuned = tuned.set_index(["variant", "data.n_pairs"])
    assert tuned["unresolved"].to_dict() == {
        ("activation=gelu", 2): False, ("activation=gelu", 4): False,
        ("activation=relu", 2): False, ("activation=relu", 4): True}
    by_cond = pd.read_csv(tmp_path / "rep" / "effects_by_condition.csv")
    assert list(by_cond["condition"]) == ["n_pairs=2"]  # none for n_pairs=4
    assert list(by_cond["effect"]) == pytest.approx([0.05])
    assert list(by_cond["across_conditions"]) == ["one condition"]
