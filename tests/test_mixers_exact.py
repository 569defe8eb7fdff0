"""Linear attention, retention and the short convolutions (variantlab_plugins/mixers.py) against
references written here from the papers' formulas, as one masked T x T product per head (not
the module's scans): Katharopoulos et al. 2020's normalised phi(q) phi(k)^T attention, RetNet's
decayed retention (Sun et al. 2023); plus the documented defaults and which form ``impl``
runs (the mutation triage of docs/mutation.md)."""

import math

import pytest
import torch
import torch.nn.functional as F

import variantlab as vl
from variantlab_plugins.mixers import (
    DecayedLinearAttention,
    LinearAttentionSpec,
    RetentionSpec,
    ShortConv,
    ShortConvSpec,
)

REG = vl.get_registry()
TINY = {"family": "gpt", "vocab_size": 64, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        "n_layers": 2, "drop_rate": 0.0}
PHI = {"elu1": lambda x: torch.where(x > 0, x + 1, torch.exp(x)),  # elu(x) + 1, written out
       "relu": lambda x: x.clamp_min(0), "identity": lambda x: x}


def _perturbed(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _by_formula(mod, x, phi, normalise, gammas=None, key_scale=1.0, gate=None, norm=None):
    """o_t = sum_{j<=t} w_tj v_j with w_tj = gamma^(t-j) phi(q_t) . phi(k_j) * key_scale, divided
    by sum_j w_tj (+ 1e-6) when normalised, or through a LayerNorm ``norm`` per head; heads
    joined, times gate(W_g x), out_proj."""
    b, t, d = x.shape
    h = 4
    hd = d // h

    def heads(lin):  # (B, T, D) -> (B, H, T, hd)
        return F.linear(x, lin.weight, lin.bias).view(b, t, h, hd).transpose(1, 2)

    q, k, v = phi(heads(mod.W_query)), phi(heads(mod.W_key)) * key_scale, heads(mod.W_value)
    ti = torch.arange(t, dtype=x.dtype)
    age = ti[:, None] - ti[None, :]  # (T, T): t - j
    w = q @ k.transpose(-1, -2) * (age >= 0)  # (B, H, T, T)
    if gammas is not None:
        w = w * torch.tensor(gammas, dtype=x.dtype)[:, None, None] ** age.clamp_min(0)
    o = w @ v  # (B, H, T, hd)
    if normalise:
        o = o / (w.sum(-1, keepdim=True) + 1e-6)
    if norm is not None:  # (o - mean) / sqrt(var + eps) * weight + bias over each head's hd
        centred = o - o.mean(-1, keepdim=True)
        o = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + norm.eps)
        o = o * norm.weight + norm.bias
    o = o.transpose(1, 2).reshape(b, t, d)
    if gate is not None:
        o = o * gate(F.linear(x, mod.W_gate.weight, mod.W_gate.bias))
    return F.linear(o, mod.out_proj.weight, mod.out_proj.bias)


@pytest.mark.parametrize("feature, normalization", [
    ("elu1", "sum"), ("relu", "sum"), ("identity", "none"), ("elu1", "none")])
@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_linear_attention_equals_the_papers_formula(feature, normalization, impl):
    spec = LinearAttentionSpec(feature_map=feature, normalization=normalization, impl=impl,
                               chunk_size=4)
    mod = _perturbed(DecayedLinearAttention(32, 4, True, spec, None, True).double())
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = _by_formula(mod, x, PHI[feature], normalization == "sum")
    assert torch.allclose(mod(x), want, atol=1e-10), (mod(x) - want).abs().max()


