"""training probe: loss falls on a learnable task; a huge learning rate is flagged."""

import math

import pytest

from variantlab.probes import run_probe, training
from variantlab.settings import SyntheticData, TrainingSettings

RECALL = SyntheticData(task="recall")


def curve(rows):
    return [r["value"] for r in sorted((r for r in rows if r["metric"] == "loss"),
                                       key=lambda r: r["step"])]


def model_rows(rows):
    return {r["metric"]: r["value"] for r in rows if r["step"] is None}


def test_loss_decreases_on_a_tiny_model(tiny):
    settings = {"steps": 30, "lr": 3e-3, "batch_size": 8, "seq_len": 32, "device": "cpu"}
    rows = run_probe("training", tiny, settings, seed=0, data=RECALL)
    losses = curve(rows)
    assert len(losses) == 30
    assert [r["step"] for r in rows if r["metric"] == "loss"] == list(range(30))
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.2
    m = model_rows(rows)
    assert m["final_loss"] == losses[-1]
    assert m["best_loss"] == min(losses)
    assert m["diverged"] == 0.0


def test_same_seed_same_curve(tiny):
    settings = {"steps": 5, "lr": 1e-3, "batch_size": 4, "seq_len": 16, "device": "cpu"}
    a = curve(run_probe("training", tiny, settings, seed=3))
    b = curve(run_probe("training", tiny, settings, seed=3))
    assert a == b


def test_huge_learning_rate_is_flagged(tiny):
    settings = {"steps": 20, "lr": 1e4, "batch_size": 4, "seq_len": 16, "grad_clip": None,
                "weight_decay": 0.0, "device": "cpu"}
    rows = run_probe("training", tiny, settings, seed=0, data=RECALL)
    m = model_rows(rows)
    assert m["diverged"] == 1.0
    losses = curve(rows)
    assert not math.isfinite(losses[-1]) or losses[-1] > losses[0]


def test_linear_warmup():
    s = TrainingSettings(lr=1e-3, warmup_steps=4)
    assert [training.lr_at(i, s) for i in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
