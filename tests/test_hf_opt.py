"""OPTForCausalLM from transformers (issue 41.2): learned positions two rows on
(``positional: {kind: learned, offset: 2}``), pre-norm with a final norm and post-norm
without, with and without biases, OPT-350m's narrower token embeddings (``token_dim``:
project_in / project_out); perturbed weights, equal parameter counts, logits within
1e-5 in float32 against both attention implementations, left padding, causality, a YAML
round trip; what OPT has and variantlab lacks is refused by name."""

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
BASE = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
            max_position_embeddings=64, ffn_dim=48, word_embed_proj_dim=32, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)
CASES = {
    "pre-norm-tied": BASE,
    "post-norm-unbiased-untied": dict(BASE, do_layer_norm_before=False, enable_bias=False,
                                      tie_word_embeddings=False, activation_function="gelu"),
    "350m-projected-post-norm": dict(BASE, do_layer_norm_before=False, word_embed_proj_dim=16),
}


def hf_model(kwargs, attn="eager"):
    return perturbed_hf("OPT", kwargs, attn)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, attn):
    hf = hf_model(CASES[case], attn)
    assert_imports_equal(hf, REG, "sdpa" if attn == "sdpa" else "naive", tol=1e-5)


def test_what_the_spec_says_and_position_p_reads_row_p_plus_2():
    spec, model = vl.from_transformers(hf_model(CASES["pre-norm-tied"]), REG)
    model.eval()  # OPT's dropout 0.1 is imported
    assert spec.drop("resid") == 0.1 and spec.positional.offset == 2
    assert spec.final_norm and spec.residual.kind == "pre_norm"
    table = model.embed.pos_emb.pos_emb.weight
    assert table.shape == (64 + 2, 32)
    idx = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        before = model(idx)
        table[:2] = 0.0  # the rows before the first position's are never read
        assert torch.equal(model(idx), before)
        table[2] += torch.randn(32)  # position 0's row
        after = model(idx)
    assert (after[0, 0] - before[0, 0]).abs().max().item() > 1e-3
    spec, _ = vl.from_transformers(hf_model(CASES["post-norm-unbiased-untied"]), REG)
    assert spec.residual.kind == "post_norm" and not spec.final_norm and not spec.qkv_bias


def test_the_projections_of_narrower_token_embeddings_matter():
    hf = hf_model(CASES["350m-projected-post-norm"])
    spec, model = vl.from_transformers(hf, REG)
    model.eval()
    assert spec.token_dim == 16 and spec.tie_weights
    assert model.embed.tok_emb.weight.shape == (64, 16) and model.out_head.in_features == 16
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        before = model(idx)
        model.project_out.weight.mul_(1.5)
        assert (model(idx) - before).abs().max().item() > 1e-3
        model.project_out.weight.div_(1.5)
        model.embed.project_in.weight.mul_(1.5)
        assert (model(idx) - before).abs().max().item() > 1e-3


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["post-norm-unbiased-untied"]), REG)
    assert_causal(model, 10, 6)
    assert_yaml_round_trip(spec, model, REG)


@pytest.mark.parametrize("kwargs,option", [
    (dict(layer_norm_elementwise_affine=False), "layer_norm_elementwise_affine"),
    (dict(layerdrop=0.1), "layerdrop"),
])
def test_what_opt_has_and_variantlab_does_not_is_refused_by_name(kwargs, option):
    hf = transformers.OPTForCausalLM(transformers.OPTConfig(**dict(BASE, **kwargs)))
    with pytest.raises(ConversionError, match=f"transformers.{option}"):
        vl.from_transformers(hf, REG)
