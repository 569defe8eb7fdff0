"""DeepSeek's and gpt-oss's options of the ``moe`` feed-forward (issue 29.1): sigmoid scores,
group-limited top-k (a group scored by its best expert or by its two best), the routed
scaling factor, a fixed choice bias, a biased router and clamped SwiGLU experts, each held
equal to an independent per-token
reference (outputs and gradients, float64); the options' defaults leave existing specs'
data (and unit keys) unchanged."""

import pytest
import torch
import torch.nn.functional as F
from moe_reference import shared_ffn
from torch import nn

from variantlab_plugins.moe import MoE, MoESpec

OPTIONS = {
    "v3": {"n_experts": 8, "top_k": 2, "router": "sigmoid_topk", "n_group": 4, "topk_group": 2,
           "group_score": "top2_sum", "routed_scaling_factor": 2.5, "choice_bias": True,
           "n_shared_experts": 1},
    "v3-no-renorm-one-group": {"n_experts": 6, "top_k": 3, "router": "sigmoid_topk",
                               "renormalize": False, "choice_bias": True},
    "v2-group-limited": {"n_experts": 6, "top_k": 2, "n_group": 3, "topk_group": 1,
                         "renormalize": False, "routed_scaling_factor": 1.5},
    "scaled-topk-softmax": {"n_experts": 4, "top_k": 2, "router": "topk_softmax",
                            "routed_scaling_factor": 0.5},
    # groups scored on raw logits (negative ones too): a masked expert must never win
    "topk-softmax-group-limited": {"n_experts": 6, "top_k": 2, "router": "topk_softmax",
                                   "n_group": 3, "topk_group": 1},
    # the softmax over the chosen logits sums to 1 whatever renormalize says; a factor of 2
    "topk-softmax-renormalize-off": {"n_experts": 4, "top_k": 2, "router": "topk_softmax",
                                     "renormalize": False, "routed_scaling_factor": 2.0},
    "llama4-scaled-input": {"n_experts": 4, "top_k": 1, "router": "sigmoid_topk",
                            "renormalize": False, "scale_input": True, "n_shared_experts": 1},
    "gpt-oss": {"n_experts": 4, "top_k": 2, "router": "topk_softmax", "router_bias": True,
                "expert": {"kind": "clamped_swiglu", "bias": True, "hidden_dim": 12,
                           "alpha": 1.702, "limit": 0.4}},
}


def make(options: dict, dim: int = 16) -> MoE:
    torch.manual_seed(0)
    module = MoE(MoESpec(**options), dim, nn.SiLU).double()
    if module.expert_bias is not None:
        module.expert_bias.copy_(torch.randn(module.spec.n_experts, dtype=torch.float64) * 0.2)
    return module


