"""The component options issue 41's families need, by exact values against their formulas
written out: a LayerNorm without parameters (OLMo 1), a pre-norm branch multiplier
(Granite's residual_multiplier), an embedding multiplier and a logit scale (Granite,
Cohere), an output head bias (Phi-1/2), the xIELU activation (Apertus) and clamped q/k/v
projections (OLMo 1); each option is
left out of a spec's data at its default, so older specs keep their unit keys."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import variantlab as vl

REG = vl.get_registry()
GPT = dict(family="gpt", vocab_size=64, context_length=16, emb_dim=8, n_heads=2, n_layers=1,
           drop_rate=0.0, positional="rotary", norm="rms")


def ln(x, eps=1e-5):
    """LayerNorm without scale or shift: biased variance."""
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_a_layernorm_without_affine_has_no_parameters_and_only_normalises(impl):
    norm = REG.get("norm", "layer")
    spec = norm.spec_cls(affine=False, impl=impl, eps=1e-3)
    module = norm.build(spec, dim=4, bias=True)
    assert list(module.parameters()) == []
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0]])
    assert torch.allclose(module(x), ln(x, 1e-3), atol=1e-6)
    assert torch.allclose(module(x), F.layer_norm(x, (4,), eps=1e-3), atol=1e-6)


def test_the_pre_norm_branch_multiplier_scales_the_branch_only():
    comp, norm = REG.get("residual", "pre_norm"), REG.get("norm", "layer")
    torch.manual_seed(0)
    sublayer = nn.Linear(4, 4)
    block = comp.build(comp.spec_cls(branch_scale=0.25), sublayer,
                       lambda dim: norm.build(norm.spec_cls(), dim=dim), 4, 4, 0.0)
    x = torch.tensor([[[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0]]])
    with torch.no_grad():
        assert torch.allclose(block(x), x + 0.25 * sublayer(ln(x)), atol=1e-6)


def pair(**options):
    """A model with ``options`` and the same model without them, sharing weights."""
    torch.manual_seed(0)
    plain = vl.build_model(GPT, REG)
    torch.manual_seed(0)
    other = vl.build_model({**GPT, **options}, REG)
    missing, _ = other.load_state_dict(plain.state_dict(), strict=False)
    return plain.eval(), other.eval(), missing


def test_the_embedding_multiplier_multiplies_the_token_embeddings():
    plain, scaled, _ = pair(emb_multiplier=3.0)
    idx = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(scaled.embed(idx), 3.0 * plain.embed(idx))
        assert (scaled(idx) - plain(idx)).abs().max() > 1e-3


def test_the_logit_scale_multiplies_the_logits_before_the_softcap():
    plain, scaled, _ = pair(logit_scale=0.5)
    idx = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(scaled(idx), 0.5 * plain(idx), atol=1e-6)
    _, capped, _ = pair(logit_scale=0.5, logit_softcap=2.0)
    with torch.no_grad():
        assert torch.allclose(capped(idx), 2.0 * torch.tanh(0.5 * plain(idx) / 2.0), atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_the_head_bias_is_added_to_the_logits(tied):
    _, biased, missing = pair(head_bias=True, tie_weights=tied)
    assert missing == ["out_head.bias"]
    with torch.no_grad():
        biased.out_head.bias.copy_(torch.arange(64.0) / 10)
    idx = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        ours = biased(idx)
        hidden = biased.final_norm(biased.trf_blocks(biased.embed(idx)))  # (1, 4, 8)
        expected = hidden @ biased.out_head.weight.T + torch.arange(64.0) / 10
    assert torch.allclose(ours, expected, atol=1e-5)
    assert (biased.out_head.weight is biased.embed.tok_emb.weight) == tied


def test_the_options_at_their_defaults_stay_out_of_the_spec_data():
    data = vl.parse_model_spec({**GPT, "norm": "layer", "residual": "pre_norm"}, REG).to_data()
    for key in ("emb_multiplier", "logit_scale", "head_bias"):
        assert key not in data
    assert "affine" not in data["norm"] and "branch_scale" not in data["residual"]
    data = vl.parse_model_spec({**GPT, "norm": {"kind": "layer", "affine": False},
                                "residual": {"kind": "pre_norm", "branch_scale": 0.5},
                                "logit_scale": 0.25}, REG).to_data()
    assert data["norm"]["affine"] is False and data["residual"]["branch_scale"] == 0.5
    assert data["logit_scale"] == 0.25


def test_xielu_is_its_formula_and_transformers_python_form():
    act = REG.get("activation", "xielu")
    module = act.build(act.spec_cls())
    x = torch.linspace(-4.0, 3.0, 29)
    with torch.no_grad():
        module.alpha_p.fill_(0.3)
        module.alpha_n.fill_(-0.2)
        a_p, a_n = F.softplus(torch.tensor(0.3)), 0.5 + F.softplus(torch.tensor(-0.2))
        by_hand = torch.where(x > 0, a_p * x * x + 0.5 * x,
                              (torch.expm1(torch.clamp(x, max=-1e-6)) - x) * a_n + 0.5 * x)
        assert torch.allclose(module(x), by_hand, atol=1e-7)
    fresh = act.build(act.spec_cls(alpha_p_init=1.5, alpha_n_init=0.9))
    assert F.softplus(fresh.alpha_p).item() == pytest.approx(1.5)
    assert 0.5 + F.softplus(fresh.alpha_n).item() == pytest.approx(0.9)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.activations.XIELUActivation(dtype=torch.float32)
    with torch.no_grad():
        theirs.alpha_p.fill_(0.3)
        theirs.alpha_n.fill_(-0.2)
        assert torch.allclose(module(x), theirs._xielu_python(x), atol=1e-7)
    with pytest.raises(ValueError, match="alpha_n_init"):
        act.spec_cls(alpha_n_init=0.4)


def test_clip_qkv_clamps_the_three_projections():
    att = REG.get("attention", "mha")
    torch.manual_seed(0)
    module = att.build(att.spec_cls(clip_qkv=0.3), emb_dim=8, n_heads=2, context_length=8,
                       drop_rate=0.0, qkv_bias=True, causal=True)
    x = torch.randn(1, 5, 8) * 3
    with torch.no_grad():
        q, k, v = (lin(x).clamp(-0.3, 0.3).view(1, 5, 2, 4).transpose(1, 2)
                   for lin in (module.W_query, module.W_key, module.W_value))
        scores = (q @ k.transpose(-1, -2)) / 2.0  # (1, 2, 5, 5), head_dim 4
        scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), -torch.inf)
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, 8)
        assert torch.allclose(module(x), module.out_proj(context), atol=1e-6)


def test_each_head_qk_norm_gives_every_head_its_own_weights():
    att = REG.get("attention", "mha")
    norm = REG.get("norm", "rms")
    spec = att.spec_cls.model_validate({"qk_norm": {"kind": "rms"}, "qk_norm_scope": "each_head",
                                        "n_kv_heads": 1}, context={"registry": REG})
    module = att.build(spec, emb_dim=8, n_heads=2, context_length=8,
                       drop_rate=0.0, qkv_bias=False, causal=True,
                       make_norm=lambda dim, spec: norm.build(spec, dim=dim))
    assert len(module.q_norm) == 2 and len(module.k_norm) == 1
    with torch.no_grad():
        module.q_norm[1].scale.fill_(3.0)
    q = torch.randn(1, 2, 5, 4)  # (B, H, T, hd)
    rms = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-5)
    out = module.q_norm(q)
    assert torch.allclose(out[:, 0], rms[:, 0], atol=1e-6)
    assert torch.allclose(out[:, 1], 3.0 * rms[:, 1], atol=1e-6)
