"""still_improving judged on the headline metric's validation curve where the run recorded
one (issue 28 follow-up): a recall run at recall accuracy 1.00 is not still improving,
however its loss falls. Constructed curves and a fake training probe; nothing trains."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import TINY_MODEL

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.executors.runner import run_experiment
from variantlab.plugin.rows import row
from variantlab.report import write_report
from variantlab.report.converged import best_possible, curve_improving

REG = vl.get_registry()
CHANCE = 1 / 32
QUERIES = 1000  # the recall noise below is that of a chance accuracy over this many queries
RECALL = {"chance_recall_accuracy": CHANCE,
          "recall_noise": math.sqrt(CHANCE * (1 - CHANCE) / QUERIES)}


def test_an_accuracy_at_its_best_possible_value_is_not_improving():
    assert best_possible("recall_accuracy", higher=True) == 1.0
    assert best_possible("loss", higher=False) is None
    solved = [(250, 0.5), (500, 0.9), (750, 1.0), (1000, 1.0)]
    assert curve_improving(solved, True, 1.0, RECALL, 1000) is False


def test_an_accuracy_still_rising_beyond_its_noise_is_improving():
    # reference: the best evaluation up to step 800 (0.6); gain 0.3; the difference of two
    # accuracies near 0.75 over 1000 queries has se sqrt(2 x 0.75 x 0.25 / 1000) = 0.0194
    rising = [(250, 0.3), (500, 0.5), (750, 0.6), (1000, 0.9)]
    assert curve_improving(rising, True, 1.0, RECALL, 1000) is True
    # gain 0.02 against 2 se = 2 sqrt(2 x 0.61 x 0.39 / 1000) = 0.0436: within the noise
    flat = [(250, 0.3), (500, 0.5), (750, 0.6), (1000, 0.62)]
    assert curve_improving(flat, True, 1.0, RECALL, 1000) is False
    # the reference is the best up to four fifths, not the last before the end
    dipped = [(250, 0.3), (500, 0.7), (750, 0.6), (1000, 0.72)]
    assert curve_improving(dipped, True, 1.0, RECALL, 1000) is False


def test_a_loss_curve_is_judged_against_the_step_noise_scaled_to_the_validation_set():
    # 512 training targets per step, 8192 validation targets: the step noise x sqrt(1/16)
    unit = {"loss_noise": 0.2, "tokens": 400 * 512.0, "val_tokens": 8192.0}
    curve = [(100, 2.0), (200, 1.5), (400, 1.4)]  # reference (steps <= 320): 1.5; gain 0.1
    # 2 se = 2 x sqrt(2) x 0.2 x 0.25 = 0.1414 > 0.1: not beyond the noise
    assert curve_improving(curve, False, None, unit, 400) is False
    # half the noise: 2 se = 0.0707 < 0.1
    assert curve_improving(curve, False, None, dict(unit, loss_noise=0.1), 400) is True


def test_a_curve_with_nothing_to_compare_keeps_the_loss_rule():
    assert curve_improving([(1000, 0.5)], True, 1.0, RECALL, 1000) is None
    assert curve_improving([(900, 0.4), (1000, 0.5)], True, 1.0, RECALL, 1000) is None
    assert curve_improving([], True, 1.0, RECALL, 1000) is None


CURVES = {"gelu": (0.5, 1.0, 1.0), "relu": (0.3, 0.5, 0.8)}  # at steps 4, 8 and 10


def fake_training(name, spec, settings, *, seed, data=None, **_):
    """Ten steps of a falling loss (the stored loss rule says: still improving for gelu,
    not for relu) and a validation recall curve (gelu solved, relu rising)."""
    kind = spec.activation.kind
    curve = CURVES[kind]
    rows = [row(name, "loss", 4.0 - 0.3 * step, step=step) for step in range(10)]
    rows += [row(name, "val_recall_accuracy_curve", acc, unit="fraction", step=at)
             for at, acc in zip((4, 8, 10), curve)]
    rows += [row(name, "still_improving", 1.0 if kind == "gelu" else 0.0),
             row(name, "diverged", 0.0), row(name, "val_loss", 1.0), row(name, "test_loss", 1.1),
             row(name, "val_recall_accuracy", curve[-1]),
             row(name, "test_recall_accuracy", curve[-1] - 0.01 * seed),
             *[row(name, k, v) for k, v in RECALL.items()]]
    return rows


@pytest.mark.parametrize("compare_on, expected", [("recall_accuracy", {"gelu": 0, "relu": 1}),
                                                   ("loss", {"gelu": 1, "relu": 0})])
def test_the_report_judges_on_the_headline_curve_and_the_store_keeps_the_loss_rule(
        tmp_path, compare_on, expected):
    text = (f"name: conv\nseeds: [0, 1]\nmodel: {TINY_MODEL}\ncompare_on: {compare_on}\n"
            "data: {source: synthetic, task: recall}\ngrid:\n  activation.kind: [gelu, relu]\n"
            "measure:\n  training: {steps: 10, batch_size: 2, seq_len: 16, eval_every: 4}\n")
    path = tmp_path / "conv.yaml"
    path.write_text(text)
    run_experiment(experiment_from_text(text, path), tmp_path / "runs", probe_fn=fake_training)
    files = write_report([tmp_path / "runs" / "conv"], tmp_path / "rep", registry=REG)
    summary = pd.read_csv(files.csv)
    got = summary[summary["metric"] == "still_improving"].set_index("variant")["mean"]
    # recall headline: gelu solved (1.00) is not improving, relu's gain 0.3 is beyond the
    # noise; loss headline: no validation loss curve, so the stored loss rule stands
    assert got.to_dict() == {"activation=gelu": expected["gelu"],
                             "activation=relu": expected["relu"]}
    rows = vl.results(tmp_path / "runs" / "conv")
    stored = rows[rows["metric"] == "still_improving"].groupby("activation.kind")["value"].mean()
    assert stored.to_dict() == {"gelu": 1.0, "relu": 0.0}
