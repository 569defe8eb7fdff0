"""ERNIE 4.5 (dense), both ways: ``Ernie4_5ForCausalLM`` (Baidu 2025, "ERNIE 4.5 technical
report").

A Llama decoder with every Linear but the output head biased together (``use_bias``) and
rotary in interleaved pairs, which become rotate-half pairs by reordering the rows of each
head of q_proj and k_proj (even dims, then odd ones). On export a rotary pre-norm RMSNorm
glu spec with the feed-forward biased as the attention goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, head_dim_of
from .decoder import Family, Layer, decoder_spec, llama_options


def ernie4_5_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``Ernie4_5Config``."""
    bias = bool(cfg.use_bias)
    return decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias, ffn_bias=bias)


def ernie4_5_layer(cfg: Any) -> Layer:
    bias, head_dim = bool(cfg.use_bias), head_dim_of(cfg)
    return Layer(qkv_bias=bias, out_bias=bias, ffn_bias=bias, rotary_dims=head_dim,
                 head_dim=head_dim)


def ernie4_5_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, use_bias=spec.qkv_bias or spec.attn_out_bias)
    return options


ERNIE4_5 = Family("Ernie4_5ForCausalLM", "Ernie4_5Config", ernie4_5_spec, ernie4_5_layer,
                  ernie4_5_options, dropouts=())
