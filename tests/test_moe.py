"""The ``moe`` feed-forward (issue 19.3): grouped dispatch equal to the per-token reference
(outputs and gradients, float64) for every routing option; balancing terms by their formulas
(transformers' load_balancing_loss_func, ST-MoE's z-loss); aux-loss-free bias updates;
validation of sizes. The reference (tests/moe_reference.py) shares no function with the
module; a hand-computed case pins the expert biases and the shared gate to literal numbers."""

import math

import pytest
import torch
from moe_reference import capacity_by_formula, dropped_by_formula, moe_reference
from torch import nn

import variantlab as vl
from variantlab.errors import SpecError
from variantlab_plugins.moe import ExpertSpec, MoE, MoESpec, dispatch

OPTIONS = {
    "mixtral": {"n_experts": 4, "top_k": 2},
    "olmoe-no-renorm": {"n_experts": 4, "top_k": 2, "renormalize": False},
    "topk-softmax": {"n_experts": 5, "top_k": 3, "router": "topk_softmax"},
    "top1": {"n_experts": 4, "top_k": 1},
    "all-experts": {"n_experts": 3, "top_k": 3},
    "shared-gated": {"n_experts": 4, "top_k": 2, "n_shared_experts": 2, "shared_gate": True},
    "shared-width": {"n_experts": 4, "top_k": 2, "n_shared_experts": 1, "shared_hidden_dim": 24},
    "mlp-bias": {"n_experts": 4, "top_k": 2, "expert": {"kind": "mlp", "bias": True}},
    "glu-bias": {"n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "bias": True,
                                                        "hidden_dim": 20}},
    "capacity": {"n_experts": 4, "top_k": 2, "capacity_factor": 0.5},
    "capacity-top1": {"n_experts": 3, "top_k": 1, "capacity_factor": 0.75,
                      "router": "topk_softmax"},
    "capacity-mlp-bias-shared": {"n_experts": 4, "top_k": 2, "capacity_factor": 0.75,
                                 "n_shared_experts": 1, "expert": {"kind": "mlp", "bias": True}},
    "shared-gated-glu-bias": {"n_experts": 3, "top_k": 2, "n_shared_experts": 1,
                              "shared_gate": True, "expert": {"bias": True, "hidden_dim": 8}},
    "aux-free-bias": {"n_experts": 6, "top_k": 2, "bias_update_rate": 0.01},
    "aux-free-bias-topk-softmax": {"n_experts": 6, "top_k": 2, "bias_update_rate": 0.01,
                                   "router": "topk_softmax"},
}


def make(options: dict, dim: int = 16, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    module = MoE(MoESpec(**options), dim, nn.SiLU).double()
    if module.expert_bias is not None:  # a bias that changes the choices
        module.expert_bias.copy_(torch.randn(module.spec.n_experts, dtype=torch.float64) * 0.2)
    return module


@pytest.mark.parametrize("name", list(OPTIONS))
def test_grouped_dispatch_equals_the_per_token_reference(name):
    module = make(OPTIONS[name])
    x = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    fast = module(x)
    grads_fast = torch.autograd.grad((fast * torch.cos(fast)).sum(),
                                     [x, *module.parameters()], allow_unused=True)
    slow = moe_reference(module, x, torch.nn.functional.silu)
    grads_slow = torch.autograd.grad((slow * torch.cos(slow)).sum(),
                                     [x, *module.parameters()], allow_unused=True)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    for (pname, _), a, b in zip([("x", x), *module.named_parameters()], grads_fast, grads_slow):
        assert (a is None) == (b is None), pname
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=pname)


@pytest.mark.parametrize(("options", "cap"), [
    ({"n_experts": 4, "top_k": 2, "capacity_factor": 0.5}, 4),  # ceil(0.5 * 16 * 2 / 4)
    ({"n_experts": 3, "top_k": 1, "capacity_factor": 0.75}, 4),  # ceil(0.75 * 16 / 3)
    ({"n_experts": 4, "top_k": 2, "capacity_factor": 1.25, "bias_update_rate": 0.01}, 10),
    ({"n_experts": 4, "top_k": 2}, None),
    ({"n_experts": 4, "top_k": 1, "capacity_factor": 0.1}, 1),  # ceil(0.1 * 16 / 4) = 1
])
def test_capacity_drops_exactly_what_the_top_k_counts_exceed(options, cap):
    module = make(options)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    assert capacity_by_formula(module.spec.capacity_factor, 16, module.spec.top_k,
                               module.spec.n_experts) == cap
    module(x)
    counts, dropped = dropped_by_formula(module, x)
    stats = module.routing_stats()
    assert sum(counts) == 16 * module.spec.top_k
    assert stats["load"].tolist() == pytest.approx([c / sum(counts) for c in counts], abs=1e-15)
    assert stats["capacity"] == (cap is not None)
    assert stats["dropped_fraction"] == pytest.approx(dropped, abs=1e-15)
    if cap == 4:  # these routings overfill some expert: the cap must bite
        assert dropped > 0
    # the entropy of the router's softmax, mean over tokens, recomputed
    logits = x.reshape(-1, 16) @ module.gate.weight.detach().t()
    p = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in logits.tolist()]
    want = sum(-sum(q * math.log(q) for q in row) for row in p) / 16
    assert float(stats["router_entropy"]) == pytest.approx(want, rel=1e-12)


