"""The Llama-like families of issue 41 through the shared decoder (variantlab/hf/decoder.py):
Gemma 1, OLMo 1, OLMo 3, StarCoder 2, GLM-4, Granite, Granite-MoE, Cohere, StableLM, Phi-1/2,
Nemotron, Arcee, Seed-OSS, EXAONE 4, ERNIE 4.5 (+ MoE), Qwen2-MoE, GLM-4-MoE, Persimmon,
Apertus. Each: a tiny perturbed HF model imports with equal (trainable) parameter counts
(ERNIE 4.5 MoE's frozen choice bias is a buffer here) and logits within 1e-5 in float32
(both attention implementations, and left-padded), the import is causal, and it exports
back to the same class with the same tensors and logits (ERNIE 4.5 MoE imports only; ERNIE
4.5 exports as Llama, Persimmon without QK-norms as GPT-NeoX, which compute the same); what
the families cannot hold is refused in one line."""

import warnings

import pytest
import torch
from conftest import assert_native_export, left_padded_diff, n_params, perturbed, perturbed_hf

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers, to_transformers  # noqa: E402
from variantlab.hf import ConversionError, ExportWarning, choose_class  # noqa: E402

REG = vl.get_registry()
TOL = 1e-5
S = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
         vocab_size=64, max_position_embeddings=64, intermediate_size=48, pad_token_id=0,
         bos_token_id=1, eos_token_id=2)
#: name -> (class, config class, config options, the class the import exports to)
CASES = {
    "gemma-head-dim-bias": ("GemmaForCausalLM", "GemmaConfig",
                            dict(S, head_dim=12, attention_bias=True), None),
    "olmo-bias-untied": ("OlmoForCausalLM", "OlmoConfig", dict(S, attention_bias=True), None),
    "olmo-clip-qkv": ("OlmoForCausalLM", "OlmoConfig", dict(S, clip_qkv=0.5), None),
    "starcoder2-window": ("Starcoder2ForCausalLM", "Starcoder2Config",
                          dict(S, sliding_window=5), None),
    "starcoder2-no-bias": ("Starcoder2ForCausalLM", "Starcoder2Config",
                           dict(S, use_bias=False, tie_word_embeddings=False), None),
    "glm4-partial-interleaved-tied": ("Glm4ForCausalLM", "Glm4Config",
                                      dict(S, tie_word_embeddings=True), None),
    "granite-multipliers": ("GraniteForCausalLM", "GraniteConfig", dict(
        S, embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3,
        logits_scaling=2.5, attention_bias=True), None),
    "cohere-logit-scale": ("CohereForCausalLM", "CohereConfig", dict(S, logit_scale=0.5), None),
    "cohere-qk-norm-each-head": ("CohereForCausalLM", "CohereConfig",
                                 dict(S, use_qk_norm=True, attention_bias=True), None),
    "stablelm-parallel-qkv-bias": ("StableLmForCausalLM", "StableLmConfig",
                                   dict(S, use_qkv_bias=True, use_parallel_residual=True), None),
    "stablelm-sequential": ("StableLmForCausalLM", "StableLmConfig", dict(S), None),
    "phi-qk-layernorm": ("PhiForCausalLM", "PhiConfig", dict(S, qk_layernorm=True), None),
    "phi-plain-mha": ("PhiForCausalLM", "PhiConfig", dict(S, num_key_value_heads=4), None),
    "nemotron-biases": ("NemotronForCausalLM", "NemotronConfig",
                        dict(S, attention_bias=True), None),
    "arcee-mlp-bias": ("ArceeForCausalLM", "ArceeConfig", dict(S, mlp_bias=True), None),
    "seed-oss-qkv-bias-only": ("SeedOssForCausalLM", "SeedOssConfig", dict(S, head_dim=8), None),
    "olmo3-sliding-rope-per-type": ("Olmo3ForCausalLM", "Olmo3Config", dict(
        S, num_hidden_layers=4, sliding_window=3, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}), None),
    "exaone4-sliding-nope-full": ("Exaone4ForCausalLM", "Exaone4Config",
                                  dict(S, num_hidden_layers=4, sliding_window=3), None),
    "exaone4-no-window": ("Exaone4ForCausalLM", "Exaone4Config",
                          dict(S, sliding_window=None, layer_types=["full_attention"] * 2),
                          None),
    "qwen2moe-dense-layer-renorm": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        S, num_hidden_layers=3, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1], norm_topk_prob=True), None),
    "qwen2moe-every-layer-no-qkv-bias": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        S, moe_intermediate_size=16, shared_expert_intermediate_size=8, num_experts=4,
        num_experts_per_tok=1, qkv_bias=False), None),
    "persimmon-qk-layernorm": ("PersimmonForCausalLM", "PersimmonConfig",
                               dict(S, num_key_value_heads=None), None),
    "persimmon-no-qk-norm-tied": ("PersimmonForCausalLM", "PersimmonConfig",
                                  dict(S, num_key_value_heads=None, qk_layernorm=False,
                                       tie_word_embeddings=True), "GPTNeoXForCausalLM"),
    "granitemoe-multipliers": ("GraniteMoeForCausalLM", "GraniteMoeConfig", dict(
        S, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
        embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0,
        attention_multiplier=0.2, tie_word_embeddings=True), None),
    "apertus-xielu-bias": ("ApertusForCausalLM", "ApertusConfig", dict(
        S, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1000.0}),
        None),
    "glm4moe-groups-qk-norm-dense-first": ("Glm4MoeForCausalLM", "Glm4MoeConfig", dict(
        S, num_hidden_layers=3, moe_intermediate_size=16, n_routed_experts=4,
        num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, n_group=2,
        topk_group=1, routed_scaling_factor=1.5, use_qk_norm=True, attention_bias=True), None),
    "glm4moe-every-layer-no-shared": ("Glm4MoeForCausalLM", "Glm4MoeConfig", dict(
        S, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        first_k_dense_replace=0, n_shared_experts=0, norm_topk_prob=False), None),
    "ernie4_5moe-dense-first-shared": ("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", dict(
        S, num_hidden_layers=3, head_dim=8, moe_intermediate_size=16, moe_num_experts=4,
        moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=1), None),
    "ernie4_5-biases": ("Ernie4_5ForCausalLM", "Ernie4_5Config",
                        dict(S, head_dim=8, use_bias=True), "LlamaForCausalLM"),
}


