"""Qwen2ForCausalLM (Qwen2 / Qwen2.5: query, key and value biases, none on the output) and
Phi3ForCausalLM (Phi-3 / Phi-4: fused qkv_proj and gate_up_proj, partial rotary, a sliding
window, residual dropout) from transformers (issue 41): perturbed weights, equal parameter
counts, logits within 1e-4 in float32 with both attention implementations and a left-padding
mask, export back to the same class with equal logits and no warning, a YAML round trip,
and the refusals. Their scaled rotaries (Qwen2.5's YaRN, Phi-3's LongRoPE) are in
tests/test_rope_scaling.py."""

import warnings

import pytest
import torch
from conftest import assert_imports_equal, assert_yaml_round_trip, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers, to_transformers  # noqa: E402
from variantlab.hf import ConversionError, choose_class  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
            num_hidden_layers=2, vocab_size=64, max_position_embeddings=64)
PHI_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {
    "qwen2-gqa": ("Qwen2", dict(BASE)),
    "qwen2-mha-tied-theta": ("Qwen2", dict(BASE, num_key_value_heads=4, tie_word_embeddings=True,
                                           rope_parameters={"rope_type": "default",
                                                            "rope_theta": 1e6})),
    "qwen2-window-past-layer-1": ("Qwen2", dict(BASE, num_hidden_layers=3, use_sliding_window=True,
                                                sliding_window=4, max_window_layers=1)),
    "phi3-gqa": ("Phi3", dict(BASE, **PHI_IDS)),
    "phi4mini-partial-window": ("Phi3", dict(BASE, **PHI_IDS, sliding_window=5,
                                             rope_parameters={"rope_type": "default",
                                                              "rope_theta": 1e4,
                                                              "partial_rotary_factor": 0.75},
                                             tie_word_embeddings=True)),
}


def hf_model(family, kwargs):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**kwargs, attn_implementation="eager")
    return perturbed(getattr(transformers, f"{family}ForCausalLM")(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    assert_imports_equal(hf_model(*CASES[case]), REG, impl)


def test_what_the_spec_says():
    spec, _ = from_transformers(hf_model(*CASES["qwen2-gqa"]), REG)
    assert (spec.qkv_bias, spec.attn_out_bias, spec.feedforward.bias) == (True, False, False)
    assert spec.attention.n_kv_heads == 2 and spec.norm.kind == "rms"
    spec, _ = from_transformers(hf_model(*CASES["phi4mini-partial-window"]), REG)
    assert (spec.positional.fraction, spec.attention.window, spec.qkv_bias) == (0.75, 5, False)
    config = dict(CASES["phi3-gqa"][1], resid_pdrop=0.1, attention_dropout=0.2)
    spec, _ = from_transformers(hf_model("Phi3", config), REG)
    assert (spec.drop("resid"), spec.drop("attn"), spec.drop("emb")) == (0.1, 0.2, 0.0)


def test_the_window_and_the_fused_split_matter():
    """Past the window, a model without it differs; q/k/v split in another order differ."""
    hf = hf_model(*CASES["phi4mini-partial-window"])
    spec, model = from_transformers(hf, REG)
    idx = torch.randint(0, 64, (2, 12))
    no_window = vl.build_model(spec.model_copy(update={"attention": spec.attention.model_copy(
        update={"window": None})}), REG)
    no_window.load_state_dict(model.state_dict())
    swapped = {k: v for k, v in model.state_dict().items()}
    for i in range(2):
        att = f"trf_blocks.{i}.att.sublayer"
        swapped[f"{att}.W_key.weight"], swapped[f"{att}.W_value.weight"] = (
            swapped[f"{att}.W_value.weight"], swapped[f"{att}.W_key.weight"])
    other = vl.build_model(spec, REG)
    other.load_state_dict(swapped)
    with torch.no_grad():
        ref = hf(idx).logits
        assert (no_window.eval()(idx) - ref).abs().max().item() > 1e-3
        assert (other.eval()(idx) - ref).abs().max().item() > 1e-3


@pytest.mark.parametrize("case", list(CASES))
def test_export_back_to_the_class(case):
    hf = hf_model(*CASES[case])
    spec, model = from_transformers(hf, REG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = to_transformers(spec, model)
    expected = type(hf).__name__
    if case == "phi3-gqa":  # a full-rotary, unscaled Phi-3 is a Llama computed the same way
        expected = "LlamaForCausalLM"
    assert type(back).__name__ == expected == choose_class(spec)
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5
    assert sum(p.numel() for p in back.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("case", ["qwen2-gqa", "phi4mini-partial-window"])
def test_yaml_round_trip(case):
    spec, model = from_transformers(hf_model(*CASES[case]), REG)
    assert_yaml_round_trip(spec, model, REG)


def test_qwen2_sliding_layers():
    """use_sliding_window: the layers from max_window_layers on see the last sliding_window
    keys (a layout kind), the window matters past it, and it exports back."""
    hf = hf_model(*CASES["qwen2-window-past-layer-1"])
    spec, model = from_transformers(hf, REG)
    assert spec.layout.layers == {1: "sliding", 2: "sliding"}
    assert [spec.layer_spec(i).attention.window for i in range(3)] == [None, 4, 4]
    unwindowed = vl.build_model(dict(spec.to_data(), layout=None), REG)
    unwindowed.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (unwindowed.eval()(idx) - hf(idx).logits).abs().max().item() > 1e-3
    config = transformers.Qwen2Config(**BASE, use_sliding_window=True, sliding_window=4,
                                      max_window_layers=0)
    spec, _ = from_transformers(transformers.Qwen2ForCausalLM(config), REG)
    assert spec.layout is None and spec.attention.window == 4


def test_refusals_name_the_option():
    config = transformers.Qwen2Config(**BASE, layer_types=["full_attention", "chunked_attention"])
    with pytest.raises(ConversionError, match=r"layer_types=\[.chunked_attention.\]: supported"):
        from_transformers(transformers.Qwen2ForCausalLM(config), REG)
    spec, model = from_transformers(hf_model(*CASES["qwen2-window-past-layer-1"]), REG)
    two = spec.model_copy(update={"attention": spec.attention.model_copy(update={"window": 3})})
    with pytest.raises(ConversionError, match=r"windows \[3, 4\]: this class has one"):
        to_transformers(two, vl.build_model(two, REG))
    spec, model = from_transformers(hf_model(*CASES["phi4mini-partial-window"]), REG)
    biased = spec.model_copy(update={"qkv_bias": True})
    with pytest.raises(ConversionError, match="qkv_bias.*Phi-3's attention has no biases"):
        to_transformers(biased, vl.build_model(biased, REG))
    yarn = spec.model_copy(update={"positional": spec.positional.model_copy(update={
        "scaling": "yarn", "factor": 2.0, "original_context": 8})})
    with pytest.raises(ConversionError, match="scaling 'yarn': Phi-3's config takes LongRoPE"):
        to_transformers(yarn, model)
    spec, model = from_transformers(hf_model(*CASES["qwen2-gqa"]), REG)
    mlp = spec.model_copy(update={"feedforward": spec.feedforward.model_copy(
        update={"bias": True})})
    with pytest.raises(ConversionError, match="feedforward.bias.*Qwen2's feed-forward"):
        vl.hf.hf_config(mlp, "Qwen2ForCausalLM")
    assert choose_class(mlp) == "SeedOssForCausalLM"  # which has an mlp_bias