def test_expert_and_shared_biases_by_hand():
    """Two experts of width 1 on a 2-d token, every weight and bias set by hand, mlp experts
    with ReLU, a shared mlp expert with a sigmoid gate: the output written out in numbers."""
    module = MoE(MoESpec(n_experts=2, top_k=1, n_shared_experts=1, shared_gate=True,
                         expert={"kind": "mlp", "bias": True, "hidden_dim": 1}), 2, nn.ReLU)
    module = module.double()
    with torch.no_grad():
        module.gate.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # x0 > x1: expert 0
        module.W_up.copy_(torch.tensor([[[1.0, 1.0]], [[2.0, -1.0]]]))
        module.b_up.copy_(torch.tensor([[0.5], [-3.0]]))
        module.W_down.copy_(torch.tensor([[[1.0], [2.0]], [[-1.0], [1.0]]]))
        module.b_down.copy_(torch.tensor([[0.25, -0.5], [1.0, 1.0]]))
        first, last = module.shared_expert.layers[0], module.shared_expert.layers[2]
        first.weight.copy_(torch.tensor([[1.0, -1.0]]))
        first.bias.copy_(torch.tensor([0.5]))
        last.weight.copy_(torch.tensor([[1.0], [1.0]]))
        last.bias.copy_(torch.tensor([0.0, 1.0]))
        module.shared_expert_gate.weight.copy_(torch.tensor([[0.0, 0.0]]))  # sigmoid(0) = 1/2
    x = torch.tensor([[[2.0, 1.0], [0.0, 3.0]]], dtype=torch.float64)
    # token (2, 1) -> expert 0, weight 1 (top-1 renormalized): hidden relu(2 + 1 + 0.5) = 3.5,
    #   out (3.5 + 0.25, 7 - 0.5) = (3.75, 6.5); shared: relu(2 - 1 + 0.5) = 1.5 ->
    #   (1.5, 2.5) / 2 = (0.75, 1.25); sum (4.5, 7.75)
    # token (0, 3) -> expert 1: hidden relu(0 - 3 - 3) = 0, out b_down = (1, 1); shared:
    #   relu(0 - 3 + 0.5) = 0 -> (0, 1) / 2 = (0, 0.5); sum (1, 1.5)
    want = torch.tensor([[[4.5, 7.75], [1.0, 1.5]]], dtype=torch.float64)
    torch.testing.assert_close(module(x), want, rtol=0, atol=1e-15)
    torch.testing.assert_close(moe_reference(module, x, torch.relu), want, rtol=0, atol=1e-15)


def test_load_balancing_loss_is_transformers_one():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    module = make({"n_experts": 6, "top_k": 2})
    x = torch.randn(4, 5, 16, dtype=torch.float64)
    module(x)
    logits = module.gate(x.reshape(-1, 16)).detach()
    want = load_balancing_loss_func((logits.float(),), 6, 2)
    got = module.aux_terms()["aux_loss"].detach()
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    # and by hand: n_experts * sum_e f_e * P_e, f_e assignments per token
    probs = logits.softmax(-1)
    chosen = probs.topk(2, -1).indices
    f = torch.bincount(chosen.reshape(-1), minlength=6).double() / 20
    assert float(got) == pytest.approx(float(6 * (f * probs.mean(0)).sum()), rel=1e-12)


def test_z_loss_is_the_mean_squared_logsumexp():
    module = make({"n_experts": 4, "top_k": 1})
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    module(x)
    logits = module.gate(x.reshape(-1, 16)).detach()
    want = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / 6
    assert float(module.aux_terms()["z_loss"].detach()) == pytest.approx(want, rel=1e-12)


