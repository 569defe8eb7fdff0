"""DeepseekV2ForCausalLM and DeepseekV3ForCausalLM from transformers (issue 29.2): perturbed
weights (the V3 choice bias included), equal parameter counts, logits within 1e-4 in float32
with both attention implementations and with a left-padding mask, MLA with and without the
low-rank query, interleaved and plain rotary, V2's greedy and group-limited routing, V3's
sigmoid group-limited routing, the first dense layers as a layout, and a YAML round trip."""

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed_hf

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3,
            vocab_size=64, max_position_embeddings=64, intermediate_size=48,
            moe_intermediate_size=16, kv_lora_rank=12, q_lora_rank=10, qk_rope_head_dim=4,
            qk_nope_head_dim=6, v_head_dim=5, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1)
CASES = {
    "v3": ("DeepseekV3", dict(BASE, n_group=4, topk_group=2, routed_scaling_factor=2.5)),
    "v3-full-query-plain-rope": ("DeepseekV3", dict(
        BASE, q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1,
        norm_topk_prob=False, n_shared_experts=2, first_k_dense_replace=0, attention_bias=True)),
    "v2-group-limited": ("DeepseekV2", dict(BASE, topk_method="group_limited_greedy", n_group=4,
                                            topk_group=2, routed_scaling_factor=1.5)),
    "v2-greedy-full-query-tied": ("DeepseekV2", dict(BASE, q_lora_rank=None, first_k_dense_replace=2,
                                                     tie_word_embeddings=True)),
}


def hf_model(family, kwargs):
    return perturbed_hf(family, kwargs)


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(*CASES[case]), REG, impl, padded=impl == 'naive')


def test_what_the_spec_says():
    spec, _ = from_transformers(hf_model(*CASES["v3"]), REG)
    att, ff = spec.attention, spec.feedforward
    assert (att.kind, att.kv_lora_rank, att.q_lora_rank, att.qk_rope_head_dim) == ("mla", 12, 10, 4)
    assert (ff.router, ff.n_group, ff.topk_group, ff.group_score, ff.routed_scaling_factor,
            ff.choice_bias, ff.renormalize) == ("sigmoid_topk", 4, 2, "top2_sum", 2.5, True, True)
    assert spec.layout.layers == {0: "dense"} and spec.layer_spec(0).feedforward.kind == "glu"
    assert spec.layer_spec(1).feedforward.kind == "moe"
    spec, _ = from_transformers(hf_model(*CASES["v2-group-limited"]), REG)
    ff = spec.feedforward
    assert (ff.router, ff.group_score, ff.renormalize) == ("softmax_topk", "max", False)


def test_the_rotary_reordering_and_the_routing_matter():
    """Without the de-interleaving, or without the group limit, the logits differ: the
    equality above tests both."""
    hf = hf_model(*CASES["v3"])
    spec, model = from_transformers(hf, REG)
    idx = torch.randint(0, 64, (2, 12))
    state = model.state_dict()
    data = spec.to_data()
    data["feedforward"].pop("n_group")
    data["feedforward"].pop("topk_group")
    other = vl.build_model(data, REG)
    other.load_state_dict(state)
    plain = {k: v.clone() for k, v in state.items()}
    for k in [k for k in plain if k.endswith("kv_a_proj.weight")]:
        plain[k] = hf.state_dict()[k.replace("trf_blocks", "model.layers").replace(
            "att.sublayer.kv_a_proj", "self_attn.kv_a_proj_with_mqa")]
    interleaved = vl.build_model(spec, REG)
    interleaved.load_state_dict(plain)
    with torch.no_grad():
        ref = hf(idx).logits
        assert (model.eval()(idx) - ref).abs().max().item() < 1e-4
        assert (other.eval()(idx) - ref).abs().max().item() > 1e-3
        assert (interleaved.eval()(idx) - ref).abs().max().item() > 1e-3


@pytest.mark.parametrize("case", ["v3", "v2-greedy-full-query-tied"])
def test_yaml_round_trip(case):
    spec, model = from_transformers(hf_model(*CASES[case]), REG)
    assert_yaml_round_trip(spec, model, REG)


@pytest.mark.parametrize("family, kwargs, match", [
    ("DeepseekV3", dict(BASE, num_key_value_heads=2), "num_key_value_heads=2"),
    ("DeepseekV2", dict(BASE, mlp_bias=True), "mlp_bias=True"),
])
def test_unsupported_options_are_named(family, kwargs, match):
    config = getattr(transformers, f"{family}Config")(**kwargs)
    with pytest.raises(ConversionError, match=match):
        from_transformers(getattr(transformers, f"{family}ForCausalLM")(config), REG)
