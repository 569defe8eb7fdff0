"""Arcee (AFM), both ways: ``ArceeForCausalLM`` (Arcee AI 2025, "AFM-4.5B").

A Llama decoder whose feed-forward has no gate: up_proj, the activation (ReLU², ``relu2``),
down_proj (``feedforward: mlp``, biased with ``mlp_bias``). On export a rotary pre-norm
RMSNorm spec with a plain ``mlp`` goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import MLP, Family, Layer, decoder_spec, llama_options


def arcee_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``ArceeConfig``."""
    bias = bool(cfg.attention_bias)
    return decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias, ffn="mlp",
                        ffn_bias=cfg.mlp_bias)


def arcee_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(qkv_bias=bias, out_bias=bias, ffn=MLP, ffn_bias=bool(cfg.mlp_bias))


def arcee_options(spec: Spec) -> dict[str, Any]:
    return llama_options(spec, attention_bias=spec.qkv_bias or spec.attn_out_bias,
                         mlp_bias=spec.ffn_bias)


ARCEE = Family("ArceeForCausalLM", "ArceeConfig", arcee_spec, arcee_layer, arcee_options)
