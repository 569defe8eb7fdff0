"""Mistral from transformers: Llama with a sliding window on every layer. Perturbed weights,
equal parameter counts, logits within 1e-4 in float32 on sequences longer than the window,
with and without a padding mask, in both attention implementations, and a YAML round trip."""

import pytest
import torch
from conftest import assert_yaml_round_trip, left_padded_diff, n_params, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
            num_hidden_layers=2, vocab_size=64, max_position_embeddings=64, sliding_window=4)
CASES = {
    "window4-gqa": dict(BASE),
    "window3-headdim-tied": dict(BASE, sliding_window=3, head_dim=16, num_key_value_heads=1,
                                 tie_word_embeddings=True, rms_norm_eps=1e-5),
    "no-window-gelu": dict(BASE, sliding_window=None, hidden_act="gelu_pytorch_tanh",
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    config = transformers.MistralConfig(**kwargs, attn_implementation="eager")
    return perturbed(transformers.MistralForCausalLM(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    hf = hf_model(CASES[case])
    spec, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    assert n_params(model) == n_params(hf)
    assert spec.attention.window == hf.config.sliding_window
    idx = torch.randint(0, 64, (2, 12))  # 12 tokens, windows of 3 and 4: the window matters
    with torch.no_grad():
        ref, ours = hf(idx).logits, model(idx)
    assert (ours - ref).abs().max().item() < 1e-4


def test_the_window_matters():
    """The same weights without the window give other logits (so the test above sees it)."""
    hf = hf_model(CASES["window4-gqa"])
    _, model = from_transformers(hf, REG)
    hf.config.sliding_window = None  # HF now attends to every earlier key
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        full, ours = hf(idx).logits, model.eval()(idx)
    assert (ours[:, :4] - full[:, :4]).abs().max().item() < 1e-4  # within the first window
    assert (ours[:, 4:] - full[:, 4:]).abs().max().item() > 1e-2


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", ["window4-gqa", "window3-headdim-tied"])
def test_left_padded_mask(case, impl):
    hf = hf_model(CASES[case])
    _, model = from_transformers(hf, REG, impl=impl)
    assert left_padded_diff(hf, model) < 1e-4


@pytest.mark.parametrize("case", ["window4-gqa", "no-window-gelu"])
def test_yaml_round_trip(case):
    spec, model = from_transformers(hf_model(CASES[case]), REG)
    assert_yaml_round_trip(spec, model, REG)
