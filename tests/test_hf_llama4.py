"""Llama4ForCausalLM (text) from transformers (issue 29.2): chunked local attention on the
rotary layers, NoPE layers, the parameter-free QK L2 norm, MoE layers (sigmoid router,
input-scaled experts, a shared expert) interleaved with dense ones; perturbed weights, equal
parameter counts, logits within 1e-4 in float32 with both attention implementations and a
left-padding mask on sequences longer than a chunk, a YAML round trip, refusals."""

import copy

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            num_hidden_layers=4, vocab_size=64, max_position_embeddings=64, intermediate_size=16,
            intermediate_size_mlp=40, num_local_experts=4, num_experts_per_tok=1,
            attention_chunk_size=4, attn_temperature_tuning=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {
    "moe-every-layer": BASE,
    "interleaved-moe-no-qk-norm-top2": dict(BASE, interleave_moe_layer_step=2, use_qk_norm=False,
                                            no_rope_layer_interval=2, num_experts_per_tok=2),
    "nope-first-bias-tied": dict(BASE, no_rope_layers=[0, 1, 1, 1], attention_bias=True,
                                 tie_word_embeddings=True, moe_layers=[0, 3]),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(**kwargs, attn_implementation="eager")
    return perturbed(transformers.Llama4ForCausalLM(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(CASES[case]), REG, impl)


def test_what_the_spec_says():
    spec, _ = from_transformers(hf_model(CASES["interleaved-moe-no-qk-norm-top2"]), REG)
    assert spec.layout.pattern == ["rope_dense", "nope"]
    rope, nope = spec.layer_spec(0), spec.layer_spec(1)
    assert rope.attention.chunk == 4 and rope.attention.qk_norm is None
    assert rope.feedforward.kind == "glu" and rope.feedforward.hidden_dim == 40
    assert nope.positional.kind == "none" and nope.attention.chunk is None
    ff = nope.feedforward
    assert (ff.kind, ff.router, ff.renormalize, ff.scale_input, ff.n_shared_experts) == (
        "moe", "sigmoid_topk", False, True, 1)
    spec, _ = from_transformers(hf_model(CASES["moe-every-layer"]), REG)
    assert spec.attention.qk_norm.kind == "l2" and spec.layout.pattern == ["rope"] * 3 + ["nope"]


def test_chunks_norm_and_scaled_inputs_matter():
    hf = hf_model(CASES["moe-every-layer"])
    spec, model = from_transformers(hf, REG)
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ref = hf(idx).logits
    data = spec.to_data()
    no_chunk, no_norm, out_scaled = (copy.deepcopy(data) for _ in range(3))
    no_chunk["attention"].pop("chunk")
    no_norm["attention"].pop("qk_norm")
    out_scaled["feedforward"]["scale_input"] = False
    for name, other in (("chunk", no_chunk), ("qk_norm", no_norm), ("scale_input", out_scaled)):
        built = vl.build_model(other, REG)
        built.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert (built.eval()(idx) - ref).abs().max().item() > 1e-3, name


def test_yaml_round_trip():
    spec, model = from_transformers(hf_model(CASES["nope-first-bias-tied"]), REG)
    assert_yaml_round_trip(spec, model, REG)


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_temperature_tuning_on_the_nope_layers(impl):
    """attn_temperature_tuning (the default): the NoPE layers' queries times
    attn_scale ln(1 + floor((t + 1) / floor_scale)) + 1, as a ``query_temperature``
    positional in the NoPE layer kind; equal logits (left padding too: t counts sequence
    indices on both sides), it matters, and it exports back."""
    kwargs = dict(BASE, attn_temperature_tuning=True, floor_scale=3, attn_scale=0.5)
    hf = hf_model(kwargs)
    spec, model = assert_imports_equal(hf, REG, impl)
    nope = spec.layer_spec(3).positional
    assert (nope.kind, nope.floor_scale, nope.scale) == ("query_temperature", 3, 0.5)
    assert spec.layer_spec(0).positional.kind == "rotary"
    plain = dict(spec.to_data())
    plain["layout"]["kinds"]["nope"]["positional"] = {"kind": "none"}
    untuned = vl.build_model(plain, REG)
    untuned.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (untuned.eval()(idx) - hf(idx).logits).abs().max().item() > 1e-3
        back = vl.to_transformers(spec, model)
        assert (back.config.attn_temperature_tuning, back.config.floor_scale,
                back.config.attn_scale) == (True, 3, 0.5)
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5


def test_llama4_default_rope_scaling_imports():
    """Llama 4's released rope (llama3, factor 16 in Scout's config) converts past the
    original context."""
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
            "low_freq_factor": 1.0, "high_freq_factor": 1.5,
            "original_max_position_embeddings": 8}
    hf = hf_model(dict(BASE, rope_parameters=rope))
    spec, model = from_transformers(hf, REG)
    assert spec.layer_spec(0).positional.scaling == "llama3"
    idx = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        assert (model.eval()(idx) - hf(idx).logits).abs().max().item() < 1e-5
        back = vl.to_transformers(spec, model)
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5
