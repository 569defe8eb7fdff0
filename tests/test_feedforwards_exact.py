"""variantlab_plugins/feedforwards.py by exact values (issue 30, mutation triage): default
widths and biases, the Linears' declared roles, the gated formula written out with
``F.linear``, and the ``none`` feed-forward's zeros and absence from the block."""

import conftest
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import variantlab as vl
from variantlab.model.roles import role_of
from variantlab_plugins.feedforwards import GLU, MLP, GLUSpec, MLPSpec, NoFeedForward, hidden_size

REG = vl.get_registry()


def build(kind: str, emb_dim: int = 32, **options) -> nn.Module:
    comp = REG.get("feedforward", kind)
    return comp.build(comp.spec_cls(**options), emb_dim=emb_dim, make_activation=nn.SiLU)


def test_default_widths_are_4x_for_the_mlp_and_8_3_for_the_glu():
    mlp = build("mlp")
    assert mlp.layers[0].weight.shape == (128, 32) and mlp.layers[2].weight.shape == (32, 128)
    glu = build("glu")  # round(8 / 3 * 32) = round(85.33)
    assert glu.W_gate.weight.shape == glu.W_up.weight.shape == (85, 32)
    assert glu.W_down.weight.shape == (32, 85)
    assert MLPSpec().hidden_mult == 4 and GLUSpec().hidden_mult == pytest.approx(8 / 3)


def test_hidden_size_is_at_least_one_and_hidden_dim_overrides():
    assert hidden_size(MLPSpec(hidden_mult=0.01), 32) == 1  # round(0.32) = 0, raised to 1
    assert hidden_size(MLPSpec(hidden_mult=0.05), 32) == 2  # round(1.6)
    assert hidden_size(MLPSpec(hidden_mult=0.5, hidden_dim=7), 32) == 7


def test_default_biases_mlp_has_them_glu_does_not():
    assert all(lin.bias is not None for lin in (build("mlp").layers[0], build("mlp").layers[2]))
    glu = build("glu")
    assert [n for n, _ in glu.named_parameters()] == [
        "W_gate.weight", "W_up.weight", "W_down.weight"]
    assert GLUSpec().bias is False
    direct = MLP(4, 8, nn.ReLU())
    assert direct.layers[0].bias is not None and direct.layers[2].bias is not None
    assert GLU(4, 8, nn.ReLU()).W_up.bias is None
    assert build("glu", bias=True).W_down.bias is not None


def test_roles_are_declared_on_the_right_linears():
    mlp = build("mlp")
    assert [role_of(m) for m in mlp.layers] == ["ffn_in", None, "ffn_out"]
    glu = build("glu")
    assert (role_of(glu.W_gate), role_of(glu.W_up), role_of(glu.W_down)) == (
        "ffn_gate", "ffn_in", "ffn_out")


def test_glu_is_down_of_silu_gate_times_up():
    torch.manual_seed(0)
    glu = build("glu", emb_dim=8, hidden_dim=6, bias=True)
    x = torch.randn(2, 3, 8)
    gate = F.linear(x, glu.W_gate.weight, glu.W_gate.bias)
    up = F.linear(x, glu.W_up.weight, glu.W_up.bias)
    hidden = gate * torch.sigmoid(gate) * up
    want = F.linear(hidden, glu.W_down.weight, glu.W_down.bias)
    torch.testing.assert_close(glu(x), want, atol=1e-6, rtol=1e-6)


def test_no_feedforward_gives_zeros_and_the_block_leaves_it_out():
    x = torch.tensor([[1.5, -2.0, 3.0]])
    assert torch.equal(NoFeedForward()(x), torch.zeros(1, 3))
    model = vl.build_model({**conftest.TINY, "feedforward": "none"}, REG)
    assert all(block.ff is None for block in model.trf_blocks)
    with_ffn = vl.build_model(conftest.TINY, REG)
    n = sum(p.numel() for p in model.parameters())
    n_ffn = sum(p.numel() for p in with_ffn.parameters())
    # per layer: the mlp (32*128 + 128 + 128*32 + 32) and its norm (2 * 32)
    assert n_ffn - n == 2 * (2 * 32 * 128 + 128 + 32 + 2 * 32)
