"""Granite (3.x), both ways: ``GraniteForCausalLM`` (IBM 2024, "Granite 3.0 language
models").

A Llama decoder with four μP-style multipliers, each a spec option: the embeddings times
``embedding_multiplier`` (``emb_multiplier``), each residual branch times
``residual_multiplier`` (``residual: {kind: pre_norm, branch_scale}``), the attention scores
times ``attention_multiplier`` (``attention.scale``) and the logits divided by
``logits_scaling`` (``logit_scale: 1 / logits_scaling``); a multiplier of 1 is left unset.
On export a spec with any of them (and none of Cohere's parallel block) goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, llama_options


def _unless_one(value: float) -> float | None:
    return None if float(value) == 1.0 else float(value)


def granite_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GraniteConfig``."""
    bias = bool(cfg.attention_bias)
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias,
                        ffn_bias=getattr(cfg, "mlp_bias", False))  # Granite-MoE has none
    data["attention"]["scale"] = float(cfg.attention_multiplier)
    data["residual"] = {"kind": "pre_norm", "branch_scale": float(cfg.residual_multiplier)}
    data["emb_multiplier"] = _unless_one(cfg.embedding_multiplier)
    data["logit_scale"] = _unless_one(1.0 / cfg.logits_scaling)
    return data


def granite_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(qkv_bias=bias, out_bias=bias, ffn_bias=bool(cfg.mlp_bias))


def granite_options(spec: Spec) -> dict[str, Any]:
    att = spec.attention
    scale = att.scale if att.scale is not None else \
        (att.head_dim or spec.emb_dim // spec.n_heads) ** -0.5
    options = llama_options(
        spec, attention_bias=spec.qkv_bias or spec.attn_out_bias, mlp_bias=spec.feedforward.bias,
        attention_multiplier=scale,
        residual_multiplier=getattr(spec.residual, "branch_scale", 1.0),
        embedding_multiplier=spec.emb_multiplier or 1.0,
        logits_scaling=1.0 / (spec.logit_scale or 1.0))
    del options["head_dim"]
    return options


GRANITE = Family("GraniteForCausalLM", "GraniteConfig", granite_spec, granite_layer,
                 granite_options)
