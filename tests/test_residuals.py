"""Issue 9 residual kinds against their formulas on hand-sized inputs, block-scope wiring
(``parallel``), old-signature residual plugins, and DeepNet's alpha, beta and init."""

import math
import types
from typing import Literal

import conftest
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import variantlab as vl
from variantlab import ComponentSpec, SpecError, hookimpl
from variantlab.model.build import Parts
from variantlab.testing import check_component

REGISTRY = vl.build_registry(entry_points=False)
D = 4
TINY = {**conftest.TINY, "context_length": 16}


def ln(x, scale=None, shift=None):
    """LayerNorm written out: biased variance over the last dim, eps 1e-5."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + 1e-5)
    return y * (1 if scale is None else scale) + (0 if shift is None else shift)


def linear(seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(D, D)


def x_in() -> torch.Tensor:
    return torch.tensor([[[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0], [4.0, 0.0, 0.0, -4.0]]])


def residual(kind: str, sublayer: nn.Module, n_layers: int = 2, **options) -> nn.Module:
    spec = vl.parse_model_spec(
        {**TINY, "emb_dim": D, "n_heads": 1, "n_layers": n_layers,
         "residual": {"kind": kind, **options}}, REGISTRY)
    return Parts(spec, REGISTRY).residual(sublayer, D, D).eval()


def parallel(attention: nn.Module, feedforward: nn.Module, **options) -> nn.Module:
    spec = vl.parse_model_spec(
        {**TINY, "emb_dim": D, "n_heads": 1, "residual": {"kind": "parallel", **options}},
        REGISTRY)
    return Parts(spec, REGISTRY).block(attention, feedforward).eval()


def test_sandwich_formula():
    f, x = linear(1), x_in()
    module = residual("sandwich", f)
    with torch.no_grad():
        module.norm_out.scale.fill_(2.0)  # tell the two norms apart
        assert torch.allclose(module(x), x + ln(f(ln(x)), scale=2.0), atol=1e-6)
    off = residual("sandwich", f, shortcut=False)
    assert torch.allclose(off(x), ln(f(ln(x))), atol=1e-6)


def test_post_sublayer_formula():
    f, x = linear(2), x_in()
    assert torch.allclose(residual("post_sublayer", f)(x), x + ln(f(x)), atol=1e-6)
    assert torch.allclose(residual("post_sublayer", f, shortcut=False)(x), ln(f(x)), atol=1e-6)


@pytest.mark.parametrize(("n_layers", "alpha"), [(2, 2.0 ** 0.5), (6, 12.0 ** 0.25)])
def test_deepnorm_formula_and_alpha(n_layers, alpha):
    f, x = linear(3), x_in()
    module = residual("deepnorm", f, n_layers=n_layers)
    assert module.alpha == pytest.approx(alpha, rel=1e-12)  # (2N)^(1/4): 1.4142, 1.8612
    assert torch.allclose(module(x), ln(alpha * x + f(x)), atol=1e-6)
    fixed = residual("deepnorm", f, n_layers=n_layers, alpha=3.0)
    assert torch.allclose(fixed(x), ln(3.0 * x + f(x)), atol=1e-6)
    assert torch.allclose(residual("deepnorm", f, shortcut=False)(x), ln(f(x)), atol=1e-6)


def test_rezero_starts_as_identity_and_learns_its_gate():
    f, x = linear(4), x_in()
    module = residual("rezero", f)
    assert [n for n, _ in module.named_parameters() if "sublayer" not in n] == ["resweight"]
    assert torch.equal(module(x), x)  # a = 0: the identity, no norm anywhere
    out = module(x)
    out.pow(2).sum().backward()
    expected = (2 * x * f(x)).sum()  # d/da sum((x + a f(x))^2) at a = 0
    assert module.resweight.grad.item() == pytest.approx(expected.item(), rel=1e-5)
    assert f.weight.grad.abs().sum() == 0  # gated off at initialisation, by design
    with torch.no_grad():
        module.resweight.fill_(0.3)
        assert torch.allclose(module(x), x + 0.3 * f(x), atol=1e-6)
    with pytest.raises(SpecError, match="shortcut"):
        residual("rezero", f, shortcut=False)


class KwargLinear(nn.Linear):
    """A sublayer that records the keyword arguments it gets."""

    def forward(self, x, **kwargs):
        self.seen = kwargs
        return super().forward(x)


def test_parallel_shared_norm_formula_and_argument_routing():
    torch.manual_seed(5)
    att, ff, x = KwargLinear(D, D), nn.Linear(D, D), x_in()
    module = parallel(att, ff)
    assert module.norm2 is None
    with torch.no_grad():
        module.norm1.scale.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
        expected = x + att(ln(x, module.norm1.scale)) + ff(ln(x, module.norm1.scale))
        assert torch.allclose(module(x, key_padding_mask="pad"), expected, atol=1e-6)
    assert att.seen == {"key_padding_mask": "pad"}


def test_parallel_two_norms_formula():
    torch.manual_seed(6)
    att, ff, x = nn.Linear(D, D), nn.Linear(D, D), x_in()
    module = parallel(att, ff, shared_norm=False)
    with torch.no_grad():
        module.norm2.scale.fill_(3.0)
        module.norm2.shift.fill_(-1.0)
        expected = x + att(ln(x)) + ff(ln(x, 3.0, -1.0))
        assert torch.allclose(module(x), expected, atol=1e-6)


def test_parallel_block_in_gpt_has_one_residual_per_block():
    torch.manual_seed(0)
    model = vl.build_model({**TINY, "residual": "parallel"}, REGISTRY)
    default = vl.build_model(TINY, REGISTRY)
    names = {n for n, _ in model.named_parameters()}
    assert "trf_blocks.0.res.attention.W_query.weight" in names
    assert "trf_blocks.1.res.feedforward.layers.0.weight" in names
    assert not any(".att." in n or ".ff." in n for n in names)
    n_params = sum(p.numel() for p in model.parameters())
    n_default = sum(p.numel() for p in default.parameters())
    assert n_default - n_params == 2 * 2 * 32  # one shared norm per block instead of two
    residuals = [m for m in model.modules() if getattr(m, "variantlab_slot", "") == "residual"]
    assert len(residuals) == 2


def test_parallel_block_equals_its_formula_inside_a_model():
    torch.manual_seed(1)
    model = vl.build_model({**TINY, "family": "block", "residual": "parallel"}, REGISTRY).eval()
    block = model.block.res
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        h = block.norm1(x)
        assert torch.allclose(model(x), x + block.attention(h) + block.feedforward(h), atol=1e-6)


def test_parallel_passes_the_padding_mask_in_the_encoder():
    torch.manual_seed(2)
    model = vl.build_model({**TINY, "family": "encoder", "residual": "parallel"}, REGISTRY)
    model.eval()
    idx = torch.randint(0, 64, (2, 6))
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[:, 4:] = True
    other = idx.clone()
    other[:, 4:] = (other[:, 4:] + 7) % 64
    with torch.no_grad():
        a, b = model(idx, padding_mask=pad), model(other, padding_mask=pad)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-5)


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder", "mlp"])
def test_block_scope_refused_where_a_layer_is_not_attention_plus_ffn(family):
    data = {**TINY, "family": family, "residual": "parallel"}
    if family == "mlp":
        data = {"family": "mlp", "residual": "parallel", "layer_sizes": [3, 3, 3]}
    with pytest.raises(SpecError, match="wraps a whole attention"):
        vl.parse_model_spec(data, REGISTRY)


class OldSpec(ComponentSpec):
    kind: Literal["old_style"] = "old_style"


class OldResidual(nn.Module):
    def __init__(self, sublayer, norm):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm

    def forward(self, x, *args, **kwargs):
        return x + 0.5 * self.sublayer(self.norm(x), *args, **kwargs)


def test_residual_plugin_with_the_old_build_signature_still_works():
    plugin = types.ModuleType("old_residual_plugin")

    @hookimpl
    def register_residuals(register):
        # exactly today's contract: no n_layers, no **kwargs
        def build(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
            return OldResidual(sublayer, make_norm(in_dim))

        register("old_style", OldSpec, build)

    plugin.register_residuals = register_residuals
    reg = vl.build_registry(entry_points=False)
    reg.load_module(plugin, "old_residual_plugin", "module")
    torch.manual_seed(0)
    model = vl.build_model({**TINY, "residual": "old_style", "n_layers": 3}, reg)
    logits = model(torch.randint(0, 64, (2, 5)))
    assert logits.shape == (2, 5, 64) and torch.isfinite(logits).all()
    assert isinstance(model.trf_blocks[2].ff, OldResidual)
    check_component("residual", {"kind": "old_style"}, registry=reg, families=["gpt"])


@pytest.mark.parametrize(("n_layers", "beta"), [(2, 0.5), (6, 48.0 ** -0.25)])
def test_deepnorm_init_gains(n_layers, beta):
    data = {**TINY, "emb_dim": 128, "n_layers": n_layers, "qkv_bias": True,
            "residual": "deepnorm", "init": "deepnorm"}
    torch.manual_seed(0)
    model = vl.build_model(data, REGISTRY)
    torch.manual_seed(0)
    with pytest.warns(vl.VariantWarning, match="set init: deepnorm"):
        plain = vl.build_model({**data, "init": "default"}, REGISTRY)
    xavier = math.sqrt(2.0 / (128 + 128))
    for block in model.trf_blocks:
        att, mlp = block.att.sublayer, block.ff.sublayer.layers
        assert block.att.alpha == pytest.approx((2 * n_layers) ** 0.25)
        for lin, gain in [(att.W_query, 1.0), (att.W_key, 1.0), (att.W_value, beta),
                          (att.out_proj, beta)]:
            assert lin.weight.std().item() == pytest.approx(gain * xavier, rel=0.03)
            assert lin.weight.mean().abs().item() < 0.01 * gain
            if lin.bias is not None:
                assert torch.count_nonzero(lin.bias) == 0
        for lin in (mlp[0], mlp[2]):  # 128 <-> 512: xavier std sqrt(2 / 640)
            assert lin.weight.std().item() == pytest.approx(beta * math.sqrt(2 / 640), rel=0.03)
            assert torch.count_nonzero(lin.bias) == 0
    # what carries no role keeps its default init: embeddings, norms
    assert torch.equal(model.embed.tok_emb.weight, plain.embed.tok_emb.weight)
    assert torch.equal(model.final_norm.scale, plain.final_norm.scale)


def test_deepnorm_init_counts_blocks_or_takes_n_layers():
    torch.manual_seed(0)
    a = vl.build_model({**TINY, "emb_dim": 128, "n_layers": 6, "init": "deepnorm"}, REGISTRY)
    torch.manual_seed(0)
    b = vl.build_model({**TINY, "emb_dim": 128, "n_layers": 6,
                        "init": {"kind": "deepnorm", "n_layers": 6}}, REGISTRY)
    assert torch.equal(a.trf_blocks[0].att.sublayer.W_value.weight,
                       b.trf_blocks[0].att.sublayer.W_value.weight)
    with pytest.raises(ValueError, match="variantlab_role"):
        vl.build_model({"family": "mlp", "init": "deepnorm"}, REGISTRY)


def test_deepnorm_warns_without_its_init():
    spec = vl.parse_model_spec({**TINY, "residual": "deepnorm"}, REGISTRY)
    assert any("init: deepnorm" in w for w in spec.warnings())
    spec = vl.parse_model_spec({**TINY, "residual": "deepnorm", "init": "deepnorm"}, REGISTRY)
    assert spec.warnings() == []


def test_dyt_formula():
    norm = REGISTRY.get("norm", "dyt")
    module = norm.build(norm.spec_cls(), dim=D)
    assert module.alpha.item() == 0.5 and module.alpha.shape == ()
    x = x_in()
    assert torch.allclose(module(x), torch.tanh(0.5 * x))  # g = 1, b = 0 at init
    with torch.no_grad():
        module.alpha.fill_(2.0)
        module.scale.copy_(torch.tensor([1.0, -1.0, 0.5, 2.0]))
        module.shift.copy_(torch.tensor([0.0, 1.0, 0.0, -3.0]))
        want = torch.tensor([1.0, -1.0, 0.5, 2.0]) * torch.tanh(2.0 * x) + torch.tensor(
            [0.0, 1.0, 0.0, -3.0])
        assert torch.allclose(module(x), want, atol=1e-6)
    custom = norm.build(norm.spec_cls(alpha0=1.5), dim=D, bias=False)
    assert [n for n, _ in custom.named_parameters()] == ["alpha", "scale"]
    assert torch.allclose(custom(x), torch.tanh(1.5 * x))


def test_relu2_formula():
    act = REGISTRY.get("activation", "relu2")
    module = act.build(act.spec_cls())
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0])
    assert torch.equal(module(x), torch.tensor([0.0, 0.0, 0.0, 0.25, 9.0]))
    y = torch.randn(3, 7)
    assert torch.allclose(module(y), F.relu(y) ** 2)


@pytest.mark.parametrize(("slot", "spec", "families"), [
    ("residual", {"kind": "parallel", "shared_norm": False}, ["gpt", "encoder"]),
    ("residual", {"kind": "sandwich", "shortcut": False}, ["gpt"]),
    ("residual", {"kind": "post_sublayer", "shortcut": False}, ["gpt"]),
    ("residual", {"kind": "deepnorm", "alpha": 2.0}, ["gpt", "mlp"]),
    ("residual", {"kind": "sandwich"}, ["mlp"]),  # width changes: shortcut off there
    ("norm", {"kind": "dyt", "alpha0": 1.0}, ["gpt"]),
    ("init", {"kind": "deepnorm", "n_layers": 6}, ["gpt"]),
])
def test_new_options_pass_the_conformance_kit(slot, spec, families):
    check_component(slot, spec, registry=REGISTRY, families=families)
