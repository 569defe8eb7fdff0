"""The ``moe`` feed-forward equals transformers' sparse MoE blocks on the same (perturbed)
weights: Mixtral (renormalised top-k), OLMoE (not renormalised), Qwen3-MoE (norm_topk_prob),
Qwen2-MoE (gated shared expert). The parameter layout maps one to one onto theirs."""

import pytest
import torch
from torch import nn

from variantlab_plugins.moe import MoE, MoESpec

D, H, E = 16, 12, 6


def ours(spec: dict) -> MoE:
    torch.manual_seed(1)
    return MoE(MoESpec(n_experts=E, expert={"hidden_dim": H}, **spec), D, nn.SiLU)


def load(hf: nn.Module, moe: MoE) -> None:
    with torch.no_grad():
        hf.gate.weight.copy_(moe.gate.weight)
        hf.experts.gate_up_proj.copy_(torch.cat([moe.W_gate, moe.W_up], 1))  # (E, 2H, D)
        hf.experts.down_proj.copy_(moe.W_down)  # (E, D, H)
        if moe.shared_expert is not None:
            hf.shared_expert.gate_proj.weight.copy_(moe.shared_expert.W_gate.weight)
            hf.shared_expert.up_proj.weight.copy_(moe.shared_expert.W_up.weight)
            hf.shared_expert.down_proj.weight.copy_(moe.shared_expert.W_down.weight)
            hf.shared_expert_gate.weight.copy_(moe.shared_expert_gate.weight)


def hf_block(family: str, top_k: int, renorm: bool):
    common = {"hidden_size": D, "intermediate_size": H, "hidden_act": "silu"}
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        return MixtralSparseMoeBlock(MixtralConfig(
            **common, num_local_experts=E, num_experts_per_tok=top_k))
    if family == "olmoe":
        from transformers import OlmoeConfig
        from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock

        return OlmoeSparseMoeBlock(OlmoeConfig(
            **common, num_experts=E, num_experts_per_tok=top_k, norm_topk_prob=renorm))
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        return Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(
            hidden_size=D, moe_intermediate_size=H, hidden_act="silu", num_experts=E,
            num_experts_per_tok=top_k, norm_topk_prob=renorm))
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    return Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(
        hidden_size=D, moe_intermediate_size=H, shared_expert_intermediate_size=20,
        hidden_act="silu", num_experts=E, num_experts_per_tok=top_k, norm_topk_prob=renorm))


CASES = {
    "mixtral": ({"top_k": 2, "renormalize": True}, 2, True),
    "olmoe": ({"top_k": 3, "renormalize": False}, 3, False),
    "qwen3_moe": ({"top_k": 2, "renormalize": True}, 2, True),
    "qwen2_moe": ({"top_k": 2, "renormalize": False, "n_shared_experts": 1,
                   "shared_hidden_dim": 20, "shared_gate": True}, 2, False),
}


@pytest.mark.parametrize("family", list(CASES))
def test_equal_to_transformers_sparse_moe_block(family):
    spec, top_k, renorm = CASES[family]
    moe = ours(spec)
    hf = hf_block(family, top_k, renorm)
    load(hf, moe)
    x = torch.randn(2, 9, D)
    torch.testing.assert_close(moe(x), hf(x), rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in moe.parameters()) == sum(p.numel() for p in hf.parameters())
