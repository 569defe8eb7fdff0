"""Llama-like classes, both ways: ``LlamaForCausalLM``, ``MistralForCausalLM`` (a sliding
window on every layer, no biases), ``Qwen3ForCausalLM`` (per-head QK RMSNorm) and
``Olmo2ForCausalLM`` (post-sublayer norms and QK RMSNorm across each projection): RMSNorm,
gated feed-forward, rotary, grouped-query attention, separate q/k/v projections.
:data:`ATTENTION` and :data:`MLP` name each per-layer weight on both sides."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_attention,
    check_common,
    check_dropout,
    dropouts,
    head_dim,
    head_dim_of,
    hf_activation,
    linear,
    need,
    reject,
    rope,
    rotary,
    token_ids,
    warn_zero_biases,
    zero_bias,
)
from .gpt2 import hidden_of

#: our projection under ``trf_blocks.{i}.att.sublayer`` / ``.ff.sublayer`` -> the HF one
#: under ``model.layers.{i}.self_attn`` / ``.mlp``
ATTENTION = {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj", "out_proj": "o_proj"}
MLP = {"W_gate": "gate_proj", "W_up": "up_proj", "W_down": "down_proj"}
QK_NORMS = ("q_norm", "k_norm")
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


# --- import ---------------------------------------------------------------------------

def llama_spec(cfg: Any, positional: dict[str, Any] | None = None) -> dict[str, Any]:
    """Spec data of a ``LlamaConfig`` (also the base of Qwen3, OLMo2 and Gemma);
    ``positional``: a rotary spec read by the caller (default: from ``cfg``)."""
    head_dim = head_dim_of(cfg)
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(0.0, getattr(cfg, "attention_dropout", 0.0), 0.0),
        "qkv_bias": attention_bias, "attn_out_bias": attention_bias, "ffn_bias": False,
        "norm_bias": False, "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "rms", "eps": cfg.rms_norm_eps},
        "activation": activation("hidden_act", getattr(cfg, "hidden_act", "silu")),
        "feedforward": {"kind": "glu", "hidden_dim": cfg.intermediate_size,
                        "bias": bool(getattr(cfg, "mlp_bias", False))},
        "attention": {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads,
                      "head_dim": head_dim if head_dim * cfg.num_attention_heads
                      != cfg.hidden_size else None},
        "positional": positional or rotary(cfg, partial=False, head_dim=head_dim),
    }


def llama_state(hf: Any, norms: tuple[str, str] = CLASSES["LlamaForCausalLM"][3]
                ) -> dict[str, torch.Tensor]:
    """Our state dict from a Llama-like model; ``norms`` are the HF names of the norms of
    the attention and the feed-forward residual."""
    sd, cfg = hf.state_dict(), hf.config
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    mlp_bias = bool(getattr(cfg, "mlp_bias", False))
    out = {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
           "final_norm.scale": sd["model.norm.weight"], "out_head.weight": sd["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = sd[f"{theirs}.{norms[0]}.weight"]
        out[f"{ours}.ff.norm.scale"] = sd[f"{theirs}.{norms[1]}.weight"]
        for mine, hf_name in ATTENTION.items():
            linear(out, f"{ours}.att.sublayer.{mine}", sd, f"{theirs}.self_attn.{hf_name}",
                   attention_bias)
        if f"{theirs}.mlp.gate_proj.weight" not in sd:
            continue  # a mixture-of-experts layer (hf.moe maps it)
        for mine, hf_name in MLP.items():
            linear(out, f"{ours}.ff.sublayer.{mine}", sd, f"{theirs}.mlp.{hf_name}", mlp_bias)
    return out


def mistral_spec(cfg: Any) -> dict[str, Any]:
    """Llama plus Mistral's sliding window (Jiang et al. 2023): every layer's query sees at
    most ``sliding_window`` keys, itself included (HF's mask keeps key j for query i when
    ``i - sliding_window < j <= i``, counting sequence indices, padding included, as ours)."""
    data = llama_spec(cfg)
    if getattr(cfg, "sliding_window", None) is not None:
        data["attention"]["window"] = int(cfg.sliding_window)
    return data


def qwen3_spec(cfg: Any) -> dict[str, Any]:
    """Llama plus per-head QK RMSNorm; refuses Qwen3's sliding windows."""
    if getattr(cfg, "use_sliding_window", False):
        reject("use_sliding_window", True, "Qwen3's per-layer sliding windows are not imported")
    data = llama_spec(cfg)
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "head"
    return data


def qk_norms(out: dict[str, torch.Tensor], hf: Any) -> dict[str, torch.Tensor]:
    """``out`` plus each layer's QK-norm scales from ``hf`` (Qwen3, OLMo 2, their MoE kin)."""
    sd = hf.state_dict()
    for i in range(hf.config.num_hidden_layers):
        for name in QK_NORMS:
            out[f"trf_blocks.{i}.att.sublayer.{name}.scale"] = \
                sd[f"model.layers.{i}.self_attn.{name}.weight"]
    return out


def qwen3_state(hf: Any) -> dict[str, torch.Tensor]:
    return qk_norms(llama_state(hf), hf)


def olmo2_spec(cfg: Any) -> dict[str, Any]:
    """Llama with OLMo 2's norm on each sublayer's output (``post_sublayer``) and QK RMSNorm
    across the whole query / key projection."""
    data = llama_spec(cfg)
    data["residual"] = {"kind": "post_sublayer"}
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "projection"
    return data


def olmo2_state(hf: Any) -> dict[str, torch.Tensor]:
    return qk_norms(llama_state(hf, CLASSES["Olmo2ForCausalLM"][3]), hf)


# --- export ---------------------------------------------------------------------------

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
        rope_parameters=rope(spec.positional, False, spec.context_length, cls=cls))


def llama_hf_state(spec: Spec, sd: dict[str, torch.Tensor], cls: str,
                   norms: tuple[str, str] | None = None,
                   norm_names: tuple[str, str] = ("norm", "norm")) -> dict[str, torch.Tensor]:
    """The HF state dict from ours (``sd``); ``norms``: the HF names of the norms our
    ``att.<norm_names[0]>`` and ``ff.<norm_names[1]>`` go to (default: the class's)."""
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
        for mine, hf in ATTENTION.items():
            key = f"{ours}.att.sublayer.{mine}"
            out[f"{theirs}.self_attn.{hf}.weight"] = sd[f"{key}.weight"]
            if att_bias:
                zero_bias(sd, f"{key}.bias", sd[f"{key}.weight"].shape[0], "attention biases",
                          zeros)
                out[f"{theirs}.self_attn.{hf}.bias"] = sd[f"{key}.bias"]
        for mine, hf in MLP.items():
            key = f"{ours}.ff.sublayer.{mine}"
            out[f"{theirs}.mlp.{hf}.weight"] = sd[f"{key}.weight"]
            if f"{key}.bias" in sd:
                out[f"{theirs}.mlp.{hf}.bias"] = sd[f"{key}.bias"]
        for name in QK_NORMS:
            if f"{ours}.att.sublayer.{name}.scale" in sd:
                out[f"{theirs}.self_attn.{name}.weight"] = sd[f"{ours}.att.sublayer.{name}.scale"]
    warn_zero_biases(cls, zeros)
    return out
