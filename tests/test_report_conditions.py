"""The reading of runs without tuned axes (issue 28 follow-up): variants are compared only
within one condition (data keys, sizes, ``conditions:``), on the headline metric, with
verdict words only where the paired 95% t-interval over seeds excludes 0; a run whose
axes are all conditions (a pilot) lists the headline per condition and ranks nothing.
A fake training probe gives exact numbers; nothing trains."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from conftest import TINY_MODEL

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.executors.runner import run_experiment
from variantlab.plugin.rows import row
from variantlab.report import write_report

REG = vl.get_registry()
# test recall accuracy per activation and n_pairs, seed by seed (seeds 0, 1, 2)
ACC = {("gelu", 2): (0.80, 0.81, 0.79), ("relu", 2): (0.91, 0.90, 0.905),
       ("silu", 2): (0.835, 0.775, 0.805),
       ("gelu", 4): (0.70, 0.71, 0.69), ("relu", 4): (0.61, 0.60, 0.605),
       ("silu", 4): (0.68, 0.62, 0.65)}
# the pilot: by emb_dim and n_pairs
PILOT = {(32, 2): (0.5, 0.6), (32, 4): (0.25, 0.35), (64, 2): (1.0, 1.0), (64, 4): (0.9, 0.8)}
T2 = 4.302652730  # Student t, 0.975, 2 degrees of freedom


def _rows(name, acc, test_loss=None):
    """A training run's rows with recall accuracy ``acc`` and loss one minus it (``test_loss``:
    another test loss)."""
    loss = 1.0 - acc
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", loss), row(name, "eval_loss", loss),
            row(name, "test_loss", loss + 0.1 if test_loss is None else test_loss),
            row(name, "val_recall_accuracy", acc),
            row(name, "test_recall_accuracy", acc), row(name, "init_loss", 4.0),
            row(name, "loss_noise", 0.01), row(name, "chance_recall_accuracy", 1 / 32),
            row(name, "recall_noise", 0.005)]


def fake_training(name, spec, settings, *, seed, data=None, **_):
    return _rows(name, ACC[(spec.activation.kind, data.n_pairs)][seed])


def disagreeing(name, spec, settings, *, seed, data=None, **_):
    """ACC's recall accuracy; a test loss 0.3 (+0.01 a seed) worse for relu, which leads on
    recall accuracy at 2 pairs."""
    kind = spec.activation.kind
    loss = 1.0 + 0.01 * seed if kind == "gelu" else 1.3 + 0.02 * seed
    return _rows(name, ACC[(kind, data.n_pairs)][seed], test_loss=loss)


def pilot_training(name, spec, settings, *, seed, data=None, **_):
    return _rows(name, PILOT[(spec.emb_dim, data.n_pairs)][seed])


def tuned_pilot(name, spec, settings, *, seed, data=None, **_):
    """PILOT's accuracy, 0.05 higher at a learning rate above 5e-3."""
    return _rows(name, PILOT[(spec.emb_dim, data.n_pairs)][seed] + 0.05 * (settings.lr > 5e-3))


def report(tmp_path, grid: str, seeds: str = "[0, 1, 2]", probe_fn=fake_training,
           more: str = "") -> tuple[str, list[str], object]:
    """report.md, its reading's lines (as text) and the files of a run of ``grid`` (the
    fake probe; ``more``: further experiment text)."""
    text = (f"name: cond\nseeds: {seeds}\nmodel: {TINY_MODEL}\ncompare_on: recall_accuracy\n"
            "data: {source: synthetic, task: recall}\n" + more +
            f"grid:\n{grid}measure:\n  training: {{steps: 2, batch_size: 2, seq_len: 16, "
            "lr: 0.001}\n")
    path = tmp_path / "cond.yaml"
    path.write_text(text)
    run_experiment(experiment_from_text(text, path), tmp_path / "runs", probe_fn=probe_fn)
    files = write_report([tmp_path / "runs" / "cond"], tmp_path / "rep", registry=REG)
    md = files.markdown.read_text()
    reading = md[md.index("## Reading"):md.index("Baseline:")]
    lines = [re.sub(r"\\(.)", r"\1", line[2:]) for line in reading.splitlines()
             if line.startswith("- ")]  # Markdown's escapes undone
    return md, lines, files


