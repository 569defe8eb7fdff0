"""SmolLM3ForCausalLM from transformers (issue 29.2): NoPE layers as a layout (``positional:
none`` in the layer kind ``nope``), with and without sliding windows, perturbed weights,
equal parameter counts, logits within 1e-4 in float32 with both attention implementations
and a left-padding mask, and a YAML round trip; the NoPE layers matter."""

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
            vocab_size=64, max_position_embeddings=64, intermediate_size=48,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {
    "every-4th-nope-tied": BASE,
    "every-other-nope-untied-bias": dict(BASE, no_rope_layer_interval=2, tie_word_embeddings=False,
                                         attention_bias=True),
    "sliding-nope-layers": dict(BASE, no_rope_layers=[1, 0, 1, 0], use_sliding_window=True,
                                sliding_window=3),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    config = transformers.SmolLM3Config(**kwargs, attn_implementation="eager")
    return perturbed(transformers.SmolLM3ForCausalLM(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(CASES[case]), REG, impl)


def test_what_the_spec_says_and_nope_matters():
    hf = hf_model(CASES["every-4th-nope-tied"])
    spec, model = from_transformers(hf, REG)
    assert spec.layout.pattern == ["rope", "rope", "rope", "nope"]
    assert spec.layer_spec(3).positional.kind == "none"
    assert spec.layer_spec(0).positional.kind == "rotary"
    all_rope = vl.build_model(dict(spec.to_data(), layout=None), REG)
    all_rope.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (all_rope.eval()(idx) - hf(idx).logits).abs().max().item() > 1e-3
    spec, _ = from_transformers(hf_model(CASES["sliding-nope-layers"]), REG)
    assert spec.layout.pattern == ["rope", "nope_sliding"]
    assert spec.layer_spec(1).attention.window == 3 and spec.layer_spec(0).attention.window is None


def test_yaml_round_trip():
    spec, model = from_transformers(hf_model(CASES["every-other-nope-untied-bias"]), REG)
    assert_yaml_round_trip(spec, model, REG)
