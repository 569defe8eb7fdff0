"""Rope scaling (issue 41.1): the rotary's ``scaling`` kinds (linear, dynamic NTK, YaRN with
DeepSeek's mscale and gpt-oss's truncate, Llama 3.1's llama3, Phi-3's LongRoPE) equal to
transformers' own rope init functions, and real configs (the shipped rope values on tiny
widths, with a tiny original context) of Llama 3.1, gpt-oss, DeepSeek-V3, Phi-3 and Qwen2.5
(and Falcon, Bamba, OLMo 3 and the Llama-like families of the shared decoder, whose rotary
reads the same rope parameters) converting with logits within 1e-5 in float32 at lengths
below and above the original context, both ways; the spec's checks, its unit keys, and the
refusals."""

import math

import pytest
import torch
from conftest import TINY, left_padded_diff, n_params, perturbed, perturbed_hf

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

import variantlab as vl  # noqa: E402
from variantlab import SpecError, from_transformers, to_transformers  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402
from variantlab.hf.common import rope_scaling  # noqa: E402
from variantlab.sweep.units import unit_key  # noqa: E402
from variantlab_plugins.rotary import RotarySpec, scaled_frequencies  # noqa: E402

REG = vl.get_registry()
LLAMA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
             num_hidden_layers=2, vocab_size=64, max_position_embeddings=32)
#: the rope parameters each model ships with, its original context cut to 8
LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
GPTOSS = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
          "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 8}
DEEPSEEK_V3 = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
               "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 8}
QWEN25 = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
          "original_max_position_embeddings": 8}
#: Phi-3-mini-128k's LongRoPE shape: short factors near 1, long factors growing with the
#: wavelength (4 of each for the 8 dims of a tiny head)
PHI3 = {"rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [1.0, 1.05, 1.35, 1.9], "long_factor": [1.08, 1.6, 11.0, 40.0]}
#: lengths below and above the original context (8)
LENGTHS = (6, 20)


def hf_config(family, rope, **kwargs):
    config_cls = getattr(transformers, f"{family}Config")
    return config_cls(**{**LLAMA, **kwargs}, rope_parameters=dict(rope),
                      attn_implementation="eager")


def hf_model(family, rope, **kwargs):
    return perturbed_hf(family, {**LLAMA, **kwargs, "rope_parameters": dict(rope)})


def rotary_of(config) -> RotarySpec:
    params = dict(config.rope_parameters)
    return RotarySpec(theta=float(params["rope_theta"]),
                      fraction=float(params.get("partial_rotary_factor") or 1.0),
                      **rope_scaling(config, params))


# --- the frequencies against transformers' rope init functions --------------------------

FREQUENCY_CASES = {
    "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5}, {}),
    "dynamic": ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0},
                {"max_position_embeddings": 8}),
    "yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
              "original_max_position_embeddings": 8}, {"head_dim": 16}),
    "yarn-gpt-oss": (GPTOSS, {"head_dim": 16}),
    "yarn-deepseek-v3": (DEEPSEEK_V3, {"head_dim": 16}),
    "yarn-attention-factor": ({**QWEN25, "attention_factor": 0.8, "beta_fast": 16.0}, {}),
    "llama3": (LLAMA31, {"head_dim": 32}),
    "longrope": ({**PHI3, "original_max_position_embeddings": 8}, {}),
}


@pytest.mark.parametrize("case", list(FREQUENCY_CASES))
@pytest.mark.parametrize("seq_len", [5, 8, 9, 40])
def test_frequencies_equal_transformers_init_functions(case, seq_len):
    rope, extra = FREQUENCY_CASES[case]
    config = hf_config("Llama", rope, **extra)
    kind = config.rope_parameters["rope_type"]
    # at run time transformers passes the length as a tensor (max(position_ids) + 1)
    ref, ref_attention = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=torch.tensor(seq_len))
    if kind == "longrope":
        ref, ref_attention = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=seq_len)
    spec = rotary_of(config)
    ours, attention = scaled_frequencies(spec, config.head_dim, seq_len)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0.0)
    assert attention == pytest.approx(ref_attention, rel=1e-12)
    plain, _ = scaled_frequencies(spec.model_copy(update={"scaling": "none"}), config.head_dim,
                                  seq_len)
    changed = not torch.equal(ours, plain) or attention != 1.0
    assert changed == (kind != "dynamic" or seq_len > 8)  # dynamic grows past the context