def _interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of three paired differences, computed here."""
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    half = T2 * sd / math.sqrt(3)
    return mean, mean - half, mean + half


def _diffs(a: tuple, b: tuple) -> list[float]:
    return [x - y for x, y in zip(a, b)]


def test_the_numbers_behind_the_sentences():
    """The intervals the sentences below print, from ACC by hand."""
    mean, low, high = _interval(_diffs(ACC[("relu", 2)], ACC[("silu", 2)]))
    assert (mean, low > 0) == (pytest.approx(0.1), True)  # relu clearly ahead at 2 pairs
    mean, low, high = _interval(_diffs(ACC[("gelu", 4)], ACC[("silu", 4)]))
    assert mean == pytest.approx(0.05) and low < 0 < high  # gelu, silu: not clear at 4
    mean, low, high = _interval(_diffs(ACC[("relu", 2)], ACC[("gelu", 2)]))
    assert (mean, low, high) == (pytest.approx(0.105), pytest.approx(0.07214, abs=1e-5),
                                 pytest.approx(0.1379, abs=1e-4))
    mean, low, high = _interval(_diffs(ACC[("silu", 2)], ACC[("gelu", 2)]))
    assert (mean, low, high) == (pytest.approx(0.005), pytest.approx(-0.08457, abs=1e-5),
                                 pytest.approx(0.09457, abs=1e-5))
    mean, low, high = _interval(_diffs(ACC[("silu", 4)], ACC[("gelu", 4)]))
    assert (low, high) == (pytest.approx(-0.1396, abs=1e-4), pytest.approx(0.03957, abs=1e-5))
    mean, low, high = _interval(_diffs(ACC[("relu", 4)], ACC[("gelu", 4)]))
    assert (mean, low, high) == (pytest.approx(-0.095), pytest.approx(-0.1279, abs=1e-4),
                                 pytest.approx(-0.06214, abs=1e-5))


def test_two_conditions_are_never_ranked_against_each_other(tmp_path):
    md, lines, files = report(tmp_path, "  activation.kind: [gelu, relu, silu]\n"
                                        "  data.n_pairs: [2, 4]\n")
    text = "\n".join(lines)
    # nothing ranks all six variants together; every sentence that compares names one n_pairs
    assert "Best variant by" not in text and "eval loss is" not in text
    assert ("Compared only within each condition of data.n_pairs, never across: 3 compared "
            "variants on test_recall_accuracy; see Effects by condition and "
            "effects_by_condition.csv.") in lines
    # every pair within each condition, Holm over its three pairs (intervals above)
    assert ("On test_recall_accuracy, every pair compared within each condition (a minus b, "
            "95% interval; Holm over each condition's pairs): n_pairs=2: activation=gelu lower "
            "than activation=relu (-0.105 [-0.1379, -0.07214]); activation=relu higher than "
            "activation=silu (0.1 [0.0379, 0.1621]); activation=gelu and activation=silu not "
            "clearly different (-0.005 [-0.09457, 0.08457]; a difference up to 0.09457 is not "
            "ruled out) — n_pairs=4: activation=gelu higher than activation=relu (0.095 "
            "[0.06214, 0.1279]); the other 2 pairs not clearly different (differences up to "
            "0.1396 not ruled out).") in lines
    # gelu vs relu: lower at 2 pairs, higher at 4, both intervals exclude 0: a flip
    assert ("Across conditions: activation=gelu vs activation=relu flips: lower at n_pairs=2, "
            "higher at n_pairs=4; 2 pair(s) without one clear verdict in every condition, so "
            "nothing holds across conditions for them.") in lines
    verdicts = pd.read_csv(files.verdicts, keep_default_na=False)
    pairs = verdicts[verdicts["kind"] == "pair"]
    assert list(pairs["verdict"]) == ["lower", "not clearly different", "higher", "higher",
                                      "not clearly different", "not clearly different"]
    assert set(pairs["caveats"]) == {"one rate only (not tuned)"}
    by_cond = pd.read_csv(files.by_condition)
    assert list(by_cond["value"]) == ["relu", "relu", "silu", "silu"]
    assert list(by_cond["condition"]) == ["n_pairs=2", "n_pairs=4"] * 2
    assert list(by_cond["effect"]) == pytest.approx([0.105, -0.095, 0.005, -0.05])
    assert list(by_cond["low"]) == pytest.approx([0.0721379, -0.127862, -0.0845669, -0.139567],
                                                 abs=1e-6)
    # relu: both intervals exclude 0, opposite signs: flips; silu's include 0: unclear
    assert list(by_cond["across_conditions"]) == ["flips", "flips", "unclear", "unclear"]
    assert files.tuned is None  # nothing was tuned: no tuned comparison


def test_the_verdict_holds_across_conditions_when_one_variant_leads_in_each(tmp_path):
    _, lines, _ = report(tmp_path, "  activation.kind: [gelu, relu]\n  data.n_pairs: [2, 4]\n")
    assert ("On test_recall_accuracy, every pair compared within each condition (a minus b, "
            "95% interval; Holm over each condition's pairs): n_pairs=2: activation=gelu lower "
            "than activation=relu (-0.105 [-0.1379, -0.07214]) — n_pairs=4: activation=gelu "
            "higher than activation=relu (0.095 [0.06214, 0.1279]).") in lines
    assert ("Across conditions: activation=gelu vs activation=relu flips: lower at n_pairs=2, "
            "higher at n_pairs=4.") in lines
    # no other sentence compares them
    assert not any(line.startswith("By test recall accuracy") for line in lines)


def test_one_seed_gives_the_numbers_and_no_verdict(tmp_path):
    _, lines, _ = report(tmp_path, "  activation.kind: [gelu, relu, silu]\n"
                                   "  data.n_pairs: [2, 4]\n", seeds="[0]")
    assert ("On test_recall_accuracy, every pair compared within each condition (a minus b, "
            "95% interval; Holm over each condition's pairs): n_pairs=2: activation=gelu 0.8, "
            "activation=relu 0.91 (one seed: no interval, so no verdict); activation=gelu 0.8, "
            "activation=silu 0.835 (one seed: no interval, so no verdict); activation=relu "
            "0.91, activation=silu 0.835 (one seed: no interval, so no verdict) — n_pairs=4: "
            "activation=gelu 0.7, activation=relu 0.61 (one seed: no interval, so no verdict); "
            "activation=gelu 0.7, activation=silu 0.68 (one seed: no interval, so no verdict); "
            "activation=relu 0.61, activation=silu 0.68 (one seed: no interval, so no "
            "verdict).") in lines
    assert not any(line.startswith("Across conditions") for line in lines)
    assert not any(w in line for line in lines for w in ("better", "worse", "beats", "ahead"))


def test_a_pilot_lists_the_headline_per_condition_and_ranks_nothing(tmp_path):
    md, lines, files = report(tmp_path, "  emb_dim: [32, 64]\n  data.n_pairs: [2, 4]\n",
                              seeds="[0, 1]", probe_fn=pilot_training)
    assert ("Nothing is compared here: every axis is a condition (the task or scale), so no "
            "variant is ranked. test_recall_accuracy per condition: n_pairs=2, emb_dim=32: "
            "0.55 [-0.08531, 1.185]; n_pairs=4, emb_dim=32: 0.3 [-0.3353, 0.9353]; n_pairs=2, "
            "emb_dim=64: 1 [1, 1]; n_pairs=4, emb_dim=64: 0.85 [0.2147, 1.485].") in lines
    text = "\n".join(lines)
    for word in ("Best", "best", "beats", "better", "worse", "ahead", "leads"):
        assert word not in text, (word, text)
    assert files.by_condition is None  # nothing compared: no effect per condition


def test_a_tuned_pilot_lists_each_condition_at_its_best_setting(tmp_path):
    """The zoology pilot's shape: conditions on the grid, named variants that set a learning
    rate (a tuned axis) in one condition; still one compared variant, so no ranking."""
    _, lines, files = report(
        tmp_path, "  emb_dim: [32, 64]\n  data.n_pairs: [2, 4]\n", "[0, 1]", tuned_pilot,
        "variants:\n  - {name: w32-p2-fast, set: {emb_dim: 32, data.n_pairs: 2, "
        "measure.training.lr: 0.01}}\n")
    assert ("Nothing is compared here: every axis is a condition (the task or scale), so no "
            "variant is ranked. test_recall_accuracy at its best setting per condition: "
            "n_pairs=2, emb_dim=32: 0.6 [-0.03531, 1.235]; n_pairs=4, emb_dim=32: 0.3 [-0.3353, "
            "0.9353]; n_pairs=2, emb_dim=64: 1 [1, 1]; n_pairs=4, emb_dim=64: 0.85 [0.2147, "
            "1.485].") in lines
    tuned = pd.read_csv(files.tuned)
    assert list(tuned["measure.training.lr"]) == [0.01, 0.001, 0.001, 0.001]
    assert not any(w in line for line in lines for w in ("Best", "beats", "ahead", "leads"))


def test_speed_is_compared_within_the_baselines_condition():
    from variantlab.report import build_context, gather
    from variantlab.testing.sample import sample_grid

    # sample timings: variant i runs 10 ms x (1 + 0.5 i) per forward; i = 0 (layer, 32),
    # 1 (layer, 64), 2 (rms, 32), 3 (rms, 64): the wider layer model (i = 1) is slower than
    # the baseline but is another size, so only rms at width 32 is compared
    run = sample_grid({"norm.kind": ["layer", "rms"], "emb_dim": [32, 64]}, seeds=(0, 1, 2))
    reading = build_context(gather([run]), REG)[0]["reading"]
    speed = [line for line in reading if line.startswith("forward+backward")]
    assert speed == ["forward+backward (within the baseline's condition, emb_dim=32): norm=rms, "
                     "emb_dim=32 is 1.98x slower than norm=layer, emb_dim=32 on every seed (n=3, "
                     "per-seed 1.96x to 2.00x)."]
    assert not any(line.startswith("Best variant by") for line in reading)


def test_a_metric_that_disagrees_with_the_headline_is_said_per_condition(tmp_path):
    _, lines, files = report(tmp_path, "  activation.kind: [gelu, relu]\n  data.n_pairs: [2, 4]\n",
                             probe_fn=disagreeing)
    # issue 37.1: the sentence is rendered from a lead row, which verdicts.csv holds
    rows = pd.read_csv(files.verdicts)
    led = rows[(rows["kind"] == "lead") & (rows["metric"] == "test_loss")]
    assert led[["condition", "a", "b", "n_seeds", "verdict"]].values.tolist() == [
        ["n_pairs=2", "activation=gelu", "activation=relu", 3, "lower"]]
    assert led["estimate"].tolist() == pytest.approx([-0.31])
    # relu - gelu test loss per seed: 0.30, 0.31, 0.32: mean 0.31, 95% [0.2852, 0.3348]; at 4
    # pairs gelu leads on both metrics, so nothing disagrees there
    assert [line for line in lines if "by test loss" in line] == [
        "n_pairs=2: by test loss, activation=gelu leads (1.01 vs 1.32 for activation=relu, "
        "ahead by 0.31 [0.2852, 0.3348] over 3 seeds), where by test recall accuracy "
        "activation=relu leads."]
