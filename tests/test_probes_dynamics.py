"""The dynamics probe: six quantities per layer at the chosen interval, checked by hand."""

import math

import pytest
import torch

import variantlab as vl
from variantlab import build_model, parse_model_spec
from variantlab.data import sources as datalib
from variantlab.model.tasks import task_for
from variantlab.probes import checkpoint, dynamics, run_probe
from variantlab.probes.dynamics import METRICS, DynamicsSettings, layer_params

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


@pytest.mark.parametrize("warmup", [0, 4])
def test_update_ratio_and_grad_norm_match_an_adamw_step_by_hand(tiny, warmup):
    base, wd, eps = 1e-2, 0.1, 1e-8
    lr = base / warmup if warmup else base  # the first step of a 4-step warm-up: lr / 4
    spec = parse_model_spec(tiny, REG)
    rows = run_probe("dynamics", spec, {**SETTINGS, "steps": 1, "every": 1, "lr": base,
                                        "warmup_steps": warmup, "weight_decay": wd,
                                        "grad_clip": None}, seed=7, registry=REG)
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


def test_defaults_and_eval_batches_bounds():
    """Every 10th step, no held-out score unless asked; a negative batch count is refused."""
    d = DynamicsSettings()
    assert (d.every, d.eval_batches) == (10, 0)
    assert DynamicsSettings(eval_batches=0).eval_batches == 0
    with pytest.raises(ValueError, match="eval_batches"):
        DynamicsSettings(eval_batches=-1)


def test_the_last_step_is_recorded_off_the_interval(tiny):
    """4 steps every 2: steps 0, 2 and the last, 3."""
    rows = run_probe("dynamics", tiny, {**SETTINGS, "steps": 4}, seed=1, registry=REG)
    assert [r["step"] for r in rows if r["metric"] == "loss"] == [0, 2, 3]
    assert not [r for r in rows if r["metric"] == "eval_loss"]  # eval_batches 0 by default


def test_residual_rms_matches_the_first_layer_output(tiny):
    spec = parse_model_spec(tiny, REG)
    rows = run_probe("dynamics", spec, {**SETTINGS, "steps": 1}, seed=5, registry=REG)
    torch.manual_seed(5)
    model = build_model(spec, REG)
    (batch,) = datalib.batches(None, spec, 2, 16, 1, seed=5, registry=REG)
    with torch.no_grad():
        h = model.trf_blocks[0](model.embed(batch.inputs["idx"]))
    assert by(rows, "residual_rms")[(0, 0)] == pytest.approx(
        float(h.pow(2).mean().sqrt()), rel=1e-5)


def test_attention_stats_of_several_modules_in_a_layer():
    """Max of the max logits; entropy the mean over the modules; first_token_mass and
    sink_mass the mean over the modules that report them; a module without stats skipped."""
    a, b, c = (torch.nn.Module() for _ in range(3))
    a.last_stats = {"max_logit": 1.0, "entropy": 0.5, "first_token_mass": 0.25}
    b.last_stats = {"max_logit": 3.0, "entropy": 1.5, "first_token_mass": 0.75,
                    "sink_mass": 0.125}
    c.last_stats = None
    record = {m: {} for m in dynamics.RECORDED}
    dynamics._attention_stats({("", 0): [a, b, c], ("", 1): [c]}, record)
    assert record["max_attn_logit"] == {("", 0): 3.0}
    assert record["attn_entropy"] == {("", 0): 1.0}
    assert record["first_token_mass"] == {("", 0): 0.5}
    assert record["sink_mass"] == {("", 0): 0.125}


