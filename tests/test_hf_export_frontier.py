"""to_transformers for the 2025 families (issue 29.2): DeepSeek-V2/V3, gpt-oss, Llama 4,
SmolLM3, Falcon-H1, LFM2. A perturbed HF model imported and exported again is the same class
with the same weights, tensor by tensor, and logits; a variant built in variantlab exports
with equal logits and parameter count; what the class cannot hold is refused at its spec
path."""

import warnings

import pytest
import torch
from conftest import assert_native_export, n_params, perturbed, perturbed_hf

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers, to_transformers  # noqa: E402
from variantlab.hf import ConversionError, ExportWarning, choose_class  # noqa: E402

REG = vl.get_registry()
SIZES = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
             max_position_embeddings=64)
ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}
MLA = dict(SIZES, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
           kv_lora_rank=12, q_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6,
           v_head_dim=5, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
           first_k_dense_replace=1)
FALCON = dict(SIZES, num_key_value_heads=2, intermediate_size=48, mamba_d_ssm=48,
              mamba_n_heads=6, mamba_d_state=4, mamba_n_groups=2, mamba_chunk_size=4,
              attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.2,
              ssm_out_multiplier=0.9, **ROPE)
#: name -> (class, config class, config options)
CASES = {
    "deepseek-v3-groups-bias": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        MLA, n_group=4, topk_group=2, routed_scaling_factor=2.5, attention_bias=True)),
    "deepseek-v2-group-limited-full-query-tied": ("DeepseekV2ForCausalLM", "DeepseekV2Config",
                                                  dict(MLA, topk_method="group_limited_greedy",
                                                       n_group=4, topk_group=2, q_lora_rank=None,
                                                       tie_word_embeddings=True)),
    "gpt-oss-sliding-full": ("GptOssForCausalLM", "GptOssConfig", dict(
        SIZES, num_key_value_heads=2, head_dim=8, intermediate_size=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, swiglu_limit=1.5, **ROPE)),
    "llama4-chunked-nope-moe-bias": ("Llama4ForCausalLM", "Llama4TextConfig", dict(
        SIZES, num_key_value_heads=2, head_dim=8, intermediate_size=16,
        intermediate_size_mlp=40, num_local_experts=4, num_experts_per_tok=2,
        attention_chunk_size=4, attn_temperature_tuning=False, no_rope_layers=[1, 0],
        moe_layers=[1], attention_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        **ROPE)),
    "smollm3-nope-sliding-biases": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(
        SIZES, num_key_value_heads=2, intermediate_size=48, no_rope_layers=[1, 0],
        use_sliding_window=True, sliding_window=3, attention_bias=True, mlp_bias=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "falcon-h1-norm-after-gate-bias": ("FalconH1ForCausalLM", "FalconH1Config", dict(
        FALCON, mamba_rms_norm=True, mamba_norm_before_gate=False, attention_bias=True,
        mamba_proj_bias=True, projectors_bias=True)),
    "lfm2-conv-attention-bias": ("Lfm2ForCausalLM", "Lfm2Config", dict(
        SIZES, num_key_value_heads=2, intermediate_size=48, block_multiple_of=8,
        layer_types=["conv", "full_attention"], conv_bias=True, **ROPE)),
}


def hf_model(cls, config_cls, kwargs):
    return perturbed_hf(cls.removesuffix("ForCausalLM"), kwargs, config_cls=config_cls)


