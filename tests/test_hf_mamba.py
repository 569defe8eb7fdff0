"""MambaForCausalLM (Mamba 1) from transformers (issue 41.2): the selective-scan mixer
(``attention: mamba`` without inner norms), with and without in/out projection biases,
conv bias, a given dt rank; perturbed weights, equal parameter counts, logits within 1e-5 in
float32 against HF's pure-torch scan, left padding (without in_proj bias, as for Mamba-2),
sequences of several chunks, causality, both of our scan forms, a YAML round trip."""

import pytest
import torch
from conftest import (
    assert_causal,
    assert_close_logits,
    assert_yaml_round_trip,
    left_padded_diff,
    n_params,
    perturbed,
)

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=64, expand=2,
            conv_kernel=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {
    "tied-auto-rank": BASE,
    "biased-untied-rank-5": dict(BASE, use_bias=True, use_conv_bias=False, time_step_rank=5,
                                 tie_word_embeddings=False, conv_kernel=3, state_size=4),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    return perturbed(transformers.MambaForCausalLM(transformers.MambaConfig(**kwargs)))


@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    hf = hf_model(CASES[case])
    spec, model = vl.from_transformers(hf, REG)
    if impl == "recurrent":
        data = spec.to_data()
        data["attention"]["impl"] = "recurrent"
        state = model.state_dict()
        model = vl.build_model(data, REG)
        model.load_state_dict(state)
    assert n_params(model) == n_params(hf)
    assert_close_logits(model, hf, length=40)  # several chunks of 16
    if not spec.attention.bias:  # HF's in_proj bias enters the padded conv window
        assert left_padded_diff(hf, model) < 1e-5


def test_what_the_spec_says():
    spec, _ = vl.from_transformers(hf_model(CASES["tied-auto-rank"]), REG)
    att = spec.attention
    assert (att.kind, att.inner_norms, att.dt_rank, att.expand, att.d_state) == (
        "mamba", False, 2, 2, 8)
    assert spec.feedforward.kind == "none" and spec.positional.kind == "none"
    assert spec.tie_weights and spec.norm.kind == "rms"


def test_causal_and_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["biased-untied-rank-5"]), REG)
    assert_causal(model, 20, 12)
    assert_yaml_round_trip(spec, model, REG)


def test_another_convolution_activation_is_refused_by_name():
    with pytest.raises(ConversionError, match="transformers.hidden_act"):
        vl.from_transformers(hf_model(dict(BASE, hidden_act="gelu")), REG)