def test_hooks_are_removed_after_each_forward_and_stats_off_after_the_run(tiny, monkeypatch):
    """No layer keeps a forward hook into the optimizer step or a later step, and the
    attention modules stop recording before the held-out score."""
    seen = {"hooks": [], "recording": []}
    step = dynamics.after_step

    def spy_step(model):
        seen["hooks"].append(sum(len(m._forward_hooks) for m in model.modules()))
        step(model)

    score = dynamics.HeldOut.score

    def spy_score(self, split, model, *args, **kwargs):
        seen["recording"] += [m.record_stats for m in model.modules()
                              if hasattr(m, "record_stats")]
        return score(self, split, model, *args, **kwargs)

    monkeypatch.setattr(dynamics, "after_step", spy_step)
    monkeypatch.setattr(dynamics.HeldOut, "score", spy_score)
    rows = run_probe("dynamics", tiny, {**SETTINGS, "steps": 3, "eval_batches": 1}, seed=1,
                     registry=REG)
    assert seen["hooks"] == [0, 0, 0]
    assert seen["recording"] == [False, False]  # two attention modules, off
    assert len([r for r in rows if r["metric"] == "eval_loss"]) == 1


def test_a_non_finite_loss_stops_the_run_with_no_held_out_score(tiny, monkeypatch):
    spec = parse_model_spec(tiny, REG)
    task = type(vl.task_for(spec, REG))
    monkeypatch.setattr(task, "loss", lambda self, spec, out, batch: out.sum() * float("nan"))
    rows = run_probe("dynamics", spec, {**SETTINGS, "steps": 3, "every": 1, "eval_batches": 1},
                     seed=0, registry=REG)
    assert [(r["metric"], r["step"]) for r in rows] == [("loss", 0)]
    assert math.isnan(rows[0]["value"])


def shrink_and_zero(monkeypatch):
    """setup() whose model has layer 0's tensors scaled to a norm below 1 and layer 1's
    set to zero."""
    setup = dynamics.setup

    def fn(*args, **kwargs):
        out = setup(*args, **kwargs)
        params = layer_params(out[1])
        with torch.no_grad():
            for p in params[("", 0)]:
                p.mul_(1e-3)
            for p in params[("", 1)]:
                p.zero_()
        return out

    monkeypatch.setattr(dynamics, "setup", fn)


def test_update_ratio_of_small_and_of_zero_weights(tiny, monkeypatch):
    """A layer of weight norm below 1 has a finite ratio; a layer of zero weights has none
    (nan, not a division by zero), and a nan ratio is no divergence: the held-out score
    still comes."""
    shrink_and_zero(monkeypatch)
    rows = run_probe("dynamics", tiny, {**SETTINGS, "steps": 1, "eval_batches": 1}, seed=3,
                     registry=REG)
    ratio = by(rows, "update_ratio")
    assert math.isfinite(ratio[(0, 0)]) and ratio[(0, 0)] > 0
    assert math.isnan(ratio[(1, 0)])
    assert len([r for r in rows if r["metric"] == "eval_loss"]) == 1


def test_a_non_finite_gradient_with_a_finite_loss_is_no_divergence(tiny, monkeypatch):
    """Only the loss decides divergence: a nan gradient norm after a finite loss still gets
    its held-out score (nan too, the step having written nan weights)."""
    setup = dynamics.setup

    def fn(*args, **kwargs):
        out = setup(*args, **kwargs)
        for p in layer_params(out[1])[("", 0)]:
            p.register_hook(lambda g: g * float("nan"))
        return out

    monkeypatch.setattr(dynamics, "setup", fn)
    rows = run_probe("dynamics", tiny, {**SETTINGS, "steps": 1, "eval_batches": 1,
                                        "grad_clip": None}, seed=3, registry=REG)
    assert math.isnan(by(rows, "grad_norm")[(0, 0)])
    assert math.isfinite(by(rows, "loss")[(None, 0)])
    assert len([r for r in rows if r["metric"] == "eval_loss"]) == 1


def test_a_checkpoint_after_every_due_step_but_the_last(tiny, monkeypatch):
    """With checkpoints due after every step, a 4-step unit writes them after steps 1, 2 and
    3 (not after the last: the unit's rows are stored then)."""

    class Due:
        def due(self, done):
            return True

    saved = []
    monkeypatch.setattr(checkpoint, "current", lambda: Due())
    monkeypatch.setattr(checkpoint, "resume_unit", lambda *args: 0)
    monkeypatch.setattr(checkpoint, "save_unit", lambda saver, done, *args: saved.append(done))
    run_probe("dynamics", tiny, {**SETTINGS, "steps": 4}, seed=1, registry=REG)
    assert saved == [1, 2, 3]