def route_one(module: MoE, x: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(expert, weight) pairs for one token x (D,), from DeepSeek-V2/V3's description."""
    spec = module.spec
    logits = module.gate.weight @ x  # (E,)
    if module.gate.bias is not None:
        logits = logits + module.gate.bias
    if spec.router == "sigmoid_topk":
        scores = [torch.sigmoid(v) for v in logits]
    else:
        scores = list(torch.softmax(logits, 0))
    choice = [float(s.detach()) for s in (scores if spec.router != "topk_softmax" else list(logits))]
    if module.expert_bias is not None:
        choice = [c + float(b) for c, b in zip(choice, module.expert_bias)]
    allowed = set(range(spec.n_experts))
    if spec.n_group:
        size = spec.n_experts // spec.n_group
        groups = [choice[g * size:(g + 1) * size] for g in range(spec.n_group)]
        rank = [max(g) if spec.group_score == "max" else sum(sorted(g)[-2:]) for g in groups]
        best = sorted(range(spec.n_group), key=lambda g: -rank[g])[: spec.topk_group]
        allowed = {g * size + i for g in best for i in range(size)}
    chosen = sorted(allowed, key=lambda e: -choice[e])[: spec.top_k]
    if spec.router == "topk_softmax":
        weights = list(torch.softmax(torch.stack([logits[e] for e in chosen]), 0))
    else:
        weights = [scores[e] for e in chosen]
        if spec.renormalize:
            total = sum(weights)
            weights = [w / total for w in weights]
    return [(e, w * spec.routed_scaling_factor) for e, w in zip(chosen, weights)]


def expert(module: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert e on one token x (D,), from its weights: SwiGLU, or gpt-oss's clamped SwiGLU
    (OpenAI's reference code: gate clamped above at limit, up to +-limit, (up + 1) times
    gate * sigmoid(alpha * gate))."""
    spec = module.spec.expert
    biased = module.b_up is not None

    def lin(w, b):
        return w[e] @ x + (b[e] if biased else 0.0)

    gate, up = lin(module.W_gate, module.b_gate), lin(module.W_up, module.b_up)
    if spec.kind == "clamped_swiglu":
        gate = torch.minimum(gate, torch.full_like(gate, spec.limit))
        up = torch.maximum(torch.minimum(up, torch.full_like(up, spec.limit)),
                           torch.full_like(up, -spec.limit))
        hidden = (up + 1) * gate / (1 + torch.exp(-spec.alpha * gate))
    else:
        hidden = gate / (1 + torch.exp(-gate)) * up
    return module.W_down[e] @ hidden + (module.b_down[e] if biased else 0.0)


def reference(module: MoE, x: torch.Tensor) -> torch.Tensor:
    rows = []
    for token in x.reshape(-1, x.shape[-1]):
        if module.spec.scale_input:  # Llama 4: expert(w x), added as it is
            out = sum(expert(module, e, w * token) for e, w in route_one(module, token))
        else:
            out = sum(w * expert(module, e, token) for e, w in route_one(module, token))
        shared = shared_ffn(module, token, F.silu)  # written out there, not module.shared
        rows.append(out if shared is None else out + shared)
    return torch.stack(rows).reshape(x.shape)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_routing_options_equal_the_per_token_reference(name):
    module = make(OPTIONS[name])
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    fast, slow = module(x), reference(module, x)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    params = [x, *module.parameters()]
    for a, b in zip(torch.autograd.grad(fast.sin().sum(), params, allow_unused=True),
                    torch.autograd.grad(slow.sin().sum(), params, allow_unused=True)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_each_option_changes_the_output():
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    base = make(OPTIONS["v3"])(x)
    for change in ({"n_group": None, "topk_group": None}, {"group_score": "max"},
                   {"routed_scaling_factor": 1.0}, {"router": "softmax_topk"}):
        other = make(dict(OPTIONS["v3"], **change))
        assert (other(x) - base).abs().max().item() > 1e-3, change
    unbiased = make(OPTIONS["v3"])
    unbiased.expert_bias.zero_()
    assert (unbiased(x) - base).abs().max().item() > 1e-3


def test_the_clamp_acts_and_matters():
    module = make(OPTIONS["gpt-oss"])
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    up = torch.einsum("ehd,btd->bteh", module.W_up, x) + module.b_up
    assert (up.abs() > 0.4).float().mean().item() > 0.2  # the limit bites
    loose = make(dict(OPTIONS["gpt-oss"], expert=dict(OPTIONS["gpt-oss"]["expert"], limit=100.0)))
    assert (loose(x) - module(x)).abs().max().item() > 1e-3


def test_sigmoid_statistics_read_normalised_scores():
    module = make(OPTIONS["v3-no-renorm-one-group"])
    module(torch.randn(1, 5, 16, dtype=torch.float64))
    stats = module.routing_stats()
    assert 0 < float(stats["router_entropy"]) <= torch.log(torch.tensor(6.0)).item() + 1e-9
    assert float(module.aux_terms()["aux_loss"].detach()) > 0


def test_choice_bias_is_a_buffer_that_stays_without_an_update_rate():
    module = make(OPTIONS["v3"])
    before = module.expert_bias.clone()
    module.train()
    module(torch.randn(1, 5, 16, dtype=torch.float64))
    module.after_step()
    assert torch.equal(module.expert_bias, before)
    assert "expert_bias" in module.state_dict() and "expert_bias" not in dict(module.named_parameters())


def test_defaults_leave_existing_spec_data_unchanged():
    data = MoESpec(n_experts=4, top_k=2).model_dump()
    assert not {"n_group", "topk_group", "group_score", "routed_scaling_factor",
                "choice_bias", "router_bias", "scale_input"} & set(data)
    assert set(data["expert"]) == {"kind", "hidden_mult", "hidden_dim", "bias"}


@pytest.mark.parametrize("options, message", [
    ({"n_experts": 6, "n_group": 4, "topk_group": 2}, "n_group=4 does not divide"),
    ({"n_experts": 6, "n_group": 3}, "set both or neither"),
    ({"n_experts": 6, "topk_group": 2}, "set both or neither"),
    ({"n_experts": 6, "top_k": 3, "n_group": 3, "topk_group": 1},
     r"top_k \(3\) exceeds the experts of topk_group=1 groups of 2 \["),
    ({"n_experts": 6, "n_group": 3, "topk_group": 4}, r"topk_group \(4\) must not exceed n_group"),
    ({"n_experts": 4, "n_shared_experts": 1, "expert": {"kind": "clamped_swiglu"}},
     "clamped_swiglu experts take n_shared_experts: 0"),
    ({"n_experts": 4, "n_group": 4, "topk_group": 2, "group_score": "top2_sum"},
     "at least 2 experts"),
])
def test_bad_group_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        MoESpec(**options)


@pytest.mark.parametrize("options", [
    {"n_experts": 1, "top_k": 1},  # one expert: every token to it
    {"n_experts": 4, "n_group": 2, "topk_group": 2},  # every group allowed
    {"n_experts": 4, "n_group": 4, "topk_group": 2, "group_score": "max"},  # groups of one
    {"n_experts": 4, "n_group": 2, "topk_group": 1, "group_score": "top2_sum"},  # of two
    {"n_experts": 6, "n_group": 2, "topk_group": 1, "group_score": "top2_sum"},  # of three
    {"n_experts": 4, "expert": {"kind": "clamped_swiglu"}},
])
def test_the_edges_of_the_group_settings_are_accepted(options):
    assert MoESpec(**options).n_experts == options["n_experts"]
