"""Metric directions and the experiment's ``compare_on`` headline metric (issue 28.3)."""

import math
from textwrap import dedent

import pytest
from conftest import exp

from variantlab.config.experiment import InputError, experiment_from_text
from variantlab.config.metrics import (
    HIGHER,
    LOWER,
    compare_on_problem,
    direction,
    headline,
    headline_of,
)
from variantlab.errors import PluginLoadError
from variantlab.plugin.probe import make_probe
from variantlab.plugin.settings import Strict
from variantlab.store.contract import RunMeta

TRAIN = "measure:\n  training: {steps: 2, batch_size: 2, seq_len: 16, eval_batches: 1}\n"


@pytest.mark.parametrize("metric, expected", [
    ("loss", LOWER), ("val_loss", LOWER), ("test_loss", LOWER), ("final_loss", LOWER),
    ("recall_accuracy", HIGHER), ("val_recall_accuracy", HIGHER),
    ("test_recall_accuracy", HIGHER), ("forward_median_s", LOWER), ("steps_to_solve", LOWER),
    ("total", None), ("grad_norm_ratio.all", None),
])
def test_each_builtin_metric_has_its_direction(metric, expected):
    assert direction(metric) == expected


def test_the_headline_chooses_on_validation_and_reports_on_test():
    loss = headline()
    assert (loss.name, loss.val, loss.test) == ("loss", "val_loss", "test_loss")
    assert loss.columns({"val_loss", "test_loss", "eval_loss"}) == ("val_loss", "test_loss")
    assert loss.columns({"eval_loss", "final_loss"}) == ("eval_loss", "eval_loss")
    acc = headline("recall_accuracy")
    assert (acc.val, acc.test, acc.direction) == ("val_recall_accuracy",
                                                  "test_recall_accuracy", HIGHER)
    # a store from before test_recall_accuracy: its test value was called recall_accuracy
    assert acc.columns({"val_recall_accuracy", "recall_accuracy"}) == (
        "val_recall_accuracy", "recall_accuracy")
    assert acc.columns({"val_loss"}) == (None, None)


def test_better_respects_the_direction_and_missing_values_are_worst():
    loss, acc = headline("loss"), headline("recall_accuracy")
    assert loss.better(2.0, 3.0) and not loss.better(3.0, 2.0)
    assert acc.better(0.9, 0.5) and not acc.better(0.5, 0.9)
    for h in (loss, acc):
        assert h.better(0.0, math.nan) and h.better(-5.0, math.inf)  # non-finite: worst
        assert h.key(math.nan) == math.inf
    assert min([0.3, 0.9, 0.5], key=acc.key) == 0.9
    assert min([0.3, 0.9, 0.5], key=loss.key) == 0.3


class _Settings(Strict):
    pass


class _Registry:
    def __init__(self, probes):
        self._probes = probes

    def probes(self):
        return self._probes


def test_a_plugin_probe_declares_its_metrics_and_may_be_compared_on():
    probe = make_probe("mine", "bleu", _Settings, lambda *a, **k: [],
                       metrics={"bleu": "higher", "latency": "lower"})
    assert probe.metrics == (("bleu", "higher"), ("latency", "lower"))
    reg = _Registry([probe])
    assert direction("bleu", reg) == HIGHER and direction("val_bleu", reg) == HIGHER
    assert direction("latency", reg) == LOWER
    h = headline("bleu", reg)
    assert (h.probe, h.val, h.test, h.lower_is_better) == ("bleu", "val_bleu", "test_bleu",
                                                            False)
    assert compare_on_problem("bleu", reg) is None
    assert "did you mean 'bleu'" in compare_on_problem("blue", reg)
    with pytest.raises(PluginLoadError, match="'up'; use 'lower' or 'higher'"):
        make_probe("mine", "bleu", _Settings, lambda *a, **k: [], metrics={"bleu": "up"})


def test_a_stored_run_names_its_headline_and_an_old_store_means_loss():
    assert headline_of(RunMeta()).name == "loss"
    assert headline_of(RunMeta(compare_on="recall_accuracy")).name == "recall_accuracy"
    # a plugin metric whose plugin is not loaded where the report runs: loss
    assert headline_of(RunMeta(compare_on="bleu")).name == "loss"
    assert RunMeta.decode(RunMeta(compare_on="recall_accuracy").stored()).compare_on == \
        "recall_accuracy"


def test_compare_on_is_accepted_for_the_recall_task():
    e = experiment_from_text(exp("compare_on: recall_accuracy\n"
                                 "data: {source: synthetic, task: recall}\n" + TRAIN))
    assert e.spec.compare_on == "recall_accuracy"
    assert experiment_from_text(exp(TRAIN)).spec.compare_on == "loss"


@pytest.mark.parametrize("body, line, message", [
    ("compare_on: recall_acuracy\n" + TRAIN, 11,
     "'recall_acuracy' is not a metric a comparison can be made on; did you mean "
     "'recall_accuracy'?"),
    ("compare_on: recall_accuracy\nmeasure: {params: {}}\n", 11,
     "recorded by probe 'training', which does not run here"),
    ("compare_on: recall_accuracy\n" + TRAIN, 11, "needs the recall task"),
])
def test_a_bad_compare_on_is_located(body, line, message):
    with pytest.raises(InputError) as info:
        experiment_from_text(exp(dedent(body)), "e.yaml")
    (msg,) = info.value.messages
    assert msg.startswith(f"e.yaml:{line}:") and "compare_on" in msg and message in msg
