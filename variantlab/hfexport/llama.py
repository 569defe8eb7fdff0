"""``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen3ForCausalLM`` and ``Olmo2ForCausalLM``
from a spec with rotary positions, RMSNorm and a gated feed-forward: the inverse of
:mod:`variantlab.hfimport.llama` (Mistral: a sliding window on every layer, no biases; Qwen3:
per-head QK RMSNorm; OLMo 2: post-sublayer norms and QK RMSNorm across each projection)."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    head_dim,
    hf_activation,
    need,
    rope,
    token_ids,
    warn_zero_biases,
    zero_bias,
)
from .gpt2 import hidden_of

_ATTENTION = {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj", "out_proj": "o_proj"}
_MLP = {"W_gate": "gate_proj", "W_up": "up_proj", "W_down": "down_proj"}
#: class -> (config class, residual kind, QK-norm scope, HF names of the two norms per layer)
CLASSES: dict[str, tuple[str, str, str | None, tuple[str, str]]] = {
    "LlamaForCausalLM": ("LlamaConfig", "pre_norm", None,
                         ("input_layernorm", "post_attention_layernorm")),
    "MistralForCausalLM": ("MistralConfig", "pre_norm", None,
                           ("input_layernorm", "post_attention_layernorm")),
    "Qwen3ForCausalLM": ("Qwen3Config", "pre_norm", "head",
                         ("input_layernorm", "post_attention_layernorm")),
    "Olmo2ForCausalLM": ("Olmo2Config", "post_sublayer", "projection",
                         ("post_attention_layernorm", "post_feedforward_layernorm")),
}


def llama_kwargs(spec: Spec, cls: str) -> dict[str, Any]:
    """The config options the Llama-like classes (Gemma's too) share."""
    need(spec, cls, "feedforward.kind", spec.feedforward.kind == "glu",
         f"feedforward {spec.feedforward.kind!r}: this class has a gated feed-forward (glu)")
    check_dropout(spec, cls, ("attn",))
    att = spec.attention
    return dict(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads, num_key_value_heads=att.n_kv_heads or spec.n_heads,
        head_dim=head_dim(spec), intermediate_size=hidden_of(spec),
        rms_norm_eps=spec.norm.eps, attention_bias=spec.qkv_bias or spec.attn_out_bias,
        attention_dropout=spec.drop("attn"), tie_word_embeddings=spec.tie_weights)


def llama_config(spec: Spec, cls: str) -> Any:
    import transformers

    config_cls, residual, scope, _ = CLASSES[cls]
    check_common(spec, cls, norm="rms", rotary=True)
    mistral = cls == "MistralForCausalLM"
    check_attention(spec, cls, gqa=True, head_dim_free=True, qk_norm=scope, window=mistral)
    need(spec, cls, "residual.kind", spec.residual.kind == residual,
         f"residual {spec.residual.kind!r}: this class is {residual}")
    kwargs = llama_kwargs(spec, cls)
    bias = spec.feedforward.bias
    if cls == "LlamaForCausalLM":
        kwargs["mlp_bias"] = bias
    elif mistral:
        need(spec, cls, "qkv_bias", not (spec.qkv_bias or spec.attn_out_bias),
             "Mistral's attention has no biases")
        need(spec, cls, "feedforward.bias", not bias, "this class has no feed-forward biases")
        del kwargs["attention_bias"]
        kwargs["sliding_window"] = spec.attention.window
    else:
        need(spec, cls, "feedforward.bias", not bias, "this class has no feed-forward biases")
    config = getattr(transformers, config_cls)
    return config(
        **kwargs, **token_ids(spec, config), hidden_act=hf_activation(spec, cls),
        rope_parameters=rope(spec.positional))


def llama_state(spec: Spec, sd: dict[str, torch.Tensor], cls: str,
                norms: tuple[str, str] | None = None,
                norm_names: tuple[str, str] = ("norm", "norm")) -> dict[str, torch.Tensor]:
    """The HF state dict; ``norms``: the HF names of the norms our ``att.<norm_names[0]>`` and
    ``ff.<norm_names[1]>`` go to (default: the class's)."""
    norms = norms or CLASSES[cls][3]
    out = {"model.embed_tokens.weight": sd["embed.tok_emb.weight"],
           "model.norm.weight": sd["final_norm.scale"],
           "lm_head.weight": sd.get("out_head.weight", sd["embed.tok_emb.weight"])}
    zeros: list[str] = []
    att_bias = spec.qkv_bias or spec.attn_out_bias
    for i in range(spec.n_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{theirs}.{norms[0]}.weight"] = sd[f"{ours}.att.{norm_names[0]}.scale"]
        out[f"{theirs}.{norms[1]}.weight"] = sd[f"{ours}.ff.{norm_names[1]}.scale"]
        for mine, hf in _ATTENTION.items():
            key = f"{ours}.att.sublayer.{mine}"
            out[f"{theirs}.self_attn.{hf}.weight"] = sd[f"{key}.weight"]
            if att_bias:
                zero_bias(sd, f"{key}.bias", sd[f"{key}.weight"].shape[0], "attention biases",
                          zeros)
                out[f"{theirs}.self_attn.{hf}.bias"] = sd[f"{key}.bias"]
        for mine, hf in _MLP.items():
            key = f"{ours}.ff.sublayer.{mine}"
            out[f"{theirs}.mlp.{hf}.weight"] = sd[f"{key}.weight"]
            if f"{key}.bias" in sd:
                out[f"{theirs}.mlp.{hf}.bias"] = sd[f"{key}.bias"]
        for name in ("q_norm", "k_norm"):
            if f"{ours}.att.sublayer.{name}.scale" in sd:
                out[f"{theirs}.self_attn.{name}.weight"] = sd[f"{ours}.att.sublayer.{name}.scale"]
    warn_zero_biases(cls, zeros)
    return out
