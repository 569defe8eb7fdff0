"""MoE measurements (issue 19.4): total and active parameters, FLOPs on active parameters,
the balancing losses in the objective but not in the loss rows, routing rows in training and
dynamics, aux-loss-free bias updates after each step; dense models unchanged."""

import pytest
import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.model.specs import parse_model_spec
from variantlab.model.tasks import task_for
from variantlab.probes import run_probe
from variantlab.probes.flops import flops_per_token, model_flops_per_token
from variantlab.probes.training import TrainingSettings, setup
from variantlab_plugins.moe import MoE

REG = vl.get_registry()
TRAIN = {"steps": 4, "lr": 3e-3, "batch_size": 2, "seq_len": 8, "device": "cpu",
         "eval_batches": 0}


def moe_spec(**ff) -> dict:
    ff = {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 64}, **ff}
    return {"family": "gpt", "vocab_size": 32, "context_length": 16, "emb_dim": 32,
            "n_heads": 4, "n_layers": 2, "drop_rate": 0.0, "feedforward": ff}


def by(rows, metric, **where):
    return [r for r in rows if r["metric"] == metric
            and all(r[k] == v for k, v in where.items())]


def test_params_give_total_and_active_per_token():
    rows = run_probe("params", parse_model_spec(moe_spec(n_shared_experts=1), REG), {},
                     seed=0, registry=REG)
    m = {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}
    expert = 3 * 64 * 32  # W_gate, W_up (64, 32) and W_down (32, 64)
    idle = 2 * (4 - 2) * expert  # 2 layers x 2 experts a token is not routed to
    assert m["active"] == m["total"] - idle
    assert m["active_non_embedding"] == m["non_embedding"] - idle
    # the shared expert (one glu of width 64) and the router count as active
    model = vl.build_model(moe_spec(n_shared_experts=1))
    moe = next(x for x in model.modules() if isinstance(x, MoE))
    assert sum(p.numel() for p in moe.parameters()) == 4 * expert + expert + 4 * 32
    # active by formula: every parameter of the model less the idle experts of each layer
    assert m["total"] == sum(p.numel() for p in model.parameters())
    assert m["active"] == sum(p.numel() for p in model.parameters()) - 2 * 2 * expert
    assert moe.inactive_params() == 2 * expert and moe.expert_params() == expert


def test_dense_params_rows_have_no_active_rows(tiny):
    rows = run_probe("params", parse_model_spec(tiny, REG), {}, seed=0, registry=REG)
    assert not by(rows, "active") and not by(rows, "active_non_embedding")


def test_flops_count_active_parameters():
    spec = parse_model_spec(moe_spec(), REG)
    model = vl.build_model(spec)
    rows = run_probe("params", spec, {}, seed=0, registry=REG)
    active = by(rows, "active_non_embedding")[0]["value"]
    assert model_flops_per_token(model, spec, 8) == flops_per_token(int(active), 2, 4, 8, 8)


def test_loss_rows_are_the_task_loss_and_aux_terms_are_reported_apart():
    plain = run_probe("training", parse_model_spec(moe_spec(), REG), TRAIN, seed=0,
                      registry=REG)
    heavy = run_probe("training", parse_model_spec(moe_spec(aux_loss_coef=5.0, z_loss_coef=1.0),
                                                   REG), TRAIN, seed=0, registry=REG)
    loss0 = [by(rows, "loss", step=0)[0]["value"] for rows in (plain, heavy)]
    assert loss0[0] == loss0[1]  # step 0: same weights, same batch, the LM loss alone
    assert by(plain, "loss", step=2)[0]["value"] != by(heavy, "loss", step=2)[0]["value"]
    for rows in (plain, heavy):
        assert [r["step"] for r in by(rows, "aux_loss", scope="model")] == [0, 1, 2, 3]
        assert len(by(rows, "z_loss", scope="model")) == 4
        for r in by(rows, "load_imbalance", scope="model"):
            assert 1.0 <= r["value"] <= 4.0
        loads = by(rows, "expert_load", scope="layer")
        assert len(loads) == 2 * 4  # per layer and expert, averaged over the run
        for layer in (0, 1):
            assert sum(r["value"] for r in loads if r["layer"] == layer) == pytest.approx(1.0)
        assert not by(rows, "dropped_fraction")  # no capacity set
        # final_*: the mean of the last tenth of the steps (the last step of 4)
        last = by(rows, "load_imbalance", scope="model", step=3)[0]["value"]
        assert by(rows, "final_load_imbalance")[0]["value"] == last


def test_aux_loss_row_is_the_unweighted_term_of_the_step():
    spec = parse_model_spec(moe_spec(), REG)
    rows = run_probe("training", spec, {**TRAIN, "steps": 1}, seed=3, registry=REG)
    torch.manual_seed(3)
    model = vl.build_model(spec, REG)
    (batch,) = datalib.batches(None, spec, 2, 8, 1, seed=3, registry=REG)
    model(**batch.inputs)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    want = sum(float(m.aux_terms()["aux_loss"].detach()) for m in moes) / 2
    assert by(rows, "aux_loss", step=0)[0]["value"] == pytest.approx(want, rel=1e-6)


