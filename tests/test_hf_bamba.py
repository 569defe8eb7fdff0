"""BambaForCausalLM from transformers (issue 41.2): Mamba-2 layers and grouped-query attention
layers with half-head rotary as a layout, each followed by a SwiGLU; perturbed weights, equal
parameter counts, logits within 1e-5 in float32 against both attention implementations, left
padding (without the mixer's projection biases, as for Mamba-2), sequences of several chunks,
causality, a YAML round trip; the attention layers' place matters."""

import pytest
import torch
from conftest import (
    assert_causal,
    assert_close_logits,
    assert_yaml_round_trip,
    left_padded_diff,
    n_params,
    perturbed_hf,
)

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
            vocab_size=64, max_position_embeddings=64, intermediate_size=48,
            attn_layer_indices=[1], mamba_n_heads=8, mamba_d_state=8, mamba_n_groups=2,
            mamba_chunk_size=4)
CASES = {
    "one-attention-layer": BASE,
    "biased-tied": dict(BASE, num_key_value_heads=4, num_hidden_layers=3,
                        attn_layer_indices=[0, 2], mamba_n_heads=4, mamba_d_state=4,
                        mamba_chunk_size=8, attention_bias=True, mlp_bias=True,
                        tie_word_embeddings=True, mamba_conv_bias=False),
    "projection-biases": dict(BASE, mamba_proj_bias=True),
}


def hf_model(kwargs, attn="eager"):
    return perturbed_hf("Bamba", kwargs, attn)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, attn):
    hf = hf_model(CASES[case], attn)
    spec, model = vl.from_transformers(hf, REG, impl="sdpa" if attn == "sdpa" else "naive")
    assert n_params(model) == n_params(hf)
    assert_close_logits(model, hf, length=14)  # several chunks
    if not CASES[case].get("mamba_proj_bias"):  # HF's in_proj bias enters the padded window
        assert left_padded_diff(hf, model) < 1e-5


def test_what_the_spec_says_and_the_attention_layers_matter():
    hf = hf_model(CASES["one-attention-layer"])
    spec, model = vl.from_transformers(hf, REG)
    assert [spec.layer_spec(i).attention.kind for i in range(4)] == [
        "mamba2", "mha", "mamba2", "mamba2"]
    mixer = spec.layer_spec(0).attention
    assert (mixer.kind, mixer.head_dim, mixer.n_groups, mixer.d_state) == ("mamba2", 8, 2, 8)
    assert spec.layer_spec(1).attention.kind == "mha" and spec.positional.fraction == 0.5
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ref = hf(idx).logits
        data = spec.to_data()
        data["positional"] = {"kind": "rotary", "theta": spec.positional.theta}
        other = vl.build_model(data, REG).eval()  # the whole head rotated instead of half
        other.load_state_dict(model.state_dict())
        assert (other(idx) - ref).abs().max().item() > 1e-3


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["biased-tied"]), REG)
    assert_causal(model, 12, 7)
    assert_yaml_round_trip(spec, model, REG)


def test_clamped_time_steps_are_refused_by_name():
    with pytest.raises(ConversionError, match="transformers.time_step_limit"):
        vl.from_transformers(hf_model(dict(BASE, time_step_limit=(0.0, 1.0))), REG)
