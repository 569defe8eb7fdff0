"""Mixture-of-experts classes from transformers (Mixtral, Qwen3-MoE, OLMoE): perturbed
weights (router and fused experts included), equal parameter counts, logits within 1e-4 in
float32 with and without a padding mask, the routing options each family uses, dense layers
in a layout (Qwen3-MoE's mlp_only_layers / decoder_sparse_step), and a YAML round trip."""

import pytest
import torch
from conftest import assert_yaml_round_trip, left_padded_diff, n_params, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            vocab_size=64, max_position_embeddings=64, num_experts_per_tok=2)
CASES = {
    "mixtral": ("Mixtral", dict(BASE, intermediate_size=24, num_local_experts=4)),
    "mixtral-window-top1-tied": ("Mixtral", dict(
        BASE, intermediate_size=20, num_local_experts=3, num_experts_per_tok=1,
        sliding_window=4, tie_word_embeddings=True, head_dim=16)),
    "qwen3moe-renorm": ("Qwen3Moe", dict(BASE, intermediate_size=48, moe_intermediate_size=24,
                                         num_experts=4, norm_topk_prob=True)),
    "qwen3moe-dense-layer": ("Qwen3Moe", dict(
        BASE, num_hidden_layers=3, intermediate_size=40, moe_intermediate_size=16,
        num_experts=5, num_experts_per_tok=3, mlp_only_layers=[0], head_dim=16,
        attention_bias=True)),
    "qwen3moe-sparse-step-window": ("Qwen3Moe", dict(
        BASE, num_hidden_layers=4, intermediate_size=40, moe_intermediate_size=16,
        num_experts=4, decoder_sparse_step=2, use_sliding_window=True, sliding_window=3)),
    "olmoe": ("Olmoe", dict(BASE, intermediate_size=24, num_experts=4, pad_token_id=0,
                            eos_token_id=1)),
    "olmoe-renorm-mha": ("Olmoe", dict(BASE, intermediate_size=24, num_experts=6,
                                       num_key_value_heads=4, norm_topk_prob=True,
                                       pad_token_id=0, eos_token_id=1)),
}


def hf_model(family, kwargs):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**kwargs, attn_implementation="eager")
    return perturbed(getattr(transformers, f"{family}ForCausalLM")(config))


def max_diff(hf, model, idx):
    with torch.no_grad():
        return (model(idx) - hf(idx).logits).abs().max().item()


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    hf = hf_model(*CASES[case])
    spec, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    assert n_params(model) == n_params(hf)
    idx = torch.randint(0, 64, (2, 12))
    assert max_diff(hf, model, idx) < 1e-4


@pytest.mark.parametrize("case", list(CASES))
def test_left_padded_mask(case):
    hf = hf_model(*CASES[case])
    _, model = from_transformers(hf, REG)
    assert left_padded_diff(hf, model) < 1e-4


def test_what_the_spec_says():
    spec, _ = from_transformers(hf_model(*CASES["mixtral-window-top1-tied"]), REG)
    ff = spec.feedforward
    assert (ff.kind, ff.n_experts, ff.top_k, ff.router, ff.renormalize) == (
        "moe", 3, 1, "softmax_topk", True)
    assert ff.expert.hidden_dim == 20 and spec.attention.window == 4 and spec.tie_weights
    spec, _ = from_transformers(hf_model(*CASES["olmoe"]), REG)
    assert not spec.feedforward.renormalize and spec.attention.qk_norm_scope == "projection"
    assert spec.residual.kind == "pre_norm"
    spec, _ = from_transformers(hf_model(*CASES["qwen3moe-dense-layer"]), REG)
    assert spec.feedforward.renormalize is False and spec.feedforward.top_k == 3
    assert spec.layout.pattern == ["dense", "moe", "moe"]
    assert spec.layer_spec(0).feedforward.kind == "glu"
    assert spec.layer_spec(0).feedforward.hidden_dim == 40
    spec, _ = from_transformers(hf_model(*CASES["qwen3moe-sparse-step-window"]), REG)
    assert spec.layout.pattern == ["dense", "moe"] and spec.attention.window == 3


def test_the_routing_options_matter():
    """OLMoE without renormalisation and Mixtral's renormalised weights differ on the same
    weights: the import follows each family (so the equality above tests the choice)."""
    hf = hf_model(*CASES["olmoe"])
    spec, model = from_transformers(hf, REG)
    data = spec.to_data()
    data["feedforward"]["renormalize"] = True
    other = vl.build_model(data, REG)
    other.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 12))
    assert max_diff(hf, model.eval(), idx) < 1e-4
    assert max_diff(hf, other.eval(), idx) > 1e-2


@pytest.mark.parametrize("case", ["mixtral", "qwen3moe-dense-layer", "olmoe"])
def test_yaml_round_trip(case):
    spec, model = from_transformers(hf_model(*CASES[case]), REG)
    assert_yaml_round_trip(spec, model, REG)


def test_aux_loss_coefficient_where_transformers_adds_the_loss():
    family, kwargs = CASES["mixtral"]
    spec, _ = from_transformers(hf_model(family, kwargs), REG)
    assert spec.feedforward.aux_loss_coef == 0.0  # output_router_logits off: no aux loss
    spec, _ = from_transformers(hf_model(family, dict(
        kwargs, output_router_logits=True, router_aux_loss_coef=0.02)), REG)
    assert spec.feedforward.aux_loss_coef == 0.02


@pytest.mark.parametrize("family, kwargs, match", [
    ("Mixtral", dict(CASES["mixtral"][1], router_jitter_noise=0.1), "router_jitter_noise=0.1"),
    ("Olmoe", dict(CASES["olmoe"][1], clip_qkv=8.0), "clip_qkv=8.0"),
])
def test_unsupported_options_are_named(family, kwargs, match):
    config = getattr(transformers, f"{family}Config")(**kwargs)
    with pytest.raises(ConversionError, match=match):
        from_transformers(getattr(transformers, f"{family}ForCausalLM")(config), REG)