def test_objective_adds_the_weighted_terms_and_leaves_dense_models_alone(tiny):
    spec = parse_model_spec(moe_spec(aux_loss_coef=0.1, z_loss_coef=0.01), REG)
    settings = TrainingSettings(**TRAIN)
    _, model, _, batches, objective = setup(spec, settings, 0, None, ".", "cpu", REG)
    batch = batches.next()
    loss = objective(model(**batch.inputs), batch)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    want = loss + sum(0.1 * m.aux_terms()["aux_loss"] + 0.01 * m.aux_terms()["z_loss"]
                      for m in moes) / 2
    torch.testing.assert_close(objective.total(loss, model), want)
    dense = parse_model_spec(tiny, REG)
    _, model, _, batches, objective = setup(dense, settings, 0, None, ".", "cpu", REG)
    batch = batches.next()
    loss = objective(model(**batch.inputs), batch)
    assert objective.total(loss, model) is loss
    assert task_for(dense, REG).aux_loss(dense, model) is None


def test_dense_training_rows_have_no_routing_rows(tiny):
    rows = run_probe("training", parse_model_spec(tiny, REG), TRAIN, seed=0, registry=REG)
    metrics = {r["metric"] for r in rows}
    assert not metrics & {"aux_loss", "z_loss", "expert_load", "load_imbalance",
                          "router_entropy"}


def test_dynamics_records_expert_load_per_layer_and_step():
    spec = parse_model_spec(moe_spec(capacity_factor=1.0), REG)
    rows = run_probe("dynamics", spec, {**TRAIN, "every": 2}, seed=1, registry=REG)
    loads = by(rows, "expert_load")
    assert {r["step"] for r in loads} == {0, 2, 3}
    assert {r["name"] for r in loads} == {f"expert {e}" for e in range(4)}
    for step in (0, 2, 3):
        for layer in (0, 1):
            mine = [r["value"] for r in loads if r["step"] == step and r["layer"] == layer]
            assert len(mine) == 4 and sum(mine) == pytest.approx(1.0)
            imb = by(rows, "load_imbalance", step=step, layer=layer)[0]["value"]
            assert imb == pytest.approx(max(mine) / 0.25)
            ent = by(rows, "router_entropy", step=step, layer=layer)[0]["value"]
            assert 0 < ent <= torch.log(torch.tensor(4.0)).item() + 1e-6
            assert 0 <= by(rows, "dropped_fraction", step=step, layer=layer)[0]["value"] < 1


def test_aux_free_bias_moves_after_each_training_step():
    spec = parse_model_spec(moe_spec(top_k=1, bias_update_rate=0.01), REG)
    settings = TrainingSettings(**{**TRAIN, "steps": 3})
    from variantlab.probes.training import train

    _, model, opt, batches, objective = setup(spec, settings, 0, None, ".", "cpu", REG)
    train(model, model, opt, objective, batches, torch.device("cpu"), settings)
    for m in (m for m in model.modules() if isinstance(m, MoE)):
        steps = (m.expert_bias / 0.01).round()
        assert steps.abs().sum() > 0 and (steps.abs() <= 3).all()
        torch.testing.assert_close(m.expert_bias, steps * 0.01)


@pytest.mark.parametrize("extra", [{}, {"capacity_factor": 0.5, "bias_update_rate": 0.01,
                                        "n_shared_experts": 1}])
def test_size_guard_estimates_moe_on_meta_close_to_a_real_forward(extra):
    from variantlab.sweep.sizeguard import _activation_bytes, model_cost

    spec = parse_model_spec(moe_spec(**extra), REG)
    cost = model_cost(spec, REG, (4, 16))
    torch.manual_seed(0)
    real = vl.build_model(spec, REG)
    assert cost.params == sum(p.numel() for p in real.parameters())
    assert cost.buffer_bytes == sum(b.numel() * b.element_size() for b in real.buffers())
    measured = _activation_bytes(real, spec, task_for(spec, REG),
                                 {id(p) for p in real.parameters()}, 4, 16)
    # the estimate assumes a balanced dispatch; a real one differs by a few dropped tokens
    assert 0.8 * measured < cost.activation_bytes < 1.25 * measured


def test_flops_of_active_parameters_match_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    spec = parse_model_spec({**moe_spec(n_shared_experts=1), "qkv_bias": False,
                             "context_length": 64}, REG)
    torch.manual_seed(0)
    model = vl.build_model(spec, REG)
    batch = datalib.batches(None, spec, 2, 64, 1, seed=0, registry=REG)[0]
    with FlopCounterMode(display=False) as counter:
        task_for(spec, REG).loss(spec, model(**batch.inputs), batch).backward()
    counted = counter.get_total_flops() / batch.n_tokens
    # every token runs top_k of the experts: the counted matmuls are the active ones
    assert model_flops_per_token(model, spec, 64) == pytest.approx(counted, rel=0.03)


