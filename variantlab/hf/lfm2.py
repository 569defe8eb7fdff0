"""LFM2, both ways: ``Lfm2ForCausalLM`` (Liquid AI 2025, LFM2 technical report).

A hybrid of gated short-convolution layers (``layer_types`` ``conv``: ``attention: {kind:
gated_short_conv, width: conv_L_cache, bias: conv_bias}``, the layer kind ``conv``) and
grouped-query attention layers (``full_attention``: ``mha`` with per-head QK RMSNorm and
rotary, the kind ``attention``), each followed by a SwiGLU (``w1`` gate, ``w3`` up, ``w2``
down; its width ``intermediate_size``, or with ``block_auto_adjust_ff_dim`` 2/3 of it times
``block_ffn_dim_multiplier`` rounded up to ``block_multiple_of``), pre-norm RMSNorms
(``operator_norm``, ``ffn_norm``; the final one is named ``embedding_norm``). On export the
width is written as it is (``block_auto_adjust_ff_dim: false``); a spec without convolution
layers is a Qwen3. :func:`lfm2_table` names every weight on both sides.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    layers,
    need,
    one,
    period,
    reject,
    rms_decoder,
    rope,
    rotary,
    token_ids,
)
from .gpt2 import hidden_of
from .table import Pair, attention, ends, glu, linear, load_state, norms, same

CLS = "Lfm2ForCausalLM"
_KINDS = {"conv": "conv", "full_attention": "attention"}
#: our SwiGLU -> LFM2's names under ``feed_forward``
_MLP = {"W_gate": "w1", "W_up": "w3", "W_down": "w2"}
#: our attention projections -> LFM2's names under ``self_attn``
_ATTENTION = {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj", "out_proj": "out_proj"}


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


def lfm2_table(cfg: Any) -> list[Pair]:
    """Every weight of an ``Lfm2ForCausalLM`` of ``cfg`` and ours, both ways."""
    pairs = ends("model.embedding_norm")
    for i, kind in enumerate(cfg.layer_types):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "operator_norm", "ffn_norm")
        pairs += glu(f"{ours}.ff.sublayer", f"{theirs}.feed_forward", _MLP)
        att = f"{ours}.att.sublayer"
        if kind == "conv":
            for name in ("in_proj", "conv", "out_proj"):
                pairs += linear(f"{att}.{name}", f"{theirs}.conv.{name}", bool(cfg.conv_bias))
            continue
        pairs += attention(att, f"{theirs}.self_attn", False, _ATTENTION)
        pairs += [same(f"{att}.q_norm.scale", f"{theirs}.self_attn.q_layernorm.weight"),
                  same(f"{att}.k_norm.scale", f"{theirs}.self_attn.k_layernorm.weight")]
    return pairs


def lfm2_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from an ``Lfm2ForCausalLM``."""
    return load_state(lfm2_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def lfm2_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``Lfm2Config`` of a spec mixing gated short convolutions and attention."""
    import transformers

    specs = layers(spec, CLS, ("attention",))
    need(spec, CLS, "positional.kind", spec.positional.kind == "rotary",
         f"positional {spec.positional.kind!r}: LFM2's attention layers are rotary")
    check_common(spec.model_copy(update={"layout": None}), CLS, norm="rms", rotary=True)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: LFM2 is pre_norm")
    check_dropout(spec, CLS, ())
    need(spec, CLS, "feedforward.kind", spec.feedforward.kind == "glu" and
         not spec.feedforward.bias, "LFM2's feed-forward is a bias-free SwiGLU (glu)")
    need(spec, CLS, "activation.kind", spec.activation.kind == "silu",
         f"activation {spec.activation.kind!r}: LFM2's SwiGLU uses silu")
    need(spec, CLS, "qkv_bias", not (spec.qkv_bias or spec.attn_out_bias),
         "LFM2's attention has no biases")
    convs, atts = [], []
    for layer in specs:
        att = layer.attention
        if att.kind == "gated_short_conv":
            convs.append((att.width, att.bias))
            continue
        check_attention(layer, CLS, gqa=True, head_dim_free=False, qk_norm="head")
        atts.append(att)
    width, bias = one(spec, CLS, "layout.attention", convs, "convolutions (width, bias)") or (
        3, False)
    base = one(spec, CLS, "layout.attention", atts, "attentions")
    config = transformers.Lfm2Config
    return config(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=getattr(base, "n_kv_heads", None) or spec.n_heads,
        intermediate_size=hidden_of(spec), block_auto_adjust_ff_dim=False,
        norm_eps=spec.norm.eps, tie_word_embeddings=spec.tie_weights,
        rope_parameters=rope(spec.positional, False, spec.context_length, cls=cls),
        conv_bias=bias, conv_L_cache=width,
        layer_types=["conv" if layer.attention.kind == "gated_short_conv" else
                     "full_attention" for layer in specs], **token_ids(spec, config))
