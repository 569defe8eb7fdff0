"""Init schemes: each equals its formula; ``default`` leaves PyTorch's own initialisation."""

import math
import warnings

import conftest
import pytest
import torch
from torch import nn

import variantlab as vl
from variantlab_plugins.inits import output_projections, residual_additions

REG = vl.get_registry()

TINY = {**conftest.TINY, "qkv_bias": True}


def build(init: dict | None, seed: int = 0, **more) -> nn.Module:
    torch.manual_seed(seed)
    return vl.build_model({**TINY, **more, **({"init": init} if init else {})}, REG)


def linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_default_is_pytorch_init_and_the_spec_default():
    assert vl.parse_model_spec(TINY, REG).init.kind == "default"
    a, b = build({"kind": "default"}), build(None, seed=0)  # no init key: the same
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_xavier_uniform_bound_and_zero_bias():
    model = build({"kind": "xavier", "gain": 2.0})
    for lin in linears(model):
        fan_out, fan_in = lin.weight.shape
        bound = 2.0 * math.sqrt(6.0 / (fan_in + fan_out))
        assert lin.weight.abs().max() <= bound
        assert lin.weight.abs().max() > 0.9 * bound  # uniform fills the interval
        if lin.bias is not None:
            assert torch.count_nonzero(lin.bias) == 0
    default = build({"kind": "default"})
    for name, p in model.named_parameters():  # embeddings and norms keep their own init
        if "emb" in name or "norm" in name:
            assert torch.equal(p, dict(default.named_parameters())[name]), name


def test_xavier_normal_std():
    model = build({"kind": "xavier", "distribution": "normal"}, emb_dim=64, n_layers=1)
    w = max(linears(model), key=lambda m: m.weight.numel()).weight
    fan_out, fan_in = w.shape
    assert w.std().item() == pytest.approx(math.sqrt(2.0 / (fan_in + fan_out)), rel=0.05)


def test_normal_scales_output_projections_by_residual_count():
    model = build({"kind": "normal", "std": 0.05}, emb_dim=64)
    n_res = 2 * TINY["n_layers"]  # attention and feed-forward in every block
    outs = output_projections(model)
    assert len(outs) == n_res
    for lin in linears(model):
        want = 0.05 / math.sqrt(n_res) if lin in outs else 0.05
        assert lin.weight.std().item() == pytest.approx(want, rel=0.1)
    emb = next(m for m in model.modules() if isinstance(m, nn.Embedding))
    assert emb.weight.std().item() == pytest.approx(0.05, rel=0.1)
    flat = build({"kind": "normal", "std": 0.05, "scale_residual": False}, emb_dim=64)
    for lin in output_projections(flat):
        assert lin.weight.std().item() == pytest.approx(0.05, rel=0.1)


def test_same_seed_same_parameters_and_tied_weights_stay_tied():
    a = build({"kind": "normal"}, seed=3, tie_weights=True)
    b = build({"kind": "normal"}, seed=3, tie_weights=True)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    # the head still shares the embedding's tensor after re-initialisation
    emb = next(m for m in a.modules() if isinstance(m, nn.Embedding) and m.weight.shape[0] == 64)
    assert any(lin.weight is emb.weight for lin in linears(a))


def test_unknown_init_kind_suggests():
    with pytest.raises(vl.SpecError, match="xavier"):
        vl.parse_model_spec({**TINY, "init": {"kind": "xavir"}}, REG)


@pytest.mark.parametrize("kind, shortcut, per_layer", [
    ("pre_norm", True, 2), ("post_norm", True, 2), ("sandwich", True, 2),
    ("post_sublayer", True, 2), ("deepnorm", True, 2), ("rezero", None, 2),
    ("parallel", None, 1),  # one addition per block: x + attn(norm(x)) + ffn(norm(x))
    ("pre_norm", False, 0), ("sandwich", False, 0),  # no shortcut: nothing is added
])
def test_normal_scale_counts_residual_additions_of_each_kind(kind, shortcut, per_layer):
    n_layers = 3
    residual = {"kind": kind, **({} if shortcut is None else {"shortcut": shortcut})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deepnorm's alpha with init normal is warned
        model = build({"kind": "normal", "std": 0.05}, emb_dim=64, n_layers=n_layers,
                      residual=residual)
    n_add = per_layer * n_layers
    assert residual_additions(model) == n_add
    outs = output_projections(model)
    assert len(outs) == 2 * n_layers  # attention and feed-forward outputs, whatever the wiring
    want = 0.05 / math.sqrt(n_add) if n_add else 0.05
    for lin in outs:
        assert lin.weight.std().item() == pytest.approx(want, rel=0.1)


def test_normal_scale_counts_the_decoder_cross_attention():
    model = build({"kind": "normal"}, family="encoder_decoder")
    # encoder: attention + feed-forward; decoder: self-, cross-attention + feed-forward
    assert residual_additions(model) == 5 * TINY["n_layers"]


def test_output_projections_are_declared_not_positional():
    """The ``normal`` init scales the Linear a component declares as its output projection,
    wherever it sits in registration order; a sublayer that declares none is refused."""
    from variantlab.model.roles import declare_role, mark

    class OutFirst(nn.Module):  # the output projection is registered before the input one
        def __init__(self):
            super().__init__()
            self.proj = declare_role(nn.Linear(8, 4), "ffn_out")
            self.expand = declare_role(nn.Linear(4, 8), "ffn_in")

    sub = mark(OutFirst(), slot="feedforward", kind="out_first")
    assert output_projections(nn.ModuleList([sub])) == {sub.proj}

    undeclared = mark(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)), slot="attention", kind="mine")
    with pytest.raises(ValueError, match="attention 'mine' declares none.*declare_role"):
        output_projections(nn.ModuleList([undeclared]))
    with pytest.raises(ValueError, match="unknown role 'output'"):
        declare_role(nn.Linear(2, 2), "output")