def test_a_layout_with_dense_first_layer_counts_active_params_per_layer():
    """DeepSeek-style: the first layer dense, the others MoE (a layout's per-layer kinds)."""
    spec = {**moe_spec(), "n_layers": 3, "feedforward": {"kind": "glu", "hidden_dim": 64},
            "layout": {"kinds": {"dense": {}, "moe": {"feedforward": {
                "kind": "moe", "n_experts": 4, "top_k": 1, "expert": {"hidden_dim": 64}}}},
                "pattern": ["dense", "moe", "moe"]}}
    parsed = parse_model_spec(spec, REG)
    rows = run_probe("params", parsed, {}, seed=0, registry=REG)
    m = {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}
    assert m["total"] - m["active"] == 2 * 3 * (3 * 64 * 32)  # 2 MoE layers x 3 idle experts
    train = run_probe("training", parsed, TRAIN, seed=0, registry=REG)
    assert {r["layer"] for r in by(train, "expert_load")} == {1, 2}


@pytest.mark.slow
def test_compiled_moe_training_gives_the_eager_losses_and_aux_terms():
    spec = parse_model_spec(moe_spec(aux_loss_coef=0.1, bias_update_rate=0.01), REG)
    settings = {**TRAIN, "eval_batches": 1}
    eager = run_probe("training", spec, settings, seed=0, registry=REG)
    compiled = run_probe("training", spec, {**settings, "compile": True}, seed=0, registry=REG)
    for metric in ("loss", "aux_loss", "z_loss", "val_loss"):
        a = [r["value"] for r in by(eager, metric, scope="model")]
        b = [r["value"] for r in by(compiled, metric, scope="model")]
        assert len(a) == len(b) > 0 and a == pytest.approx(b, abs=1e-4), metric


def test_recipe_groups_and_muon_take_moe_weights():
    from variantlab.probes.recipe import make_optimizer

    spec = parse_model_spec(moe_spec(expert={"hidden_dim": 64, "bias": True}), REG)
    model = vl.build_model(spec, REG)
    opt = make_optimizer(model, TrainingSettings(**TRAIN, no_decay=["biases"]))
    names = {id(p): n for n, p in model.named_parameters()}
    free = {names[id(p)] for p in opt.param_groups[1]["params"]}
    decayed = {names[id(p)] for p in opt.param_groups[0]["params"]}
    ffn = "trf_blocks.{}.ff.sublayer."
    biases = {ffn.format(i) + b for i in (0, 1) for b in ("b_gate", "b_up", "b_down")}
    assert biases <= free  # stacked biases: no decay
    assert {ffn.format(i) + w for i in (0, 1) for w in ("W_gate", "W_up", "W_down")} <= decayed
    assert free | decayed == set(names.values()) and not free & decayed
    # muon: the 2-D weights of the hidden layers (attention projections, the router); the 3-D
    # stacked expert weights, their 2-D stacked biases, embeddings, head and norms: AdamW
    muon, adamw = make_optimizer(model, TrainingSettings(**TRAIN, optimizer="muon")).optimizers
    assert type(muon).__name__ == "Muon" and type(adamw).__name__ == "AdamW"
    to_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    to_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    att = "trf_blocks.{}.att.sublayer.{}.weight"
    assert to_muon == {att.format(i, w) for i in (0, 1)
                       for w in ("W_query", "W_key", "W_value", "out_proj")} \
        | {ffn.format(i) + "gate.weight" for i in (0, 1)}
    assert to_adamw == set(names.values()) - to_muon
    rows = run_probe("training", spec, {**TRAIN, "optimizer": "muon"}, seed=0, registry=REG)
    assert by(rows, "diverged")[0]["value"] == 0.0


def test_a_training_loop_finds_the_routed_modules_and_hooks_once_and_forgets_them_after():
    """Within ``fixed_structure`` the routed modules and after-step hooks are those found on
    entry (the loop's model keeps its modules); after it, the model is walked again."""
    from variantlab.model import sparse

    model = vl.build_model(parse_model_spec(moe_spec(bias_update_rate=0.01), REG), REG)
    found = list(sparse.routed_modules(model))
    assert len(found) == 2 and all(isinstance(m, MoE) for m in found)
    calls = []
    with sparse.fixed_structure(model):
        assert list(sparse.routed_modules(model)) == found
        extra = torch.nn.Module()
        extra.after_step = lambda: calls.append("extra")  # type: ignore[assignment]
        model.add_module("extra", extra)  # not seen while the structure is fixed
        sparse.after_step(model)
        assert calls == []
    sparse.after_step(model)  # walked again: the new hook runs
    assert calls == ["extra"]
    assert model not in sparse._FIXED
