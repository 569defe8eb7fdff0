"""variantlab_plugins/inits.py by formula (issue 30, mutation triage): the stacked per-expert
projections of a ``moe`` feed-forward get each expert's own Glorot bound or std (fan-in and
fan-out of one (out, in) slice, not of the 3-D tensor), GPT-2's residual scale and DeepNet's
gain by role, and zero biases; padding rows of an embedding stay zero under ``normal``."""

import math

import conftest
import pytest
import torch
from torch import nn

import variantlab as vl
from variantlab.model.roles import declare_role
from variantlab_plugins.inits import DeepNormInitSpec, NormalInitSpec, deepnorm, normal

REG = vl.get_registry()
E, H, D = 4, 16, 32  # experts, expert width, emb_dim
MOE = {"kind": "moe", "n_experts": E, "top_k": 2,
       "expert": {"kind": "glu", "hidden_dim": H, "bias": True}}


def moe_model(init, seed: int = 0):
    torch.manual_seed(seed)
    model = vl.build_model({**conftest.TINY, "feedforward": MOE, "init": init}, REG)
    return [block.ff.sublayer for block in model.trf_blocks]


def biases_are_zero(moe) -> bool:
    return all(torch.count_nonzero(b) == 0 for b in (moe.b_gate, moe.b_up, moe.b_down))


def test_xavier_bounds_each_expert_by_its_own_fans():
    for moe in moe_model({"kind": "xavier", "gain": 2.0}):
        for w in (moe.W_gate, moe.W_up, moe.W_down):  # (E, out, in)
            bound = 2.0 * math.sqrt(6.0 / (H + D))
            for expert in w:
                assert expert.abs().max() <= bound
                assert expert.abs().max() > 0.9 * bound  # 512 draws fill the interval
        assert biases_are_zero(moe)


def test_normal_scales_the_experts_output_projection_by_residual_count():
    n_res = 2 * conftest.TINY["n_layers"]
    for moe in moe_model({"kind": "normal", "std": 0.05}):
        assert moe.W_up.std().item() == pytest.approx(0.05, rel=0.06)
        assert moe.W_gate.std().item() == pytest.approx(0.05, rel=0.06)
        assert moe.W_down.std().item() == pytest.approx(0.05 / math.sqrt(n_res), rel=0.06)
        assert all(w.mean().abs().item() < 0.003 for w in (moe.W_gate, moe.W_up, moe.W_down))
        assert biases_are_zero(moe)
    for moe in moe_model({"kind": "normal", "std": 0.05, "scale_residual": False}):
        assert moe.W_down.std().item() == pytest.approx(0.05, rel=0.06)


def test_deepnorm_gives_every_expert_projection_beta_times_its_glorot_std():
    beta = (8 * conftest.TINY["n_layers"]) ** -0.25  # 0.5 for N = 2
    std = beta * math.sqrt(2.0 / (H + D))
    for moe in moe_model({"kind": "deepnorm"}):
        for w in (moe.W_gate, moe.W_up, moe.W_down):
            assert w.std().item() == pytest.approx(std, rel=0.06)
            assert w.mean().abs().item() < 0.1 * std
        assert biases_are_zero(moe)


def test_normal_keeps_an_embeddings_padding_row_at_zero():
    torch.manual_seed(0)
    module = nn.ModuleDict({"emb": nn.Embedding(6, 8, padding_idx=2), "plain": nn.Embedding(6, 8)})
    normal(NormalInitSpec(std=0.5))(module)
    emb = module["emb"].weight
    assert torch.count_nonzero(emb[2]) == 0
    assert torch.count_nonzero(emb[[0, 1, 3, 4, 5]]) == 40
    assert torch.count_nonzero(module["plain"].weight) == 48


def test_normal_init_default_std_and_zero_mean():
    assert NormalInitSpec().std == 0.02
    torch.manual_seed(0)
    model = vl.build_model({**conftest.TINY, "emb_dim": 64, "init": "normal"}, REG)
    emb = model.embed.tok_emb.weight  # 64 x 64 draws, never scaled
    assert emb.std().item() == pytest.approx(0.02, rel=0.05)
    for lin in (m for m in model.modules() if isinstance(m, nn.Linear)):
        assert lin.weight.mean().abs().item() < 0.005


