"""DeepSeek's routing options of the ``moe`` feed-forward (issue 29.1): sigmoid scores,
group-limited top-k (a group scored by its best expert or by its two best), the routed
scaling factor and a fixed choice bias, each held equal to an independent per-token
reference (outputs and gradients, float64); the options' defaults leave existing specs'
data (and unit keys) unchanged."""

import pytest
import torch
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


def reference(module: MoE, x: torch.Tensor) -> torch.Tensor:
    rows = []
    for token in x.reshape(-1, x.shape[-1]):
        out = sum(w * module.expert_forward(e, token[None])[0] for e, w in route_one(module, token))
        shared = module.shared(token[None])
        rows.append(out if shared is None else out + shared[0])
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
                "choice_bias"} & set(data)


@pytest.mark.parametrize("options, message", [
    ({"n_experts": 6, "n_group": 4, "topk_group": 2}, "n_group=4 does not divide"),
    ({"n_experts": 6, "n_group": 3}, "set both or neither"),
    ({"n_experts": 6, "top_k": 3, "n_group": 3, "topk_group": 1}, "exceeds the experts"),
    ({"n_experts": 4, "n_group": 4, "topk_group": 2, "group_score": "top2_sum"},
     "at least 2 experts"),
])
def test_bad_group_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        MoESpec(**options)
