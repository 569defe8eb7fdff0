"""Gemma (1), both ways: ``GemmaForCausalLM`` (Gemma Team 2024, "Gemma: open models based on
Gemini research and technology").

A Llama decoder (pre-norm RMSNorm, GeGLU, rotary, grouped-query attention with its own
``head_dim``) whose embeddings are multiplied by sqrt(hidden_size) (``scale_embeddings``)
and whose RMSNorms scale by ``1 + weight`` (imported as the scale ``1 + weight``, exported
as ``scale - 1``). On export a pre-norm RMSNorm spec with ``scale_embeddings`` goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, llama_options


def gemma1_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GemmaConfig``."""
    bias = bool(cfg.attention_bias)
    return {**decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias),
            "scale_embeddings": True}


def gemma1_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(qkv_bias=bias, out_bias=bias, plus_one=True)


def gemma1_options(spec: Spec) -> dict[str, Any]:
    return llama_options(spec, attention_bias=spec.qkv_bias or spec.attn_out_bias)


GEMMA1 = Family("GemmaForCausalLM", "GemmaConfig", gemma1_spec, gemma1_layer, gemma1_options)