def test_xavier_normal_is_gaussian_and_uniform_stays_in_its_bound():
    """Both have std gain * sqrt(2 / (fan_in + fan_out)); only a gaussian passes the uniform
    bound sqrt(3) std (8% of its draws)."""
    for distribution, beyond in (("normal", True), ("uniform", False)):
        torch.manual_seed(0)
        model = vl.build_model({**conftest.TINY, "init": {"kind": "xavier",
                                                          "distribution": distribution}}, REG)
        w = model.trf_blocks[0].att.sublayer.W_query.weight  # (32, 32)
        bound = math.sqrt(6.0 / 64)
        assert bool((w.abs() > bound).any()) is beyond


def glorot_std(lin: nn.Linear) -> float:
    fan_out, fan_in = lin.weight.shape
    return math.sqrt(2.0 / (fan_in + fan_out))


def test_deepnorm_gains_by_role_zero_biases_and_beta_from_the_block_count():
    torch.manual_seed(0)
    data = {**conftest.TINY, "emb_dim": 128, "qkv_bias": True, "init": "deepnorm"}
    model = vl.build_model(data, REG)
    torch.manual_seed(0)
    plain = vl.build_model({**data, "init": "default"}, REG)
    beta = 16 ** -0.25  # (8 N)^(-1/4), N = 2 blocks
    for block in model.trf_blocks:
        att, mlp = block.att.sublayer, block.ff.sublayer.layers
        for lin, gain in [(att.W_query, 1.0), (att.W_key, 1.0), (att.W_value, beta),
                          (att.out_proj, beta), (mlp[0], beta), (mlp[2], beta)]:
            assert lin.weight.std().item() == pytest.approx(gain * glorot_std(lin), rel=0.04)
            assert torch.count_nonzero(lin.bias) == 0
    assert torch.equal(model.out_head.weight, plain.out_head.weight)  # no role: untouched
    torch.manual_seed(0)
    six = vl.build_model({**data, "init": {"kind": "deepnorm", "n_layers": 6}}, REG)
    v = six.trf_blocks[0].att.sublayer.W_value
    assert v.weight.std().item() == pytest.approx(48 ** -0.25 * glorot_std(v), rel=0.04)


class Roled(nn.Module):
    """An unroled Linear registered before a roled one, and no layer tags."""

    def __init__(self, role: str | None = "ffn_in"):
        super().__init__()
        self.plain = nn.Linear(256, 256)
        self.roled = nn.Linear(256, 256)
        if role is not None:
            declare_role(self.roled, role)


def test_deepnorm_skips_unroled_linears_and_counts_one_layer_without_tags():
    torch.manual_seed(0)
    module = Roled()
    before = module.plain.weight.clone()
    deepnorm(DeepNormInitSpec())(module)
    assert torch.equal(module.plain.weight, before)
    want = 8 ** -0.25 * glorot_std(module.roled)  # no variantlab_layer: N = 1
    assert module.roled.weight.std().item() == pytest.approx(want, rel=0.03)
    assert torch.count_nonzero(module.roled.bias) == 0
    with pytest.raises(ValueError, match="found no Linear marked"):
        deepnorm(DeepNormInitSpec())(Roled(role=None))


class StackedQuery(nn.Module):
    """A stacked (heads, out, in) query projection: DeepNet's gain 1 per slice."""

    def __init__(self):
        super().__init__()
        self.W_q = nn.Parameter(torch.zeros(3, 64, 128))
        self.b_q = nn.Parameter(torch.ones(3, 64))
        self.variantlab_stacked = [("W_q", "query")]


def test_deepnorm_stacked_roles_outside_the_scaled_set_get_gain_one():
    torch.manual_seed(0)
    module = StackedQuery()
    deepnorm(DeepNormInitSpec(n_layers=4))(module)
    for w in module.W_q:
        assert w.std().item() == pytest.approx(math.sqrt(2.0 / (64 + 128)), rel=0.04)
    assert torch.count_nonzero(module.b_q) == 0
