"""LFM2: ``Lfm2ForCausalLM`` (Liquid AI 2025, LFM2 technical report).

A hybrid of gated short-convolution layers (``layer_types`` ``conv``: ``attention: {kind:
gated_short_conv, width: conv_L_cache, bias: conv_bias}``, the layer kind ``conv``) and
grouped-query attention layers (``full_attention``: ``mha`` with per-head QK RMSNorm and
rotary, the kind ``attention``), each followed by a SwiGLU (``w1`` gate, ``w3`` up, ``w2``
down; its width ``intermediate_size``, or with ``block_auto_adjust_ff_dim`` 2/3 of it times
``block_ffn_dim_multiplier`` rounded up to ``block_multiple_of``), pre-norm RMSNorms
(``operator_norm``, ``ffn_norm``; the final one is named ``embedding_norm``).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import linear, period, reject, rms_decoder, rotary

_KINDS = {"conv": "conv", "full_attention": "attention"}


def lfm2_ffn_width(cfg: Any) -> int:
    """Lfm2MLP's width."""
    width = cfg.intermediate_size
    if cfg.block_auto_adjust_ff_dim:
        width = int(2 * width / 3)
        if cfg.block_ffn_dim_multiplier is not None:
            width = int(cfg.block_ffn_dim_multiplier * width)
            width = cfg.block_multiple_of * ((width + cfg.block_multiple_of - 1)
                                             // cfg.block_multiple_of)
    return width


def lfm2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``Lfm2Config``."""
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - set(_KINDS))
    if unknown:
        reject("layer_types", unknown, f"supported layer types: {', '.join(_KINDS)}")
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    data = {
        **rms_decoder(cfg, False, eps=cfg.norm_eps),  # Lfm2MLP: silu always
        "feedforward": {"kind": "glu", "hidden_dim": lfm2_ffn_width(cfg)},
        "attention": {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads,
                      "qk_norm": {"kind": "rms", "eps": cfg.norm_eps}, "qk_norm_scope": "head"},
        "positional": rotary(cfg, partial=False, head_dim=head_dim),
    }
    conv = {"kind": "gated_short_conv", "width": int(cfg.conv_L_cache),
            "bias": bool(cfg.conv_bias)}
    names = [_KINDS[t] for t in types]
    if "conv" in names:
        data["layout"] = {"kinds": {"conv": {"attention": conv}, "attention": {}},
                          "pattern": period(names)}
    return data


def lfm2_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from an ``Lfm2ForCausalLM``."""
    sd, cfg = hf.state_dict(), hf.config
    out = {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
           "final_norm.scale": sd["model.embedding_norm.weight"],
           "out_head.weight": sd["lm_head.weight"]}
    for i, kind in enumerate(cfg.layer_types):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = sd[f"{theirs}.operator_norm.weight"]
        out[f"{ours}.ff.norm.scale"] = sd[f"{theirs}.ffn_norm.weight"]
        for mine, name in (("W_gate", "w1"), ("W_up", "w3"), ("W_down", "w2")):
            out[f"{ours}.ff.sublayer.{mine}.weight"] = sd[f"{theirs}.feed_forward.{name}.weight"]
        att = f"{ours}.att.sublayer"
        if kind == "conv":
            for name in ("in_proj", "conv", "out_proj"):
                linear(out, f"{att}.{name}", sd, f"{theirs}.conv.{name}", bool(cfg.conv_bias))
            continue
        for mine, name in (("W_query", "q_proj"), ("W_key", "k_proj"), ("W_value", "v_proj"),
                           ("out_proj", "out_proj")):
            out[f"{att}.{mine}.weight"] = sd[f"{theirs}.self_attn.{name}.weight"]
        out[f"{att}.q_norm.scale"] = sd[f"{theirs}.self_attn.q_layernorm.weight"]
        out[f"{att}.k_norm.scale"] = sd[f"{theirs}.self_attn.k_layernorm.weight"]
    return out
