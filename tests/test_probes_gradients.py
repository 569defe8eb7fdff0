"""gradients probe: seed 004's numbers, hand-computed norms, averaging before the norm."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData
from variantlab.model.build import resolve_spec
from variantlab.model.tasks import task_for
from variantlab.probes import gradients, run_probe
from variantlab.probes.gradients import GradientsSettings, grad_stats

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
        loss = task_for(spec, REG).loss(spec, model(**b.inputs), b)
        loss.backward()
        per_batch.append({k: p.grad.clone() for k, p in model.named_parameters()})
        per_batch[-1]["<loss>"] = loss.detach()
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
    # the loss row is the mean of the three batches' losses
    mean_loss = sum(float(g["<loss>"]) for g in grads) / 3
    assert pick(rows, "loss", "model")[("", None)] == pytest.approx(mean_loss, rel=1e-6)


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
    assert "the loss is nan on batch 1 of 1 at initialisation" in str(info.value)


def test_default_settings():
    """Eight rows of 128 positions, four batches, dropout on: the documented defaults."""
    assert GradientsSettings().model_dump() == {
        "batch_size": 8, "seq_len": 128, "batches": 4, "mode": "train"}


def test_grad_stats_by_hand():
    """Mean |g| divides by the element count (one element: by 1); no elements give zeros,
    not a division by zero or a made-up maximum."""
    one = grad_stats([torch.tensor([-3.0])])
    assert one == {"mean_abs_grad": 3.0, "grad_norm": 3.0, "max_abs_grad": 3.0}
    two = grad_stats([torch.tensor([3.0, -4.0]), torch.tensor([[0.0]])])
    assert two == {"mean_abs_grad": 7.0 / 3, "grad_norm": 5.0, "max_abs_grad": 4.0}
    assert grad_stats([torch.zeros(0)]) == {
        "mean_abs_grad": 0.0, "grad_norm": 0.0, "max_abs_grad": 0.0}


def test_device_left_unset_is_the_cpu(tiny, monkeypatch):
    """``device`` None means the CPU (not ``auto``); a named device is passed on as named."""
    asked = []

    def spy(requested):
        asked.append(requested)
        return torch.device("cpu")

    monkeypatch.setattr(gradients, "resolve_device", spy)
    spec = resolve_spec(tiny, REG)
    gradients.run(spec, GradientsSettings(**SETTINGS), seed=0, registry=REG)
    gradients.run(spec, GradientsSettings(**SETTINGS), seed=0, registry=REG, device="cuda:3")
    assert asked == ["cpu", "cuda:3"]


def test_mode_switches_dropout(tiny):
    """With dropout 0.5, eval mode gives the dropout-free gradient of a hand-run model in eval
    mode; train mode gives the hand-run model's in train mode (same seed: same masks)."""
    spec = {**tiny, "drop_rate": 0.5}
    name = "trf_blocks.1.ff.sublayer.layers.0.weight"
    _, (train,) = hand_grads(spec, 4, 1)  # a freshly built model is in train mode
    resolved = resolve_spec(spec, REG)
    torch.manual_seed(4)
    model = vl.build_model(resolved, REG).eval()
    (b,) = datalib.batches(SyntheticData(), resolved, 2, 8, 1, seed=4, registry=REG)
    task_for(resolved, REG).loss(resolved, model(**b.inputs), b).backward()
    clean = float(dict(model.named_parameters())[name].grad.norm())
    norms = {mode: pick(run_probe("gradients", spec, {**SETTINGS, "mode": mode}, seed=4,
                                  registry=REG), "grad_norm", "parameter")[(name, 1)]
             for mode in ("eval", "train")}
    assert norms["eval"] == pytest.approx(clean, rel=1e-5)
    assert norms["train"] == pytest.approx(float(train[name].norm()), rel=1e-5)
    assert norms["train"] != pytest.approx(clean, rel=1e-2)


def test_frozen_parameters_are_skipped_and_the_rest_measured(tiny, monkeypatch):
    """A parameter without requires_grad gets no row; every parameter after it still does."""
    build = gradients.make_model

    def frozen_embedding(*args, **kwargs):
        model = build(*args, **kwargs)
        model.embed.tok_emb.weight.requires_grad_(False)
        return model

    monkeypatch.setattr(gradients, "make_model", frozen_embedding)
    rows = run_probe("gradients", tiny, SETTINGS, seed=0, registry=REG)
    names = {name for name, _ in pick(rows, "grad_norm", "parameter")}
    model = vl.build_model(tiny, REG)
    assert names == {n for n, _ in model.named_parameters()} - {"embed.tok_emb.weight"}


def test_weights_row_takes_every_weight_tensor_of_two_or_more_dims(tiny):
    """Layer 1's ``weights`` row: the projections, the feedforward matrices and the
    depthwise conv's (32, 1, 3) kernel; not the batch norm's 1-D ``bn.weight`` nor biases."""
    spec = {**tiny, "norm": "batch", "attention": {"kind": "short_conv", "width": 3}}
    with pytest.warns(UserWarning, match="batch statistics"):
        rows = run_probe("gradients", spec, SETTINGS, seed=3, registry=REG)
        _, (g,) = hand_grads(spec, 3, 1)
    names = ["att.sublayer.W_in.weight", "att.sublayer.conv.weight",
             "att.sublayer.out_proj.weight", "ff.sublayer.layers.0.weight",
             "ff.sublayer.layers.2.weight"]
    mats = [g[f"trf_blocks.1.{n}"] for n in names]
    expected = sum(float(v.abs().sum()) for v in mats) / (2 * 32 * 32 + 32 * 3 + 2 * 128 * 32)
    assert pick(rows, "mean_abs_grad", "layer")[("weights", 1)] == pytest.approx(expected, rel=1e-5)


def test_residual_rms_is_the_mean_over_batches(tiny):
    """Two batches: layer 0's residual_rms is the mean of its two outputs' RMS."""
    spec = resolve_spec(tiny, REG)
    rows = run_probe("gradients", tiny, {**SETTINGS, "batches": 2}, seed=1, registry=REG)
    torch.manual_seed(1)
    model = vl.build_model(spec, REG)
    rms = []
    for batch in datalib.batches(SyntheticData(), spec, 2, 8, 2, seed=1, registry=REG):
        with torch.no_grad():
            h = model.trf_blocks[0](model.embed(batch.inputs["idx"]))
        rms.append(float(h.pow(2).mean().sqrt()))
    assert pick(rows, "residual_rms", "layer")[("", 0)] == pytest.approx(sum(rms) / 2, rel=1e-5)
