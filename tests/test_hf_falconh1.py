"""FalconH1ForCausalLM from transformers (issue 29.2): the parallel hybrid block (attention
and Mamba-2 on the same normalised input) with every μP multiplier set away from 1, the
mixer's three norm settings, perturbed weights, equal parameter counts, logits within 1e-4 in
float32 with both attention implementations and a left-padding mask, a YAML round trip; and
the block equal to its two parts run by hand."""

import copy

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            vocab_size=64, max_position_embeddings=64, intermediate_size=48, mamba_d_ssm=48,
            mamba_n_heads=6, mamba_d_state=4, mamba_n_groups=2, mamba_chunk_size=4,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
            embedding_multiplier=1.5, lm_head_multiplier=0.5, key_multiplier=0.7,
            attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.2,
            ssm_out_multiplier=0.9, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 2.0],
            mlp_multipliers=[1.1, 0.6])
CASES = {
    "gate-only": BASE,
    "norm-before-gate": dict(BASE, mamba_rms_norm=True),
    "norm-after-gate-biased": dict(BASE, mamba_rms_norm=True, mamba_norm_before_gate=False,
                                   attention_bias=True, mamba_d_ssm=None, mamba_expand=2,
                                   mamba_n_heads=8),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    config = transformers.FalconH1Config(**kwargs, attn_implementation="eager")
    return perturbed(transformers.FalconH1ForCausalLM(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(CASES[case]), REG, impl)


def test_what_the_spec_says_and_the_multipliers_matter():
    hf = hf_model(CASES["gate-only"])
    spec, model = vl.from_transformers(hf, REG)
    att = spec.attention
    assert (att.kind, att.attention_in, att.attention_out, att.mixer_in, att.mixer_out) == (
        "parallel_hybrid", 1.3, 0.8, 1.2, 0.9)
    assert (att.mixer.inner_dim, att.mixer.head_dim, att.mixer.gate_norm) == (48, 8, "gate_only")
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ref = hf(idx).logits
    for key in ("attention_in", "attention_out", "mixer_in", "mixer_out"):
        data = copy.deepcopy(spec.to_data())
        data["attention"][key] = 1.0
        other = vl.build_model(data, REG)
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert (other.eval()(idx) - ref).abs().max().item() > 1e-3, key


def test_block_is_its_two_parts_added():
    spec, model = vl.from_transformers(hf_model(CASES["norm-before-gate"]), REG)
    block = model.trf_blocks[0].att.sublayer
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        by_hand = (block.mixer(x * 1.2) * 0.9 + block.attention(x * 1.3) * 0.8)
        assert (block(x) - by_hand).abs().max().item() < 1e-6
    assert block.state_size(10) == block.attention.state_size(10) + block.mixer.state_size(10)


def test_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["norm-after-gate-biased"]), REG)
    assert_yaml_round_trip(spec, model, REG)


def test_tied_embeddings_with_multipliers_are_named():
    config = transformers.FalconH1Config(**dict(BASE, tie_word_embeddings=True))
    with pytest.raises(ConversionError, match="tie_word_embeddings=True"):
        vl.from_transformers(transformers.FalconH1ForCausalLM(config), REG)
