"""gradients probe: seed 004's numbers, hand-computed norms, averaging before the norm."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData
from variantlab.model.build import resolve_spec
from variantlab.model.tasks import task_for
from variantlab.probes import run_probe

REG = vl.get_registry()

NO_SHORTCUT = [2.0174e-04, 1.2011e-04, 7.1520e-04, 1.3989e-03, 5.0496e-03]
WITH_SHORTCUT = [0.22170, 0.20694, 0.32897, 0.26657, 1.32585]
SETTINGS = {"batch_size": 2, "seq_len": 8, "batches": 1}


def pick(rows, metric, scope):
    return {(r["name"], r["layer"]): r["value"] for r in rows
            if r["metric"] == metric and r["scope"] == scope}


@pytest.mark.parametrize("shortcut, expected", [(False, NO_SHORTCUT), (True, WITH_SHORTCUT)])
def test_seed_shortcut_experiment(shortcut, expected):
    spec = {
        "family": "mlp", "layer_sizes": [3, 3, 3, 3, 3, 1], "inputs": [[1, 0, -1]],
        "activation": {"kind": "gelu", "approximate": "tanh"}, "norm": {"kind": "none"},
        "residual": {"kind": "pre_norm", "shortcut": shortcut},
    }
    rows = run_probe("gradients", spec, {"batches": 1}, seed=123, registry=REG)
    grads = pick(rows, "mean_abs_grad", "parameter")
    weights = [v for (name, _), v in grads.items() if name.endswith("weight")]
    assert weights == pytest.approx(expected, rel=1e-4)
    layers = [layer for (name, layer) in grads if name.endswith("weight")]
    assert layers == [0, 1, 2, 3, 4]


def hand_grads(tiny, seed, n):
    spec = resolve_spec(tiny, REG)
    torch.manual_seed(seed)
    model = vl.build_model(spec, REG)
    batches = datalib.batches(SyntheticData(), spec, 2, 8, n, seed=seed, registry=REG)
    per_batch = []
    for b in batches:
        model.zero_grad()
        task_for(spec, REG).loss(spec, model(**b.inputs), b).backward()
        per_batch.append({k: p.grad.clone() for k, p in model.named_parameters()})
    return model, per_batch


def test_norms_equal_a_hand_computation(tiny):
    rows = run_probe("gradients", tiny, {**SETTINGS, "mode": "eval"}, seed=4, registry=REG)
    _, (g,) = hand_grads(tiny, 4, 1)
    name = next(k for k in g if k.startswith("trf_blocks.1.ff.") and k.endswith("weight"))
    w = g[name]
    assert pick(rows, "grad_norm", "parameter")[(name, 1)] == pytest.approx(float(w.norm()), rel=1e-5)
    assert pick(rows, "mean_abs_grad", "parameter")[(name, 1)] == pytest.approx(
        float(w.abs().mean()), rel=1e-5)
    assert pick(rows, "max_abs_grad", "parameter")[(name, 1)] == pytest.approx(
        float(w.abs().max()), rel=1e-5)
    layer1 = [v for k, v in g.items() if k.startswith("trf_blocks.1.")]
    expected_all = math.sqrt(sum(float(v.double().pow(2).sum()) for v in layer1))
    assert pick(rows, "grad_norm", "layer")[("all", 1)] == pytest.approx(expected_all, rel=1e-5)
    ff = [v for k, v in g.items() if k.startswith("trf_blocks.1.ff.sublayer.")]
    expected_ff = math.sqrt(sum(float(v.double().pow(2).sum()) for v in ff))
    assert pick(rows, "grad_norm", "layer")[("feedforward", 1)] == pytest.approx(expected_ff, rel=1e-5)
    mats = [v for k, v in g.items() if k.startswith("trf_blocks.1.") and v.ndim >= 2]
    expected_w = sum(float(v.abs().sum()) for v in mats) / sum(v.numel() for v in mats)
    assert pick(rows, "mean_abs_grad", "layer")[("weights", 1)] == pytest.approx(expected_w, rel=1e-5)


def test_gradients_are_averaged_over_batches_before_the_norm(tiny):
    rows = run_probe("gradients", tiny, {**SETTINGS, "batches": 3}, seed=2, registry=REG)
    _, grads = hand_grads(tiny, 2, 3)
    name = "trf_blocks.0.att.sublayer.W_query.weight"
    mean_grad = sum(g[name] for g in grads) / 3
    got = pick(rows, "grad_norm", "parameter")[(name, 0)]
    assert got == pytest.approx(float(mean_grad.norm()), rel=1e-5)
    mean_of_norms = sum(float(g[name].norm()) for g in grads) / 3
    assert got < mean_of_norms * 0.99  # not the average of per-batch norms


def test_row_schema_and_residual_rms(tiny):
    rows = run_probe("gradients", {**tiny, "n_layers": 3}, SETTINGS, seed=0, registry=REG)
    assert {r["scope"] for r in rows} == {"model", "parameter", "layer"}
    rms = pick(rows, "residual_rms", "layer")
    assert sorted(layer for _, layer in rms) == [0, 1, 2]
    assert all(v > 0 for v in rms.values())
    loss = pick(rows, "loss", "model")[("", None)]
    assert 3.0 < loss < 6.0  # about ln(64) = 4.16 at initialisation
    slots = {name for name, _ in pick(rows, "grad_norm", "layer")}
    assert slots == {"attention", "feedforward", "norm", "all", "weights"}


def test_residual_rms_matches_the_layer_output(tiny):
    spec = resolve_spec(tiny, REG)
    rows = run_probe("gradients", tiny, SETTINGS, seed=1, registry=REG)
    torch.manual_seed(1)
    model = vl.build_model(spec, REG)
    (batch,) = datalib.batches(SyntheticData(), spec, 2, 8, 1, seed=1, registry=REG)
    with torch.no_grad():
        h = model.trf_blocks[0](model.embed(batch.inputs["idx"]))
    assert pick(rows, "residual_rms", "layer")[("", 0)] == pytest.approx(
        float(h.pow(2).mean().sqrt()), rel=1e-5)


def test_nan_loss_raises_naming_the_variant(tiny, monkeypatch):
    spec = resolve_spec(tiny, REG)
    task = type(vl.task_for(spec, REG))
    monkeypatch.setattr(task, "loss", lambda self, spec, out, batch: out.sum() * float("nan"))
    with pytest.raises(FloatingPointError, match="non-finite outputs") as info:
        run_probe("gradients", spec, SETTINGS, seed=0, registry=REG)
    assert "norm layer" in str(info.value) and "family gpt" in str(info.value)