def test_the_formulas_by_hand():
    """Spot values from the papers' formulas, apart from transformers' code."""
    spec = RotarySpec(theta=10000.0, scaling="linear", factor=4.0)
    inv, _ = scaled_frequencies(spec, 8, 1)
    assert inv.tolist() == pytest.approx([1 / 4, 0.1 / 4, 0.01 / 4, 0.001 / 4], rel=1e-6)
    spec = RotarySpec(theta=10000.0, scaling="dynamic", factor=2.0, original_context=8)
    inv, _ = scaled_frequencies(spec, 8, 16)  # base 10000 (2 * 16/8 - 1)^(8/6) = 10000 * 3^(4/3)
    base = 10000.0 * 3 ** (4 / 3)
    assert inv.tolist() == pytest.approx([base ** (-i / 8) for i in (0, 2, 4, 6)], rel=1e-5)
    spec = RotarySpec(scaling="yarn", factor=40.0, original_context=8, mscale=1.0,
                      mscale_all_dim=0.5)
    _, attention = scaled_frequencies(spec, 8, 1)
    assert attention == pytest.approx((0.1 * math.log(40) + 1) / (0.05 * math.log(40) + 1))
    spec = RotarySpec(scaling="longrope", factor=16.0, original_context=8,
                      short_factor=[1.0, 2.0], long_factor=[3.0, 4.0])
    inv, attention = scaled_frequencies(spec, 4, 9)
    assert inv.tolist() == pytest.approx([1 / 3, 0.01 / 4], rel=1e-6)
    assert attention == pytest.approx(math.sqrt(1 + math.log(16) / math.log(8)))
    spec = RotarySpec(theta=10000.0, scaling="llama3", factor=8.0, original_context=8)
    inv, _ = scaled_frequencies(spec, 8, 1)  # wavelengths 2 pi (between 8/4 and 8/1: mixed),
    smooth = (8 / (2 * math.pi) - 1) / 3    # then 62.8, 628, 6283 (past 8: divided by 8)
    assert inv.tolist() == pytest.approx(
        [(1 - smooth) / 8 + smooth, 0.1 / 8, 0.01 / 8, 0.001 / 8], rel=1e-5)


# --- real configs, both ways ------------------------------------------------------------

