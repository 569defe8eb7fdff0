"""MptForCausalLM from transformers (issue 41.2): ALiBi with MPT's slopes (a power-of-two
head count and another), bias-free LayerNorms and Linears, the fused q/k/v, a softmax scale;
perturbed weights, equal parameter counts, logits within 1e-5 in float32 with both of our
attention implementations (transformers has MPT in eager only), left padding, causality, a
YAML round trip; clamped q/k/v is refused by name."""

import pytest
from conftest import (
    assert_causal,
    assert_imports_equal,
    assert_yaml_round_trip,
    perturbed_hf,
)

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()
BASE = dict(d_model=32, n_heads=4, n_layers=2, vocab_size=64, max_seq_len=64)
CASES = {
    "four-heads-tied": BASE,
    "six-heads-scaled-untied": dict(BASE, d_model=48, n_heads=6, tie_word_embeddings=False,
                                    attn_config={"softmax_scale": 0.3}),
}


def hf_model(kwargs):
    return perturbed_hf("Mpt", kwargs)


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    hf = hf_model(CASES[case])
    assert_imports_equal(hf, REG, impl, tol=1e-5)


def test_what_the_spec_says():
    spec, _ = vl.from_transformers(hf_model(CASES["six-heads-scaled-untied"]), REG)
    assert (spec.positional.kind, spec.attention.scale, spec.norm_bias) == ("alibi", 0.3, False)
    assert spec.feedforward.hidden_dim == 4 * 48 and spec.activation.approximate == "none"


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["four-heads-tied"]), REG)
    assert_causal(model, 10, 6)
    assert_yaml_round_trip(spec, model, REG)


def test_clamped_qkv_is_refused_by_name():
    config = transformers.MptConfig(**BASE, attn_config={"clip_qkv": 6.0})
    with pytest.raises(ConversionError, match="clip_qkv"):
        vl.from_transformers(transformers.MptForCausalLM(config), REG)
