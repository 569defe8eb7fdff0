"""GPTBigCodeForCausalLM from transformers (issue 41.2): multi-query attention through the
fused q/k/v Linear (and its per-head layout without ``multi_query``); perturbed weights,
equal parameter counts, logits within 1e-5 in float32 against both attention
implementations, left padding, causality, a YAML round trip."""

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
BASE = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=64, bos_token_id=1,
            eos_token_id=2)
CASES = {
    "multi-query-tied": BASE,
    "per-head-untied-relu": dict(BASE, multi_query=False, tie_word_embeddings=False,
                                 activation_function="relu", n_inner=48),
}


def hf_model(kwargs, attn="eager"):
    return perturbed_hf("GPTBigCode", kwargs, attn)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, attn):
    hf = hf_model(CASES[case], attn)
    assert_imports_equal(hf, REG, "sdpa" if attn == "sdpa" else "naive", tol=1e-5)


def test_what_the_spec_says():
    spec, _ = vl.from_transformers(hf_model(CASES["multi-query-tied"]), REG)
    assert spec.attention.n_kv_heads == 1 and spec.positional.kind == "learned"
    spec, _ = vl.from_transformers(hf_model(CASES["per-head-untied-relu"]), REG)
    assert spec.attention.n_kv_heads is None and spec.feedforward.hidden_dim == 48


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["multi-query-tied"]), REG)
    assert_causal(model, 10, 6)
    assert_yaml_round_trip(spec, model, REG)


def test_unscaled_scores_are_refused_by_name():
    config = transformers.GPTBigCodeConfig(**BASE, scale_attn_weights=False)
    with pytest.raises(ConversionError, match="transformers.scale_attn_weights"):
        vl.from_transformers(transformers.GPTBigCodeForCausalLM(config), REG)