def test_aux_free_bias_moves_toward_the_mean_load():
    module = make({"n_experts": 4, "top_k": 1, "bias_update_rate": 0.5})
    module.expert_bias.zero_()
    module.train()
    module(torch.randn(2, 16, 16, dtype=torch.float64))
    counts = module.routing_stats()["load"] * 32
    module.after_step()
    want = 0.5 * torch.sign(counts.mean() - counts)
    torch.testing.assert_close(module.expert_bias, want.double())
    assert "expert_bias" in module.state_dict()  # a buffer, saved, not trained
    assert "expert_bias" not in dict(module.named_parameters())
    module.after_step()  # nothing pending: unchanged
    torch.testing.assert_close(module.expert_bias, want.double())
    module.eval()  # an evaluation forward leaves nothing for the next step to apply
    module(torch.randn(2, 16, 16, dtype=torch.float64))
    module.after_step()
    torch.testing.assert_close(module.expert_bias, want.double())


def test_no_terms_or_statistics_before_the_first_forward():
    module = make({"n_experts": 4, "top_k": 1})
    assert module.aux_terms() == {} and module.routing_stats() == {}


@pytest.mark.parametrize(("options", "message"), [
    ({"n_experts": 2, "top_k": 3}, "must not exceed n_experts"),
    ({"n_experts": 4, "top_k": 0}, "top_k must be at least 1"),
    ({"n_experts": 0, "top_k": 1}, "n_experts must be at least 1"),
    ({"n_experts": 4, "shared_gate": True}, "need n_shared_experts"),
])
def test_bad_sizes_are_refused(options, message):
    with pytest.raises(SpecError, match=message):
        vl.build_model({"family": "gpt", "vocab_size": 16, "context_length": 8, "emb_dim": 16,
                        "n_heads": 2, "n_layers": 1, "feedforward": {"kind": "moe", **options}})


