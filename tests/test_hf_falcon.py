"""FalconForCausalLM from transformers (issue 41.2): the three block shapes (one shared norm,
the new architecture's two norms or one, sequential), multi-query, grouped and per-head fused
q/k/v, with and without biases; perturbed weights, equal parameter counts, logits within 1e-5
in float32 against both of transformers' attention implementations, left padding, causality
and a YAML round trip. Falcon's ALiBi is refused by name."""

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
BASE = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
            max_position_embeddings=64, ffn_hidden_size=48, bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0})
CASES = {
    "7b-multi-query-parallel": BASE,
    "per-head-biased-untied": dict(BASE, multi_query=False, bias=True, tie_word_embeddings=False),
    "new-architecture-two-norms": dict(BASE, new_decoder_architecture=True, num_kv_heads=2),
    "new-architecture-one-norm": dict(BASE, new_decoder_architecture=True, num_kv_heads=2,
                                      num_ln_in_parallel_attn=1, activation="relu"),
    "sequential-biased": dict(BASE, parallel_attn=False, bias=True),
}


def hf_model(kwargs, attn="eager"):
    return perturbed_hf("Falcon", kwargs, attn)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, attn):
    hf = hf_model(CASES[case], attn)
    assert_imports_equal(hf, REG, "sdpa" if attn == "sdpa" else "naive", tol=1e-5)


def test_what_the_spec_says():
    spec, _ = vl.from_transformers(hf_model(CASES["7b-multi-query-parallel"]), REG)
    assert (spec.residual.kind, spec.residual.shared_norm) == ("parallel", True)
    assert spec.attention.n_kv_heads == 1 and spec.positional.theta == 500.0
    assert not (spec.qkv_bias or spec.ffn_bias) and spec.tie_weights
    spec, _ = vl.from_transformers(hf_model(CASES["new-architecture-two-norms"]), REG)
    assert (spec.residual.shared_norm, spec.attention.n_kv_heads) == (False, 2)
    spec, _ = vl.from_transformers(hf_model(CASES["sequential-biased"]), REG)
    assert spec.residual.kind == "pre_norm" and spec.attention.n_kv_heads == 1
    spec, _ = vl.from_transformers(hf_model(CASES["per-head-biased-untied"]), REG)
    assert spec.attention.n_kv_heads is None and spec.qkv_bias and not spec.tie_weights


def test_causal():
    _, model = vl.from_transformers(hf_model(CASES["new-architecture-two-norms"]), REG)
    assert_causal(model, 10, 6)


def test_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["per-head-biased-untied"]), REG)
    assert_yaml_round_trip(spec, model, REG)


@pytest.mark.parametrize("kwargs,option", [
    (dict(alibi=True), "alibi"),
    (dict(multi_query=False, num_kv_heads=2), "num_kv_heads"),
    (dict(activation="gelu_fast"), "activation"),
    (dict(new_decoder_architecture=True, parallel_attn=False), "parallel_attn"),
])
def test_what_falcon_has_and_variantlab_does_not_is_refused_by_name(kwargs, option):
    with pytest.raises(ConversionError, match=f"transformers.{option}"):
        vl.from_transformers(hf_model(dict(BASE, **kwargs)), REG)