def max_diff(a, b, idx):
    with torch.no_grad():
        return (a(idx).logits - b(idx).logits).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_gives_the_same_class_weights_and_logits(case):
    cls, config_cls, kwargs = CASES[case]
    hf = hf_model(cls, config_cls, kwargs)
    spec, model = from_transformers(hf, REG)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # an imported model needs no zeros
        back = to_transformers(spec, model)
    assert type(back).__name__ == cls == choose_class(spec)
    assert n_params(back) == n_params(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(theirs) == set(ours)
    for key, value in theirs.items():  # permuted rotary rows and split experts, put back
        assert torch.equal(ours[key], value), key
    idx = torch.randint(0, 64, (2, 12))  # longer than the windows and chunks
    assert max_diff(hf, back, idx) < 1e-4


def test_falcon_h1_folded_multipliers_come_back_in_the_weights():
    """Falcon-H1's multipliers that scale one linear map are folded into it on import; the
    export carries them in the weights (its multipliers 1): equal logits, weights scaled."""
    mults = dict(embedding_multiplier=1.5, lm_head_multiplier=0.5, key_multiplier=0.7,
                 ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 2.0], mlp_multipliers=[1.1, 0.6])
    hf = hf_model("FalconH1ForCausalLM", "FalconH1Config", dict(FALCON, **mults))
    back = to_transformers(*from_transformers(hf, REG))
    assert (back.config.embedding_multiplier, back.config.key_multiplier) == (1.0, 1.0)
    assert max_diff(hf, back, torch.randint(0, 64, (2, 12))) < 1e-4
    theirs, ours = hf.state_dict(), back.state_dict()
    for key, factor in (("model.embed_tokens.weight", 1.5), ("lm_head.weight", 0.5),
                        ("model.layers.0.self_attn.k_proj.weight", 0.7),
                        ("model.layers.1.feed_forward.down_proj.weight", 0.6),
                        ("model.layers.0.feed_forward.up_proj.weight", 1.0)):
        assert torch.allclose(ours[key], theirs[key] * factor, atol=1e-6), key
    dt = ours["model.layers.0.mamba.in_proj.weight"][-6:]  # the dt rows: the last n_heads
    assert torch.allclose(dt, theirs["model.layers.0.mamba.in_proj.weight"][-6:] * 2.0)


TINY = dict(family="gpt", vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=2,
            drop_rate=0.0, norm="rms", positional={"kind": "rotary", "theta": 500.0},
            feedforward={"kind": "glu", "hidden_dim": 40}, activation="silu", qkv_bias=False,
            attn_out_bias=False)
