"""GptOssForCausalLM from transformers (issue 29.2): perturbed weights (sinks, router bias and
the biased, transposed, interleaved experts included), equal parameter counts, logits within
1e-4 in float32 with both attention implementations and a left-padding mask, alternating
sliding-window and full layers on sequences longer than the window, and a YAML round trip."""

import copy

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            num_hidden_layers=2, vocab_size=64, max_position_embeddings=64,
            intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, swiglu_limit=1.5)
CASES = {
    "alternating": BASE,
    "two-sliding-one-full-no-bias-top1": dict(
        BASE, num_hidden_layers=3, attention_bias=False, num_experts_per_tok=1,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "all-full-tied": dict(BASE, layer_types=["full_attention"] * 2, tie_word_embeddings=True,
                          swiglu_alpha=1.2),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**kwargs, attn_implementation="eager")
    return perturbed(transformers.GptOssForCausalLM(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(CASES[case]), REG, impl)


def test_what_the_spec_says():
    spec, _ = from_transformers(hf_model(CASES["two-sliding-one-full-no-bias-top1"]), REG)
    assert spec.attention.sinks and spec.layout.pattern == ["sliding", "sliding", "full"]
    assert spec.layer_spec(0).attention.window == 4 and spec.layer_spec(2).attention.window is None
    ff = spec.feedforward
    assert (ff.router, ff.router_bias, ff.expert.kind, ff.expert.bias, ff.expert.limit) == (
        "topk_softmax", True, "clamped_swiglu", True, 1.5)


def test_sinks_clamp_and_window_matter():
    """Without sinks, with a looser clamp or without the window, the logits differ: the
    equality above tests each."""
    hf = hf_model(CASES["alternating"])
    spec, model = from_transformers(hf, REG)
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ref = hf(idx).logits
    data = spec.to_data()
    no_sinks = copy.deepcopy(data)
    no_sinks["attention"]["sinks"] = False
    no_sinks["layout"]["kinds"]["sliding"]["attention"]["sinks"] = False
    loose = copy.deepcopy(data)
    loose["feedforward"]["expert"]["limit"] = 100.0
    full = dict(copy.deepcopy(data), layout=None)  # every layer full attention
    for name, other in (("sinks", no_sinks), ("clamp", loose), ("window", full)):
        built = vl.build_model(other, REG)
        state = {k: v for k, v in model.state_dict().items() if k in built.state_dict()}
        built.load_state_dict(state)
        with torch.no_grad():
            assert (built.eval()(idx) - ref).abs().max().item() > 1e-3, name


def test_yaml_round_trip():
    spec, model = from_transformers(hf_model(CASES["alternating"]), REG)
    assert_yaml_round_trip(spec, model, REG)


def test_the_default_yarn_rotary_is_imported():
    """gpt-oss's own rope (YaRN, factor 32, no truncation; tests/test_rope_scaling.py checks
    its logits at lengths past the original context)."""
    config = transformers.GptOssConfig(**dict(BASE, rope_parameters=None))
    spec, _ = from_transformers(transformers.GptOssForCausalLM(config), REG)
    pos = spec.positional
    assert (pos.scaling, pos.factor, pos.truncate, pos.beta_fast, pos.beta_slow,
            pos.original_context, pos.theta) == ("yarn", 32.0, False, 32.0, 1.0, 4096, 150000.0)
