"""The dynamics probe: six quantities per layer at the chosen interval, checked by hand."""

import math

import pytest
import torch

import variantlab as vl
from variantlab import build_model, parse_model_spec
from variantlab.data import sources as datalib
from variantlab.model.tasks import task_for
from variantlab.probes import run_probe
from variantlab.probes.dynamics import METRICS, layer_params

REG = vl.get_registry()

SETTINGS = {"steps": 5, "every": 2, "batch_size": 2, "seq_len": 16, "device": "cpu"}


def by(rows, metric):
    return {(r["layer"], r["step"]): r["value"] for r in rows if r["metric"] == metric}


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_records_six_quantities_per_layer_every_k_steps(tiny, impl):
    spec = parse_model_spec({**tiny, "attention": {"kind": "mha", "impl": impl}}, REG)
    rows = run_probe("dynamics", spec, SETTINGS, seed=1, registry=REG)
    for metric in METRICS:
        got = by(rows, metric)
        assert set(got) == {(i, s) for i in (0, 1) for s in (0, 2, 4)}, metric
        assert all(math.isfinite(v) for v in got.values()), metric
    assert all(r["scope"] == "layer" for r in rows if r["metric"] in METRICS)
    assert sorted(r["step"] for r in rows if r["metric"] == "loss") == [0, 2, 4]
    # 4 heads over at most 16 causal positions: entropy within [0, log 16]
    assert all(0 <= v <= math.log(16) + 1e-6 for v in by(rows, "attn_entropy").values())
    assert all(v > 0 for v in by(rows, "update_ratio").values())


def test_naive_and_sdpa_report_the_same_attention_numbers(tiny):
    naive, sdpa = (run_probe("dynamics", parse_model_spec(
        {**tiny, "attention": {"kind": "mha", "impl": impl}}, REG), SETTINGS, seed=2, registry=REG)
        for impl in ("naive", "sdpa"))
    for metric in ("max_attn_logit", "attn_entropy", "first_token_mass", "residual_rms",
                   "grad_norm"):
        a, b = by(naive, metric), by(sdpa, metric)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (metric, key)


def test_max_logit_and_entropy_match_a_hand_computation(tiny):
    spec = parse_model_spec(tiny, REG)
    rows = run_probe("dynamics", spec, {**SETTINGS, "steps": 1}, seed=5, registry=REG)
    torch.manual_seed(5)
    model = build_model(spec, REG)
    (batch,) = datalib.batches(None, spec, 2, 16, 1, seed=5, registry=REG)
    seen = {}

    def hook(layer):
        def fn(module, args, _out):
            x = args[0]  # the attention's input (B, T, D)
            b, t, _ = x.shape
            q = module.W_query(x).view(b, t, 4, 8).transpose(1, 2)
            k = module.W_key(x).view(b, t, 4, 8).transpose(1, 2)
            s = (q @ k.transpose(2, 3)) / math.sqrt(8)
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -torch.inf)
            p = torch.softmax(s, -1)
            ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()
            first = p[:, :, 1:, 0].mean()  # queries after position 0, all see key 0
            seen[layer] = (float(s.max()), float(ent), float(first))
        return fn

    attn = [m for m in model.modules() if hasattr(m, "record_stats")]
    for i, m in enumerate(attn):
        m.register_forward_hook(hook(i))
    with torch.no_grad():
        model(**batch.inputs)
    for i in (0, 1):
        assert by(rows, "max_attn_logit")[(i, 0)] == pytest.approx(seen[i][0], rel=1e-5)
        assert by(rows, "attn_entropy")[(i, 0)] == pytest.approx(seen[i][1], rel=1e-5)
        assert by(rows, "first_token_mass")[(i, 0)] == pytest.approx(seen[i][2], rel=1e-5)
    assert not by(rows, "sink_mass")  # no sinks, no sink rows


def test_update_ratio_and_grad_norm_match_an_adamw_step_by_hand(tiny):
    lr, wd, eps = 1e-2, 0.1, 1e-8
    spec = parse_model_spec(tiny, REG)
    rows = run_probe("dynamics", spec, {**SETTINGS, "steps": 1, "every": 1, "lr": lr,
                                        "weight_decay": wd, "grad_clip": None}, seed=7, registry=REG)
    torch.manual_seed(7)
    model = build_model(spec, REG)
    model.train()
    (batch,) = datalib.batches(None, spec, 2, 16, 1, seed=7, registry=REG)
    task_for(spec, REG).loss(spec, model(**batch.inputs), batch).backward()
    for (stack, layer), params in layer_params(model).items():
        w = [p.detach() for p in params]
        g = [p.grad for p in params]
        # AdamW, first step: W <- W(1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps),
        # m_hat = g and sqrt(v_hat) = |g| after bias correction
        delta = [-lr * wd * wi - lr * gi / (gi.abs() + eps) for wi, gi in zip(w, g)]
        ratio = math.sqrt(sum(float(d.pow(2).sum()) for d in delta)) / math.sqrt(
            sum(float(wi.pow(2).sum()) for wi in w))
        grad = math.sqrt(sum(float(gi.pow(2).sum()) for gi in g))
        assert stack == ""
        assert by(rows, "update_ratio")[(layer, 0)] == pytest.approx(ratio, rel=1e-4)
        assert by(rows, "grad_norm")[(layer, 0)] == pytest.approx(grad, rel=1e-5)


def test_unknown_setting_and_every_zero_are_refused(tiny):
    spec = parse_model_spec(tiny, REG)
    with pytest.raises(Exception, match="every"):
        run_probe("dynamics", spec, {"every": 0}, seed=0, registry=REG)
