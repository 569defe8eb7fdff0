"""BloomForCausalLM from transformers (issue 41.2): ALiBi (BLOOM's slopes, power-of-two and
other head counts), the embedding LayerNorm (``embedding_norm``), the per-head fused q/k/v;
perturbed weights, equal parameter counts, logits within 1e-5 in float32 with both of our
attention implementations (transformers has BLOOM in eager only), left padding, causality, a
YAML round trip; the embedding norm and ALiBi matter."""

import pytest
import torch
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
BASE = dict(hidden_size=32, n_head=4, n_layer=2, vocab_size=64)
CASES = {
    "four-heads-tied": BASE,
    "six-heads-untied": dict(BASE, hidden_size=48, n_head=6, tie_word_embeddings=False,
                             layer_norm_epsilon=1e-6),
}


def hf_model(kwargs):
    return perturbed_hf("Bloom", kwargs)


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    hf = hf_model(CASES[case])
    assert_imports_equal(hf, REG, impl, tol=1e-5)


def test_what_the_spec_says_and_the_embedding_norm_and_alibi_matter():
    hf = hf_model(CASES["six-heads-untied"])
    spec, model = vl.from_transformers(hf, REG)
    assert spec.embedding_norm and spec.positional.kind == "alibi"
    assert spec.context_length == 2048 and spec.norm.eps == 1e-6
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ref = hf(idx).logits
        for change in ({"embedding_norm": False}, {"positional": {"kind": "none"}}):
            other = vl.build_model(dict(spec.to_data(), **change), REG).eval()
            keep = change.get("embedding_norm", True)  # without the norm, without its weights
            other.load_state_dict({k: v for k, v in model.state_dict().items()
                                   if keep or not k.startswith("embed_norm.")})
            assert (other(idx) - ref).abs().max().item() > 1e-3, change


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["four-heads-tied"]), REG)
    assert_causal(model, 10, 6)
    assert_yaml_round_trip(spec, model, REG)


def test_a_residual_after_the_norm_is_refused_by_name():
    config = transformers.BloomConfig(**BASE, apply_residual_connection_post_layernorm=True)
    with pytest.raises(ConversionError, match="apply_residual_connection_post_layernorm"):
        vl.from_transformers(transformers.BloomForCausalLM(config), REG)