REAL = {
    "llama3.1": ("Llama", LLAMA31, {}),
    "gpt-oss": ("GptOss", GPTOSS, dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                       intermediate_size=16, sliding_window=4)),
    "deepseek-v3": ("DeepseekV3", DEEPSEEK_V3, dict(
        num_key_value_heads=4, moe_intermediate_size=16, kv_lora_rank=12, q_lora_rank=10,
        qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
        topk_group=2, routed_scaling_factor=2.5)),
    "deepseek-v2-lite": ("DeepseekV2", {**DEEPSEEK_V3, "mscale": 0.707, "mscale_all_dim": 0.707},
                         dict(num_key_value_heads=4, moe_intermediate_size=16, kv_lora_rank=12,
                              q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=6,
                              v_head_dim=5, n_routed_experts=8, num_experts_per_tok=2,
                              n_shared_experts=1, first_k_dense_replace=1)),
    "qwen2.5": ("Qwen2", QWEN25, {}),
    "phi3": ("Phi3", PHI3, dict(max_position_embeddings=128, original_max_position_embeddings=8,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "phi4-mini": ("Phi3", {**PHI3, "partial_rotary_factor": 0.75,
                           "short_factor": PHI3["short_factor"][1:],
                           "long_factor": PHI3["long_factor"][1:]},
                  dict(max_position_embeddings=128, original_max_position_embeddings=8,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "dynamic": ("Llama", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                dict(max_position_embeddings=8)),
    "linear": ("Llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, {}),
    # the GPT-2-era and hybrid classes whose rotary reads rope_parameters
    "falcon-llama3": ("Falcon", LLAMA31, dict(new_decoder_architecture=True, num_kv_heads=2,
                                              parallel_attn=True)),
    "bamba-yarn": ("Bamba", QWEN25, dict(attn_layer_indices=[1], mamba_n_heads=8,
                                         mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4)),
    # the Llama-like families of variantlab/hf/decoder.py: Apertus ships llama3, GLM-4's
    # rotary is partial and interleaved, StableLM's partial
    "apertus-llama3": ("Apertus", LLAMA31, {}),
    "glm4-yarn": ("Glm4", QWEN25, dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "stablelm-dynamic": ("StableLm", {"rope_type": "dynamic", "rope_theta": 10000.0,
                                      "factor": 2.0, "partial_rotary_factor": 0.5},
                         dict(max_position_embeddings=8)),
}


@pytest.mark.parametrize("case", list(REAL))
def test_real_configs_convert_with_equal_logits_below_and_above_the_context(case):
    family, rope, extra = REAL[case]
    hf = hf_model(family, rope, **extra)
    spec, model = from_transformers(hf, REG)
    assert spec.positional.scaling == rope["rope_type"]
    assert n_params(model) == n_params(hf)
    for length in LENGTHS:
        idx = torch.randint(0, 64, (2, length))
        with torch.no_grad():
            ref, ours = hf(idx).logits, model.eval()(idx)
        assert (ours - ref).abs().max().item() < 1e-5, length
        if length == LENGTHS[1]:  # past the original context the scaling matters
            plain = vl.build_model(spec.model_copy(update={"positional": spec.positional.model_copy(
                update={"scaling": "none"})}), REG)
            plain.load_state_dict(model.state_dict())
            with torch.no_grad():
                assert (plain.eval()(idx) - ref).abs().max().item() > 1e-3
    back = to_transformers(spec, model)
    assert type(back).__name__ == type(hf).__name__
    idx = torch.randint(0, 64, (2, LENGTHS[1]))
    with torch.no_grad():
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5


def test_olmo3_yarn_on_its_full_layers():
    """OLMo 3's rope per layer type: YaRN on the full layers, the sliding ones unscaled with
    their own base; both ways."""
    hf = hf_model("Olmo3", {"full_attention": QWEN25, "sliding_attention": {
        "rope_type": "default", "rope_theta": 50.0}}, num_hidden_layers=4, sliding_window=3)
    spec, model = from_transformers(hf, REG)
    full, local = spec.layer_spec(3).positional, spec.layer_spec(0).positional
    assert (full.scaling, full.factor, local.scaling, local.theta) == ("yarn", 4.0, "none", 50.0)
    idx = torch.randint(0, 64, (2, LENGTHS[1]))
    with torch.no_grad():
        assert (model.eval()(idx) - hf(idx).logits).abs().max().item() < 1e-5
        back = to_transformers(spec, model)
        assert back.config.rope_parameters["full_attention"]["rope_type"] == "yarn"
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5


def test_gemma3_linear_scaling_on_its_full_layers():
    """Gemma 3 (4B-27B): linear factor 8 on the full-attention layers, base 1e6; the sliding
    layers unscaled, base 1e4; both ways."""
    config = transformers.Gemma3TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        intermediate_size=48, num_hidden_layers=4, vocab_size=64, max_position_embeddings=64,
        sliding_window=4, query_pre_attn_scalar=8, sliding_window_pattern=2,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        attn_implementation="eager")
    torch.manual_seed(0)
    hf = perturbed(transformers.Gemma3ForCausalLM(config))
    spec, model = from_transformers(hf, REG)
    full, local = spec.layer_spec(1).positional, spec.layer_spec(0).positional
    assert (full.scaling, full.factor, full.theta) == ("linear", 8.0, 1e6)
    assert (local.scaling, local.theta) == ("none", 1e4)
    idx = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        assert (model.eval()(idx) - hf(idx).logits).abs().max().item() < 1e-5
        back = to_transformers(spec, model)
        assert back.config.rope_parameters["full_attention"]["factor"] == 8.0
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize("case", ["llama3.1", "phi3", "dynamic", "qwen2.5"])
def test_left_padding_with_scaled_rotary(case):
    family, rope, extra = REAL[case]
    hf = hf_model(family, rope, **extra)
    _, model = from_transformers(hf, REG)
    assert left_padded_diff(hf, model, length=12) < 1e-5


def test_deepseek_mscale_is_the_mla_score_scale():
    hf = hf_model(*REAL["deepseek-v3"][:2], **REAL["deepseek-v3"][2])
    spec, model = from_transformers(hf, REG)
    mscale = 0.1 * math.log(40.0) + 1
    assert spec.attention.scale == pytest.approx(10 ** -0.5 * mscale ** 2)
    assert spec.positional.mscale == spec.positional.mscale_all_dim == 1.0
    wrong = spec.model_copy(update={"attention": spec.attention.model_copy(update={"scale": 0.3})})
    with pytest.raises(ConversionError, match=r"attention\.scale.*0\.3.*mscale_all_dim"):
        to_transformers(wrong, model)


# --- the spec ---------------------------------------------------------------------------

def model_data(**rotary):
    return {**TINY, "positional": {"kind": "rotary", **rotary}}


@pytest.mark.parametrize("rotary, match", [
    ({"scaling": "yarn", "factor": 4.0}, "original_context.*needs original_context"),
    ({"scaling": "linear", "factor": 2.0, "original_context": 8}, "original_context is not read "
     "by scaling 'linear'.*dynamic, yarn, llama3, longrope"),
    ({"beta_fast": 8.0}, "beta_fast is not read by scaling 'none'"),
    ({"scaling": "llama3", "original_context": 8, "low_freq_factor": 4.0},
     "high_freq_factor=4.0 must exceed low_freq_factor=4.0"),
    ({"scaling": "longrope", "original_context": 8, "short_factor": [1.0] * 4},
     "long_factor.*4 for 8 rotated dims; it has none"),
    ({"scaling": "longrope", "original_context": 8, "short_factor": [1.0] * 3,
      "long_factor": [1.0] * 4}, "short_factor.*it has 3 values"),
    ({"scaling": "dynamic", "original_context": 8, "fraction": 0.25}, "undefined for 2 rotated"),
])
def test_scaling_options_are_checked(rotary, match):
    with pytest.raises(SpecError, match=match):
        vl.parse_model_spec(model_data(**rotary), REG)


def test_unscaled_rotary_keeps_its_data_and_every_option_enters_the_unit_key():
    plain = vl.parse_model_spec(model_data(theta=500.0), REG)
    assert plain.to_data()["positional"] == {"kind": "rotary", "theta": 500.0, "fraction": 1.0,
                                             "odd_rounding": "down"}

    def key(**rotary):
        data = vl.parse_model_spec(model_data(theta=500.0, **rotary), REG).to_data()
        return unit_key(data, "params", {}, "cpu", None, 0)

    yarn = dict(scaling="yarn", factor=4.0, original_context=8)
    keys = {key(), key(**yarn), key(**{**yarn, "factor": 2.0}), key(**yarn, truncate=False),
            key(**yarn, beta_fast=16.0), key(**yarn, attention_factor=1.1),
            key(**{**yarn, "original_context": 4}), key(scaling="linear", factor=4.0)}
    assert len(keys) == 8


def test_yaml_round_trip_of_a_scaled_spec():
    from conftest import assert_yaml_round_trip

    spec, model = from_transformers(hf_model("Llama", LLAMA31), REG)
    assert_yaml_round_trip(spec, model, REG)


# --- refusals ---------------------------------------------------------------------------

@pytest.mark.parametrize("rope, match", [
    ({"rope_type": "proportional", "rope_theta": 1e4}, "rope_type 'proportional' is not "
     "supported; supported: default, linear, dynamic, yarn, llama3, longrope"),
    ({"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "beta_fast": 3.0},
     "rope_type 'linear' with beta_fast: variantlab reads only factor"),
])
def test_unknown_rope_kinds_and_keys_are_refused_in_one_line(rope, match):
    params = dict(rope)
    config = transformers.LlamaConfig(**LLAMA)
    with pytest.raises(ConversionError, match=match) as info:
        rope_scaling(config, params)
    assert "\n" not in str(info.value)


def test_dynamic_export_needs_the_original_context_as_the_context_length():
    spec, model = from_transformers(hf_model(*REAL["dynamic"][:2], **REAL["dynamic"][2]), REG)
    longer = spec.model_copy(update={"context_length": 16})
    with pytest.raises(ConversionError, match="original_context=8 differs from "
                       "context_length=16"):
        to_transformers(longer, model)


def test_query_temperature_by_hand():
    """Llama 4's NoPE-layer temperature: q_t * (scale ln(1 + floor((t + 1) / floor_scale)) + 1)
    at sequence index t (position ids, e.g. of left padding, do not move it); keys as they are."""
    from variantlab_plugins.rotary import QueryTemperaturePositions

    q, k = torch.ones(1, 2, 9, 4), torch.randn(1, 1, 9, 4)
    ids = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5, 6]])
    for position_ids in (None, ids):
        q2, k2 = QueryTemperaturePositions(floor_scale=3, scale=0.5).rotate(q, k, position_ids)
        expected = [0.5 * math.log(1 + (t + 1) // 3) + 1 for t in range(9)]
        assert q2[0, 1, :, 0].tolist() == pytest.approx(expected, rel=1e-6)
        assert torch.equal(k2, k)