def test_parameter_names_and_shapes_map_to_transformers_layout():
    module = make({"n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 12}})
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    assert shapes == {"gate.weight": (4, 16), "W_gate": (4, 12, 16), "W_up": (4, 12, 16),
                      "W_down": (4, 16, 12)}
    # HF MixtralExperts: gate_up_proj (E, 2H, D) = cat(W_gate, W_up); down_proj (E, D, H)
    x = torch.randn(5, 16, dtype=torch.float64)
    gate_up = torch.cat([module.W_gate, module.W_up], 1)
    g, u = nn.functional.linear(x, gate_up[1]).chunk(2, dim=-1)
    want = nn.functional.linear(nn.functional.silu(g) * u, module.W_down[1])
    torch.testing.assert_close(module.expert_forward(1, x), want)


def gpt_moe(feedforward: dict, **extra) -> dict:
    return {"family": "gpt", "vocab_size": 32, "context_length": 16, "emb_dim": 32,
            "n_heads": 4, "n_layers": 2, "drop_rate": 0.0,
            "feedforward": {"kind": "moe", **feedforward}, **extra}


@pytest.mark.parametrize("init", ["normal", "xavier", "deepnorm"])
def test_inits_reach_the_stacked_expert_weights(init):
    torch.manual_seed(0)
    model = vl.build_model(gpt_moe({"n_experts": 8, "top_k": 2, "expert": {"hidden_dim": 64}},
                                   init={"kind": init}))
    moe = next(m for m in model.modules() if isinstance(m, MoE))
    std_up, std_down = float(moe.W_up.detach().std()), float(moe.W_down.detach().std())
    if init == "normal":  # N(0, 0.02); W_down an output projection: 0.02 / sqrt(4 additions)
        assert std_up == pytest.approx(0.02, rel=0.05)
        assert std_down == pytest.approx(0.01, rel=0.05)
    elif init == "xavier":  # per expert: U(+-sqrt(6 / (64 + 32))), std sqrt(2 / 96)
        assert std_up == pytest.approx(math.sqrt(2 / 96), rel=0.05)
    else:  # xavier_normal with DeepNet's beta = (8 * 2) ** -0.25 on FFN projections
        assert std_up == pytest.approx(16 ** -0.25 * math.sqrt(2 / 96), rel=0.05)


def test_parameter_counts_and_default_init_by_formula():
    torch.manual_seed(0)
    module = MoE(MoESpec(n_experts=4, top_k=1, expert={"hidden_dim": 64, "bias": True}), 16,
                 nn.SiLU)
    # one expert: W_gate, W_up (64, 16), W_down (16, 64), b_gate, b_up (64), b_down (16)
    assert module.expert_params() == 3 * 64 * 16 + 2 * 64 + 16
    assert module.inactive_params() == 3 * module.expert_params()
    single = MoE(MoESpec(n_experts=1, top_k=1, expert={"kind": "mlp", "hidden_dim": 8}), 4, nn.SiLU)
    assert single.expert_params() == 2 * 8 * 4 and single.inactive_params() == 0
    # each expert as a fresh nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases too
    for name, fan_in in (("W_gate", 16), ("W_up", 16), ("W_down", 64), ("b_up", 16),
                         ("b_down", 64)):
        values, bound = getattr(module, name).detach(), 1 / math.sqrt(fan_in)
        assert -bound <= float(values.min()) < -0.9 * bound, name
        assert 0.9 * bound < float(values.max()) <= bound, name
    # default widths: 8/3 x emb_dim for glu experts, 4 x for mlp, hidden_mult, hidden_dim
    assert ExpertSpec().hidden(48) == 128 and ExpertSpec(kind="mlp").hidden(48) == 192
    assert ExpertSpec(hidden_mult=1.5).hidden(48) == 72
    assert ExpertSpec(hidden_mult=1.5, hidden_dim=10).hidden(48) == 10


def test_meta_dispatch_is_balanced_and_capped():
    """The size guard's estimate (meta device, no data): the same number of assignments for
    every expert, capped at the capacity."""
    experts = torch.empty(14, dtype=torch.long, device="meta")  # 14 assignments, 4 experts
    keep, sizes, chosen = dispatch(experts, 4, None)
    assert sizes == [4, 4, 3, 3] and keep.numel() == 14 and chosen.shape == (4,)
    keep, sizes, _ = dispatch(experts, 4, 3)
    assert sizes == [3, 3, 3, 3] and keep.numel() == 12


def test_router_entropy_of_a_certain_router_is_zero_not_nan():
    """Probabilities that underflow to 0 add nothing to the entropy (0 log 0 = 0)."""
    module = make({"n_experts": 4, "top_k": 1})
    with torch.no_grad():
        module.gate.weight.mul_(1e5)  # logits thousands apart: exp underflows to exactly 0
    module(torch.randn(1, 6, 16, dtype=torch.float64))
    assert float(module.routing_stats()["router_entropy"]) == 0.0


def test_defaults_are_mixtral_routing_with_balancing_off():
    """What `{kind: moe}` alone gives: Mixtral's 8 experts, top-2, softmax then top-k,
    renormalized, SwiGLU experts 8/3 x emb_dim wide; no balancing term, bias, capacity or
    shared expert."""
    spec = MoESpec()
    assert (spec.n_experts, spec.top_k, spec.router, spec.renormalize) == (
        8, 2, "softmax_topk", True)
    assert (spec.aux_loss_coef, spec.z_loss_coef, spec.bias_update_rate) == (0.0, 0.0, 0.0)
    assert spec.capacity_factor is None and spec.n_shared_experts == 0
    assert spec.expert == ExpertSpec(kind="glu", bias=False)
    # gpt-oss's clamped SwiGLU constants (swiglu_alpha, swiglu_limit of its config)
    assert (spec.expert.alpha, spec.expert.limit) == (1.702, 7.0)
    # the width is at least 1 however small hidden_mult * emb_dim rounds
    assert ExpertSpec(hidden_mult=0.1).hidden(4) == 1 and ExpertSpec(hidden_mult=0.5).hidden(3) == 2


def test_the_walk_examples_are_valid_and_walk_every_code_path_option():
    """tests/test_registry_walk.py builds each of MoESpec.walk_examples in a tiny model: each
    must be a valid spec, and together they set every option that selects code off its
    default (widths and the clamp's constants change sizes and values, not the code run)."""
    specs = [MoESpec(**example) for example in MoESpec.walk_examples]
    sizes = {"kind", "shared_hidden_dim", "hidden_mult", "hidden_dim", "alpha", "limit"}
    for cls, objs in ((MoESpec, specs), (ExpertSpec, [s.expert for s in specs])):
        for name, field in cls.model_fields.items():
            if name not in sizes:
                assert any(getattr(o, name) != field.default for o in objs), name
    assert {s.expert.kind for s in specs} == {"glu", "mlp", "clamped_swiglu"}
    assert {s.router for s in specs} == {"softmax_topk", "topk_softmax", "sigmoid_topk"}
