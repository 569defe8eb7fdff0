"""GPTJForCausalLM from transformers (issue 41.2): the parallel block with one shared norm,
partial rotary in interleaved pairs (reordered to rotate-half pairs on import), a biased
output head (``head_bias``); perturbed weights, equal parameter counts, logits within 1e-5 in
float32 against both attention implementations, left padding, causality, a YAML round trip;
the reordering and the head bias matter."""

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
BASE = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=64, rotary_dim=4,
            bos_token_id=1, eos_token_id=2)
CASES = {
    "quarter-rotary": BASE,
    "whole-head-tied-gelu": dict(BASE, rotary_dim=8, n_inner=48, tie_word_embeddings=True,
                                 activation_function="gelu"),
}


def hf_model(kwargs, attn="eager"):
    return perturbed_hf("GPTJ", kwargs, attn)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, attn):
    hf = hf_model(CASES[case], attn)
    assert_imports_equal(hf, REG, "sdpa" if attn == "sdpa" else "naive", tol=1e-5)


def test_what_the_spec_says_and_the_pairs_and_head_bias_matter():
    hf = hf_model(CASES["quarter-rotary"])
    spec, model = vl.from_transformers(hf, REG)
    assert (spec.residual.kind, spec.residual.shared_norm, spec.head_bias) == (
        "parallel", True, True)
    assert (spec.positional.fraction, spec.positional.theta) == (0.5, 10000.0)
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        ref = hf(idx).logits
        state = model.state_dict()
        for name in ("W_query", "W_key"):  # GPT-J's own row order: pairs split wrongly
            key = f"trf_blocks.0.res.attention.{name}.weight"
            state[key] = hf.state_dict()[f"transformer.h.0.attn.{name[2].lower()}_proj.weight"]
        model.load_state_dict(state)
        assert (model(idx) - ref).abs().max().item() > 1e-3
        model.load_state_dict(vl.from_transformers(hf, REG)[1].state_dict())
        model.out_head.bias.zero_()
        assert (model(idx) - ref).abs().max().item() > 1e-3


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["whole-head-tied-gelu"]), REG)
    assert_causal(model, 10, 6)
    assert_yaml_round_trip(spec, model, REG)


@pytest.mark.parametrize("rotary_dim", [3, 10])
def test_a_rotary_dim_transformers_cannot_run_is_refused_by_name(rotary_dim):
    hf = transformers.GPTJForCausalLM(transformers.GPTJConfig(**dict(BASE, rotary_dim=rotary_dim)))
    with pytest.raises(ConversionError, match="transformers.rotary_dim"):
        vl.from_transformers(hf, REG)