IMPORT_ONLY = ("Ernie4_5_MoeForCausalLM",)


def test_an_import_only_family_is_refused_on_export_in_one_line():
    spec, model = from_transformers(hf_model("ernie4_5moe-dense-first-shared"), REG)
    with pytest.raises(ConversionError) as err:
        to_transformers(spec, model)
    assert "exporting to" in str(err.value) and "\n" not in str(err.value)


def hf_model(case):
    cls, config_cls, kwargs, _ = CASES[case]
    return perturbed_hf(cls.removesuffix("ForCausalLM"), kwargs, config_cls=config_cls)


def trainable(model) -> int:
    """Parameters an optimizer moves (ERNIE 4.5 MoE's choice bias is a frozen parameter)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def logits(model, idx):
    out = model(idx)
    return out if isinstance(out, torch.Tensor) else out.logits


def max_diff(model, hf, idx):
    with torch.no_grad():
        return (logits(model, idx) - logits(hf, idx)).abs().max().item()


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case, impl):
    hf = hf_model(case)
    spec, model = from_transformers(hf, REG, impl=impl)
    assert n_params(model) == trainable(hf)
    idx = torch.randint(0, 64, (2, 12))  # longer than StarCoder 2's window
    assert max_diff(model.eval(), hf, idx) < TOL
    assert left_padded_diff(hf, model) < TOL


@pytest.mark.parametrize("case", list(CASES))
def test_the_import_is_causal(case):
    _, model = from_transformers(hf_model(case), REG)
    idx = torch.randint(0, 64, (2, 12))
    later = idx.clone()
    later[:, 7:] = (later[:, 7:] + 1) % 64
    with torch.no_grad():
        a, b = model.eval()(idx), model(later)
    # equal up to rounding: the experts batch the tokens routed to them, later ones too
    assert (a[:, :7] - b[:, :7]).abs().max().item() < 1e-6
    assert (a[:, 7:] - b[:, 7:]).abs().max().item() > 1e-3


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0] not in IMPORT_ONLY])
def test_round_trip_gives_the_same_class_weights_and_logits(case):
    cls, _, _, exported = CASES[case]
    hf = hf_model(case)
    spec, model = from_transformers(hf, REG)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # an imported model needs no zeros
        back = to_transformers(spec, model)
    assert type(back).__name__ == choose_class(spec) == (exported or cls)
    assert n_params(back) == n_params(hf)
    if exported is None:
        theirs, ours = hf.state_dict(), back.state_dict()
        assert set(theirs) == set(ours)
        for key, value in theirs.items():  # permuted rotary rows, (1 + w) norms, put back
            assert torch.allclose(ours[key], value, atol=1e-6, rtol=0), key
    assert max_diff(back, hf, torch.randint(0, 64, (2, 12))) < TOL


def test_what_the_specs_say():
    spec, _ = from_transformers(hf_model("granite-multipliers"), REG)
    assert (spec.emb_multiplier, spec.residual.branch_scale, spec.attention.scale) == \
        (3.0, 0.4, 0.3)
    assert spec.logit_scale == pytest.approx(1 / 2.5)
    spec, model = from_transformers(hf_model("olmo-bias-untied"), REG)
    assert spec.norm.kind == "layer" and spec.norm.affine is False
    assert not any("norm" in k for k in model.state_dict())
    hf = hf_model("olmo-clip-qkv")
    spec, model = from_transformers(hf, REG)
    assert spec.attention.clip_qkv == 0.5
    unclipped = vl.build_model(dict(spec.to_data(), attention={"kind": "mha", "n_kv_heads": 2}),
                               REG)
    unclipped.load_state_dict(model.state_dict())
    assert max_diff(unclipped.eval(), hf, torch.randint(0, 64, (2, 12))) > 1e-3  # it clips
    spec, _ = from_transformers(hf_model("cohere-logit-scale"), REG)
    assert (spec.residual.kind, spec.residual.shared_norm, spec.norm_bias, spec.logit_scale) \
        == ("parallel", True, False, 0.5)
    spec, _ = from_transformers(hf_model("cohere-qk-norm-each-head"), REG)
    assert spec.attention.qk_norm_scope == "each_head" and spec.attention.qk_norm.kind == "layer"
    spec, _ = from_transformers(hf_model("phi-qk-layernorm"), REG)
    assert spec.head_bias and spec.positional.fraction == 0.5
    assert spec.attention.qk_norm.kind == "layer"
    spec, _ = from_transformers(hf_model("glm4-partial-interleaved-tied"), REG)
    assert spec.residual.kind == "sandwich" and spec.positional.fraction == 0.5
    spec, _ = from_transformers(hf_model("olmo3-sliding-rope-per-type"), REG)
    assert spec.layout.pattern == ["sliding", "sliding", "sliding", "full"]
    sliding, full = spec.layer_spec(0), spec.layer_spec(3)
    assert (sliding.attention.window, full.attention.window) == (3, None)
    assert (sliding.positional.theta, full.positional.theta) == (50.0, 1000.0)
    spec, _ = from_transformers(hf_model("exaone4-sliding-nope-full"), REG)
    assert spec.layer_spec(3).positional.kind == "none"
    assert spec.layer_spec(0).positional.kind == "rotary"
    assert spec.attention.qk_norm_scope == "head" and spec.residual.kind == "post_sublayer"
    spec, _ = from_transformers(hf_model("qwen2moe-dense-layer-renorm"), REG)
    moe = spec.layer_spec(0).feedforward
    assert (moe.n_experts, moe.top_k, moe.renormalize, moe.shared_gate, moe.shared_hidden_dim) \
        == (4, 2, True, True, 24)
    assert spec.layer_spec(1).feedforward.kind == "glu" and spec.qkv_bias
    assert not spec.attn_out_bias
    spec, _ = from_transformers(hf_model("starcoder2-window"), REG)
    assert spec.attention.window == 5 and spec.norm.kind == "layer" and spec.ffn_bias


@pytest.mark.parametrize("case", ["glm4-partial-interleaved-tied", "cohere-logit-scale",
                                  "cohere-qk-norm-each-head", "ernie4_5-biases"])
def test_the_interleaved_rotary_reorder_matters(case):
    """Their rotary turns interleaved pairs: without reordering the q/k rows the logits
    differ, so the reorder is what makes them equal."""
    hf = hf_model(case)
    spec, model = from_transformers(hf, REG)
    plain = vl.build_model(spec, REG)
    state = {k: v for k, v in model.state_dict().items()}
    for key, value in hf.state_dict().items():
        for name, mine in (("q_proj", "W_query"), ("k_proj", "W_key")):
            if key.endswith(f"self_attn.{name}.weight"):
                i = key.split(".")[2]
                ours = next(k for k in state if k.startswith(f"trf_blocks.{i}.")
                            and k.endswith(f"{mine}.weight"))
                state[ours] = value
    plain.load_state_dict(state)
    assert max_diff(plain.eval(), hf, torch.randint(0, 64, (2, 12))) > 1e-3


REFUSED = {
    "stablelm-qk-layernorm": ("StableLmForCausalLM", "StableLmConfig",
                              dict(S, qk_layernorm=True), "qk_layernorm"),
    "stablelm-hidden-dropout": ("StableLmForCausalLM", "StableLmConfig",
                                dict(S, hidden_dropout=0.1), "hidden_dropout"),
    "ernie4_5moe-biased-shared": ("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig",
                                  dict(S, use_bias=True, moe_num_shared_experts=1), "use_bias"),
    "qwen2moe-sliding": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        S, use_sliding_window=True, sliding_window=4), "use_sliding_window"),
    "persimmon-hidden-dropout": ("PersimmonForCausalLM", "PersimmonConfig",
                                 dict(S, hidden_dropout=0.1), "hidden_dropout"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_family_cannot_hold_is_refused_in_one_line(case):
    cls, config_cls, kwargs, option = REFUSED[case]
    hf = getattr(transformers, cls)(getattr(transformers, config_cls)(**kwargs))
    with pytest.raises(ConversionError) as err:
        from_transformers(hf, REG)
    assert option in str(err.value) and "\n" not in str(err.value)


TINY = dict(family="gpt", vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=2,
            drop_rate=0.0, positional={"kind": "rotary", "theta": 500.0})
NATIVE = {
    "granite": ("GraniteForCausalLM", dict(
        norm="rms", feedforward={"kind": "glu", "hidden_dim": 40}, activation="silu",
        qkv_bias=False, attn_out_bias=False, emb_multiplier=2.0, logit_scale=0.25,
        residual={"kind": "pre_norm", "branch_scale": 0.5})),
    "cohere": ("CohereForCausalLM", dict(
        norm={"kind": "layer"}, norm_bias=False, feedforward={"kind": "glu", "hidden_dim": 40},
        activation="silu", qkv_bias=False, attn_out_bias=False,
        residual={"kind": "parallel", "shared_norm": True})),
    "olmo": ("OlmoForCausalLM", dict(
        norm={"kind": "layer", "affine": False}, feedforward={"kind": "glu", "hidden_dim": 40},
        activation="silu", qkv_bias=False, attn_out_bias=False,
        attention={"kind": "mha", "n_kv_heads": 2})),
    "phi": ("PhiForCausalLM", dict(
        norm={"kind": "layer"}, feedforward={"kind": "mlp", "hidden_dim": 40},
        activation={"kind": "gelu", "approximate": "tanh"}, head_bias=True, qkv_bias=True,
        residual={"kind": "parallel", "shared_norm": True})),
}


@pytest.mark.parametrize("case", list(NATIVE))
def test_a_spec_built_in_variantlab_exports_with_equal_logits(case):
    cls, extra = NATIVE[case]
    assert_native_export({**TINY, **extra}, cls, REG, TOL)


def test_an_option_the_class_lacks_is_refused_at_its_spec_path():
    """The export reads its config back through the import: what differs is named."""
    spec = vl.parse_model_spec({**TINY, **NATIVE["cohere"][1],
                                "positional": {"kind": "rotary", "fraction": 0.5}}, REG)
    with pytest.raises(ConversionError, match="partial_rotary_factor"):
        to_transformers(spec, vl.build_model(spec, REG))
    granite = {**TINY, **NATIVE["granite"][1]}
    spec = vl.parse_model_spec({**granite, "norm": {"kind": "rms", "eps": 1e-5},
                                "attention": {"kind": "mha", "window": 4}}, REG)
    with pytest.raises(ConversionError, match="attention.window"):
        to_transformers(spec, vl.build_model(spec, REG))
    llama = {**TINY, "norm": "rms", "feedforward": {"kind": "glu", "hidden_dim": 40},
             "activation": "silu", "qkv_bias": False, "attn_out_bias": False}
    for key, value in (("logit_scale", 0.5), ("emb_multiplier", 2.0)):
        spec = vl.parse_model_spec({**llama, key: value,
                                    "residual": {"kind": "post_sublayer"},
                                    "attention": {"kind": "mha", "qk_norm": {"kind": "rms"},
                                                  "qk_norm_scope": "projection"}}, REG)
        with pytest.raises(ConversionError, match=key):
            to_transformers(spec, vl.build_model(spec, REG))
    spec = vl.parse_model_spec({**llama, "head_bias": True}, REG)  # only Phi has one
    with pytest.raises(ConversionError, match="exporting to PhiForCausalLM") as err:
        to_transformers(spec, vl.build_model(spec, REG))
    assert "\n" not in str(err.value)


def test_a_bias_the_class_has_and_the_variant_lacks_is_exported_as_zeros():
    spec = vl.parse_model_spec({**TINY, **NATIVE["cohere"][1], "qkv_bias": True}, REG)
    model = perturbed(vl.build_model(spec, REG), seed=2)
    with pytest.warns(ExportWarning, match="attention biases"):
        hf = to_transformers(spec, model)
    assert torch.equal(hf.state_dict()["model.layers.0.self_attn.o_proj.bias"], torch.zeros(32))
    assert max_diff(model, hf, torch.randint(0, 64, (2, 10))) < TOL
