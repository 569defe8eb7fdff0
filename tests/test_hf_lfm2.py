"""Lfm2ForCausalLM from transformers (issue 29.2): gated short-convolution layers and
attention layers (a layout), perturbed weights, equal parameter counts, logits within 1e-4 in
float32 with both attention implementations, with a left-padding mask where the
convolution has no bias (with a bias, Hugging Face lets the padded inputs' bias into the
window: docs/transformers.md, Limits), a YAML round trip; and the gated short convolution's
parallel form equal to its token-by-token reference and to LFM2's formula in float64."""

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab_plugins.mixers import GatedShortConv, GatedShortConvSpec  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
            vocab_size=64, max_position_embeddings=64, intermediate_size=48, block_multiple_of=8,
            layer_types=["conv", "conv", "full_attention", "conv"],
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
CASES = {
    "conv-conv-attention-conv": BASE,
    "biased-width-4-untied": dict(BASE, conv_bias=True, conv_L_cache=4, tie_word_embeddings=False,
                                  block_auto_adjust_ff_dim=False),
}


def hf_model(kwargs):
    torch.manual_seed(0)
    config = transformers.Lfm2Config(**kwargs, attn_implementation="eager")
    return perturbed(transformers.Lfm2ForCausalLM(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(CASES[case]), REG, impl,
                         padded=not CASES[case].get("conv_bias", False))


def test_what_the_spec_says():
    spec, _ = vl.from_transformers(hf_model(CASES["biased-width-4-untied"]), REG)
    assert spec.layout.pattern == ["conv", "conv", "attention"]  # repeats: layer 3 is conv
    conv = spec.layer_spec(0).attention
    assert (conv.kind, conv.width, conv.bias) == ("gated_short_conv", 4, True)
    assert spec.attention.qk_norm.kind == "rms" and spec.feedforward.hidden_dim == 48
    spec, _ = vl.from_transformers(hf_model(CASES["conv-conv-attention-conv"]), REG)
    assert spec.feedforward.hidden_dim == 32  # int(2 * 48 / 3) rounded up to a multiple of 8


def test_yaml_round_trip():
    spec, model = vl.from_transformers(hf_model(CASES["conv-conv-attention-conv"]), REG)
    assert_yaml_round_trip(spec, model, REG)


@pytest.mark.parametrize("bias", [False, True])
def test_parallel_equals_recurrent_and_the_formula(bias):
    torch.manual_seed(0)
    fast = GatedShortConv(8, GatedShortConvSpec(width=3, bias=bias)).double()
    slow = GatedShortConv(8, GatedShortConvSpec(width=3, bias=bias, impl="recurrent")).double()
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :2] = True
    a, b = fast(x, key_padding_mask=pad), slow(x, key_padding_mask=pad)
    assert (a - b).abs().max().item() < 1e-12
    w_in, b_in = fast.in_proj.weight, fast.in_proj.bias
    proj = x @ w_in.T + (0 if b_in is None else b_in)  # (B, T, 3D): B, C, x blocks
    gate_b, gate_c, u = proj[..., :8], proj[..., 8:16], proj[..., 16:]
    bx = (gate_b * u).masked_fill(pad[..., None], 0.0)
    conv = torch.zeros_like(bx)
    for t in range(7):  # y_t = sum_k w_k bx_{t - (w - 1) + k}
        for k in range(3):
            s = t - 2 + k
            if s >= 0:
                conv[:, t] += fast.conv.weight[:, 0, k] * bx[:, s]
    if bias:
        conv = conv + fast.conv.bias
    out = (gate_c * conv) @ fast.out_proj.weight.T + (fast.out_proj.bias if bias else 0)
    assert (a - out).abs().max().item() < 1e-12