@pytest.mark.parametrize("gate", ["swish", "sigmoid"])
@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_retention_equals_the_papers_formula(gate, impl):
    """gamma_h = 1 - 2^(-5 - h) (h = 0..3), keys scaled by head_dim^-0.5, no head norm."""
    spec = RetentionSpec(normalization="none", output_gate=gate, impl=impl, chunk_size=3)
    mod = _perturbed(DecayedLinearAttention(32, 4, False, spec, None, False).double(), 2)
    x = torch.randn(1, 10, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    act = {"swish": lambda u: u * torch.sigmoid(u), "sigmoid": torch.sigmoid}[gate]
    want = _by_formula(mod, x, PHI["identity"], False, [1 - 2.0 ** -5, 1 - 2.0 ** -6,
                       1 - 2.0 ** -7, 1 - 2.0 ** -8], key_scale=1 / math.sqrt(8), gate=act)
    assert torch.allclose(mod(x), want, atol=1e-10), (mod(x) - want).abs().max()


@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_retention_with_its_head_norm_equals_the_papers_formula(impl):
    """RetNet's default: a norm over each head's output (here a perturbed LayerNorm), swish."""
    spec = RetentionSpec(impl=impl, chunk_size=4)
    mod = DecayedLinearAttention(32, 4, False, spec, lambda d: torch.nn.LayerNorm(d), True)
    mod = _perturbed(mod.double(), 5)
    x = torch.randn(2, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    want = _by_formula(mod, x, PHI["identity"], False, [1 - 2.0 ** -5, 1 - 2.0 ** -6,
                       1 - 2.0 ** -7, 1 - 2.0 ** -8], key_scale=1 / math.sqrt(8),
                       gate=lambda u: u * torch.sigmoid(u), norm=mod.head_norm)
    assert torch.allclose(mod(x), want, atol=1e-10), (mod(x) - want).abs().max()
    # the decays are derived, not learned: not in the state dict a checkpoint stores
    assert "log_decay" not in mod.state_dict() and "head_norm.weight" in mod.state_dict()


def test_the_sum_normalisation_takes_any_positive_feature_map():
    """Only identity (which can make phi(q) . sum phi(k) zero or negative) is refused with sum."""
    for feature in ("elu1", "relu"):
        spec = vl.parse_model_spec({**TINY, "attention": {"kind": "linear_attention",
                                                          "feature_map": feature}}, REG)
        assert (spec.attention.feature_map, spec.attention.normalization) == (feature, "sum")


@pytest.mark.parametrize("kind, make", [
    ("linear_attention", lambda s: DecayedLinearAttention(32, 4, True, s, None, True)),
    ("retention", lambda s: DecayedLinearAttention(32, 4, True, s, None, True)),
])
@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_impl_and_the_documented_chunk_reach_the_scan(monkeypatch, kind, make, impl):
    """docs/mixers.md: chunk_size 64 unless set; the forms agree up to rounding, so only which
    one ran (and with which chunk) tells the settings were read."""
    import variantlab_plugins.mixers as mixers

    ran = []
    real_chunked, real_recurrent = mixers.chunked_scan, mixers.recurrent_scan
    monkeypatch.setattr(mixers, "chunked_scan",
                        lambda *a: ran.append(("chunked", a[-1])) or real_chunked(*a))
    monkeypatch.setattr(mixers, "recurrent_scan",
                        lambda *a: ran.append(("recurrent",)) or real_recurrent(*a))
    cls = LinearAttentionSpec if kind == "linear_attention" else RetentionSpec
    spec = cls(impl=impl, normalization="none")
    assert spec.chunk_size == 64
    make(spec)(torch.randn(1, 5, 32))
    assert ran == [("chunked", 64) if impl == "chunked" else ("recurrent",)]


@pytest.mark.parametrize("cls", [LinearAttentionSpec, RetentionSpec, ShortConvSpec])
def test_the_walk_examples_are_settings_the_spec_accepts(cls):
    """tests/test_registry_walk.py builds these; an example made invalid fails here too."""
    for example in cls.walk_examples:
        spec = vl.parse_model_spec({**TINY, "attention": example}, REG)
        assert {key: getattr(spec.attention, key) for key in example} == example


@pytest.mark.parametrize("activation, gate", [("identity", "none"), ("silu", "sigmoid"),
                                            ("identity", "swish")])
def test_short_conv_equals_the_formula(activation, gate):
    """y_t = act(sum_{i<w} w_i u_{t-i} + b) per channel (u = W_in x; zeros before the start),
    times gate(W_g x), then out_proj."""
    spec = ShortConvSpec(width=3, activation=activation, output_gate=gate)
    mod = _perturbed(ShortConv(32, True, spec, True).double())
    x = torch.randn(2, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    u = F.linear(x, mod.W_in.weight, mod.W_in.bias)
    kernel = mod.conv.weight[:, 0]  # (D, w): oldest first
    y = torch.stack([sum(kernel[:, 2 - i] * u[:, t - i] for i in range(3) if t - i >= 0)
                     + mod.conv.bias for t in range(6)], dim=1)
    if activation == "silu":
        y = y * torch.sigmoid(y)
    if gate != "none":
        g = F.linear(x, mod.W_gate.weight, mod.W_gate.bias)
        y = y * (torch.sigmoid(g) if gate == "sigmoid" else g * torch.sigmoid(g))
    want = F.linear(y, mod.out_proj.weight, mod.out_proj.bias)
    for impl in ("chunked", "recurrent"):
        mod.impl = impl
        assert torch.allclose(mod(x), want, atol=1e-12)


def test_short_conv_default_width_is_the_documented_4():
    """docs/mixers.md: width 4 (Mamba's and Based's); the state kept is the last 3 inputs."""
    mod = ShortConv(32, False, ShortConvSpec(), True)
    assert mod.conv.kernel_size == (4,) and mod.state_size(10) == 3 * 32


@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_short_conv_impl_picks_the_form_it_names(impl):
    mod = ShortConv(32, False, ShortConvSpec(impl=impl), True)
    ran = []
    for name in ("parallel", "recurrent"):
        real = getattr(mod, name)
        setattr(mod, name, lambda u, _f=real, _n=name: ran.append(_n) or _f(u))
    mod(torch.randn(1, 5, 32))
    assert ran == ["recurrent" if impl == "recurrent" else "parallel"]


@pytest.mark.parametrize("kind", ["short_conv", "gated_short_conv"])
def test_a_width_of_the_whole_context_is_accepted(kind):
    spec = vl.parse_model_spec({**TINY, "attention": {"kind": kind, "width": 16}}, REG)
    assert spec.attention.width == 16


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_gated_short_conv_equals_lfm2s_formula(bias, impl):
    """LFM2: B, C, h = in_proj(x) (three blocks); y = out_proj(C * conv(B * h)), the width-3
    causal depthwise convolution by default; a padded position's B * h is zero."""
    from variantlab_plugins.mixers import GatedShortConv, GatedShortConvSpec

    spec = GatedShortConvSpec(impl=impl, **({"bias": True} if bias else {}))  # default: none
    mod = _perturbed(GatedShortConv(32, spec).double(), 7)
    assert (mod.in_proj.bias is None) == (mod.conv.bias is None) == (not bias)
    assert mod.conv.kernel_size == (3,) and mod.state_size(10) == 2 * 32
    x = torch.randn(2, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True
    proj = F.linear(x, mod.in_proj.weight, mod.in_proj.bias)
    b_in, c_out, h = proj[..., :32], proj[..., 32:64], proj[..., 64:]
    u = (b_in * h).masked_fill(pad[..., None], 0.0)
    kernel = mod.conv.weight[:, 0]  # (D, 3): oldest first
    conv_bias = mod.conv.bias if bias else 0.0
    y = torch.stack([sum(kernel[:, 2 - i] * u[:, t - i] for i in range(3) if t - i >= 0)
                     + conv_bias for t in range(6)], dim=1)
    want = F.linear(c_out * y, mod.out_proj.weight, mod.out_proj.bias)
    got = mod(x, key_padding_mask=pad)
    assert torch.allclose(got, want, atol=1e-12), (got - want).abs().max()
    ran = []
    for name in ("parallel", "recurrent"):
        real = getattr(mod, name)
        setattr(mod, name, lambda v, _f=real, _n=name: ran.append(_n) or _f(v))
    mod(x)
    assert ran == ["recurrent" if impl == "recurrent" else "parallel"]


@pytest.mark.parametrize("kind, spec", [
    ("linear_attention", LinearAttentionSpec(normalization="none")),
    ("retention", RetentionSpec(normalization="none")),
    ("short_conv", ShortConvSpec()),
])
def test_a_build_without_out_bias_gets_the_documented_default(kind, spec):
    """variantlab/plugin/hookspecs.py: ``out_bias``, bias in the output projection (default
    True), passed only by a caller that sets it."""
    build = REG.get("attention", kind).build
    mixer = build(spec, emb_dim=32, n_heads=4, context_length=16, drop_rate=0.0,
                  qkv_bias=False, causal=True)
    assert mixer.out_proj.bias is not None and mixer.out_proj.bias.shape == (32,)
