"""Llama-like classes: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen3ForCausalLM`` and
``Olmo2ForCausalLM`` (RMSNorm, gated feed-forward, rotary, grouped-query attention; separate
q/k/v projections)."""

from __future__ import annotations

from typing import Any

import torch

from .common import activation, dropouts, head_dim_of, linear, reject, rotary

_ATTENTION = {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj", "out_proj": "o_proj"}
_MLP = {"W_gate": "gate_proj", "W_up": "up_proj", "W_down": "down_proj"}


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


def llama_state(hf: Any, norms: tuple[str, str] = ("input_layernorm",
                                                   "post_attention_layernorm")
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
        for mine, hf_name in _ATTENTION.items():
            linear(out, f"{ours}.att.sublayer.{mine}", sd, f"{theirs}.self_attn.{hf_name}",
                   attention_bias)
        if f"{theirs}.mlp.gate_proj.weight" not in sd:
            continue  # a mixture-of-experts layer (hfimport.moe maps it)
        for mine, hf_name in _MLP.items():
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


def _qk_norms(out: dict[str, torch.Tensor], hf: Any) -> dict[str, torch.Tensor]:
    sd = hf.state_dict()
    for i in range(hf.config.num_hidden_layers):
        for name in ("q_norm", "k_norm"):
            out[f"trf_blocks.{i}.att.sublayer.{name}.scale"] = \
                sd[f"model.layers.{i}.self_attn.{name}.weight"]
    return out


def qwen3_state(hf: Any) -> dict[str, torch.Tensor]:
    return _qk_norms(llama_state(hf), hf)


def olmo2_spec(cfg: Any) -> dict[str, Any]:
    """Llama with OLMo 2's norm on each sublayer's output (``post_sublayer``) and QK RMSNorm
    across the whole query / key projection."""
    data = llama_spec(cfg)
    data["residual"] = {"kind": "post_sublayer"}
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "projection"
    return data


def olmo2_state(hf: Any) -> dict[str, torch.Tensor]:
    norms = ("post_attention_layernorm", "post_feedforward_layernorm")
    return _qk_norms(llama_state(hf, norms), hf)