DENSE = {"feedforward": {"kind": "glu", "hidden_dim": 24}}
NATIVE = {
    "deepseek-v3": ("DeepseekV3ForCausalLM", dict(
        qkv_bias=True, attn_out_bias=True, attention={"kind": "mla", "kv_lora_rank": 8, "q_lora_rank": 6,
                                  "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 6},
        feedforward={"kind": "moe", "n_experts": 4, "top_k": 2, "router": "sigmoid_topk",
                     "n_shared_experts": 1, "routed_scaling_factor": 1.5,
                     "expert": {"kind": "glu", "hidden_dim": 16}},
        layout={"kinds": {"dense": DENSE}, "layers": {0: "dense"}})),
    "deepseek-v2": ("DeepseekV2ForCausalLM", dict(
        attention={"kind": "mla", "kv_lora_rank": 8, "qk_rope_head_dim": 2},
        feedforward={"kind": "moe", "n_experts": 4, "top_k": 2, "renormalize": False,
                     "n_group": 2, "topk_group": 1, "n_shared_experts": 2,
                     "expert": {"kind": "glu", "hidden_dim": 8}})),
    "gpt-oss": ("GptOssForCausalLM", dict(
        qkv_bias=True, attn_out_bias=True,
        attention={"kind": "mha", "n_kv_heads": 2, "sinks": True},
        feedforward={"kind": "moe", "n_experts": 4, "top_k": 2, "router": "topk_softmax",
                     "router_bias": True, "expert": {"kind": "clamped_swiglu", "hidden_dim": 16,
                                                     "bias": True, "limit": 2.0}},
        layout={"kinds": {"sliding": {"attention": {"kind": "mha", "n_kv_heads": 2,
                                                    "sinks": True, "window": 3}}, "full": {}},
                "pattern": ["sliding", "full"]})),
    "llama4": ("Llama4ForCausalLM", dict(
        attention={"kind": "mha", "n_kv_heads": 2, "chunk": 4,
                   "qk_norm": {"kind": "l2", "eps": 1e-5}},
        norm={"kind": "rms", "eps": 1e-5},
        feedforward={"kind": "moe", "n_experts": 4, "top_k": 1, "router": "sigmoid_topk",
                     "renormalize": False, "scale_input": True, "n_shared_experts": 1,
                     "expert": {"kind": "glu", "hidden_dim": 16}},
        layout={"kinds": {"rope": {}, "nope_dense": {
            "positional": "none", "attention": {"kind": "mha", "n_kv_heads": 2}, **DENSE}},
            "pattern": ["rope", "nope_dense"]})),
    "smollm3": ("SmolLM3ForCausalLM", dict(
        attention={"kind": "mha", "n_kv_heads": 2},
        layout={"kinds": {"rope": {}, "nope_sliding": {
            "positional": "none", "attention": {"kind": "mha", "n_kv_heads": 2, "window": 3}}},
            "pattern": ["rope", "nope_sliding"]})),
    "falcon-h1": ("FalconH1ForCausalLM", dict(
        attention={"kind": "parallel_hybrid", "attention": {"kind": "mha", "n_kv_heads": 2},
                   "mixer": {"kind": "mamba2", "d_state": 4, "inner_dim": 48, "head_dim": 8,
                             "n_groups": 2, "chunk_size": 4, "gate_norm": "norm_before_gate",
                             "norm_eps": 1e-5},
                   "attention_in": 0.5, "attention_out": 2.0, "mixer_in": 1.5,
                   "mixer_out": 0.25},
        norm={"kind": "rms", "eps": 1e-5})),
    "lfm2": ("Lfm2ForCausalLM", dict(
        attention={"kind": "mha", "n_kv_heads": 2, "qk_norm": {"kind": "rms"}},
        layout={"kinds": {"conv": {"attention": {"kind": "gated_short_conv", "width": 4}},
                          "attention": {}}, "pattern": ["conv", "attention"]})),
}


@pytest.mark.parametrize("case", list(NATIVE))
def test_a_spec_built_in_variantlab_exports_with_equal_logits(case):
    cls, extra = NATIVE[case]
    assert_native_export({**TINY, **extra}, cls, REG, 1e-4)


def test_a_bias_the_variant_lacks_is_exported_as_zeros_with_a_warning():
    """gpt-oss's router and experts always have biases: a variant without them exports with
    zeros there (equal logits) and says that training will move them."""
    data = {**TINY, **NATIVE["gpt-oss"][1]}
    data["feedforward"] = {**data["feedforward"], "router_bias": False,
                           "expert": {"kind": "clamped_swiglu", "hidden_dim": 16}}
    spec = vl.parse_model_spec(data, REG)
    model = perturbed(vl.build_model(spec, REG), seed=2)
    with pytest.warns(ExportWarning, match="router bias, expert biases"):
        hf = to_transformers(spec, model)
    assert torch.equal(hf.state_dict()["model.layers.0.mlp.router.bias"], torch.zeros(4))
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < 1e-4


def _with(case, **changes):
    data = {**TINY, **NATIVE[case][1]}
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = data
        for name in parents:
            node[name] = dict(node[name])
            node = node[name]
        node[leaf] = value
    return data


REFUSED = {
    "mla latent norm": (_with("deepseek-v3", attention__latent_norm={"kind": "layer"}),
                        "attention.latent_norm", "RMSNorms with eps 1e-6"),
    "v2 renormalised": (_with("deepseek-v2", feedforward__renormalize=True),
                        "feedforward.renormalize", "DeepseekV2ForCausalLM"),
    "dense after experts": (_with("deepseek-v3", layout={"kinds": {"dense": DENSE},
                                                         "layers": {1: "dense"}}),
                            "layout.feedforward", "first_k_dense_replace"),
    "mla in one layer only": (_with("smollm3", layout={"kinds": {"mla": {"attention": {
        "kind": "mla"}}}, "layers": {1: "mla"}}), "layout.attention", "differ only in feedforward"),
    "falcon with a plain attention layer": (
        _with("falcon-h1", layout={"kinds": {"plain": {"attention": "mha"}},
                                   "layers": {0: "plain"}}),
        "layout.attention", "are all alike"),
    "gpt-oss capacity": (_with("gpt-oss", feedforward__capacity_factor=1.0),
                         "feedforward.capacity_factor", "GptOssForCausalLM"),
    "llama4 qk norm on a NoPE layer": (
        _with("llama4", layout__kinds__nope_dense__attention={
            "kind": "mha", "n_kv_heads": 2, "qk_norm": {"kind": "l2", "eps": 1e-5}}),
        "layout.attention.qk_norm", "NoPE layers have no QK norm"),
    "smollm3 two windows": (_with("smollm3", attention={"kind": "mha", "n_kv_heads": 2,
                                                        "window": 5}),
                            "layout.attention.window", "windows [5, 3]"),
    "falcon mixer norm eps": (_with("falcon-h1", attention__mixer__norm_eps=1e-3),
                              "attention.mixer.norm_eps", "one rms_norm_eps"),
    "lfm2 gelu": (_with("lfm2", activation="gelu"), "activation.kind", "silu"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_class_cannot_hold_is_refused_by_name(case):
    data, loc, words = REFUSED[case]
    spec = vl.parse_model_spec(data, REG)
    with pytest.raises(ConversionError) as info:
        to_transformers(spec, vl.build_model(spec, REG))
    (issue,) = info.value.issues
    assert ".".join(map(str, issue.loc)) == loc, issue.message
    assert words in issue.message and "exporting to" in issue.message
