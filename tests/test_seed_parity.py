"""The seeds' numbers, reproduced through build_model (shared/seeds/README.md)."""

import pytest
import torch

import variantlab as vl

REG = vl.get_registry()

GPT_CONFIG_124M = {
    "vocab_size": 50257, "context_length": 1024, "emb_dim": 768, "n_heads": 12,
    "n_layers": 12, "drop_rate": 0.1, "qkv_bias": False,
}
SEED_COMPONENTS = {
    "norm": {"kind": "layer"},
    "activation": {"kind": "gelu", "approximate": "tanh"},
    "feedforward": {"kind": "mlp"},
    "attention": {"kind": "mha", "impl": "naive"},
    "residual": {"kind": "pre_norm", "shortcut": True},
    "positional": {"kind": "learned"},
}
NO_SHORTCUT = [2.0174e-04, 1.2011e-04, 7.1520e-04, 1.3989e-03, 5.0496e-03]
WITH_SHORTCUT = [0.22170, 0.20694, 0.32897, 0.26657, 1.32585]


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_block_matches_seed_000():
    torch.manual_seed(123)
    x = torch.rand(2, 4, 768)
    block = vl.build_model({"family": "block", **GPT_CONFIG_124M, **SEED_COMPONENTS}, REG)
    block.train()
    out = block(x)
    assert out.shape == (2, 4, 768)
    assert n_params(block) == 7_085_568
    expected = torch.tensor([-0.005541, 0.097221, -0.112203])
    torch.testing.assert_close(out[0, 0, :3], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tie, expected", [(False, 163_009_536), (True, 124_412_160)])
def test_gpt_parameter_counts(tie, expected):
    spec = {"family": "gpt", **GPT_CONFIG_124M, **SEED_COMPONENTS, "tie_weights": tie}
    assert n_params(vl.build_model(spec, REG)) == expected


def test_tied_head_shares_the_embedding_tensor():
    model = vl.build_model({"family": "gpt", **GPT_CONFIG_124M, "tie_weights": True}, REG)
    assert model.out_head.weight is model.embed.tok_emb.weight


@pytest.mark.parametrize("shortcut, expected", [(False, NO_SHORTCUT), (True, WITH_SHORTCUT)])
def test_mlp_shortcut_gradients_match_seed_004(shortcut, expected):
    torch.manual_seed(123)
    model = vl.build_model({
        "family": "mlp", "layer_sizes": [3, 3, 3, 3, 3, 1],
        "activation": {"kind": "gelu", "approximate": "tanh"}, "norm": {"kind": "none"},
        "residual": {"kind": "pre_norm", "shortcut": shortcut},
    }, REG)
    out = model(torch.tensor([[1.0, 0.0, -1.0]]))
    torch.nn.MSELoss()(out, torch.tensor([[0.0]])).backward()
    got = [p.grad.abs().mean().item() for n, p in model.named_parameters() if "weight" in n]
    assert got == pytest.approx(expected, rel=1e-4)


def test_same_seed_same_parameters(tiny):
    torch.manual_seed(7)
    a = vl.build_model(tiny, REG).state_dict()
    torch.manual_seed(7)
    b = vl.build_model(tiny, REG).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(8)
    c = vl.build_model(tiny, REG).state_dict()
    assert not torch.equal(a["embed.tok_emb.weight"], c["embed.tok_emb.weight"])


def test_layernorm_worked_example_of_seed_004():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    norm = vl.get_registry().get("norm", "layer")
    ln = norm.build(norm.spec_cls(), dim=4)
    expected = torch.tensor([-1.3416, -0.4472, 0.4472, 1.3416])
    torch.testing.assert_close(ln(x), expected.expand(2, 4), atol=1e-4, rtol=0)
