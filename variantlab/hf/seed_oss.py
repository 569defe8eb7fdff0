"""Seed-OSS, both ways: ``SeedOssForCausalLM`` (ByteDance Seed 2025, "Seed-OSS-36B").

A Llama decoder whose q/k/v biases (``attention_bias``) and output bias
(``attention_out_bias``) are separate options, with a residual dropout after each sublayer
(``residual_dropout``). On export a rotary pre-norm RMSNorm glu spec whose q/k/v and
output biases differ goes here (the same biases: Llama).
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, llama_options


def seed_oss_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``SeedOssConfig``."""
    return decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=cfg.attention_bias,
                        out_bias=cfg.attention_out_bias, ffn_bias=cfg.mlp_bias,
                        drops=(0.0, cfg.attention_dropout, cfg.residual_dropout))


def seed_oss_layer(cfg: Any) -> Layer:
    return Layer(qkv_bias=bool(cfg.attention_bias), out_bias=bool(cfg.attention_out_bias),
                 ffn_bias=bool(cfg.mlp_bias))


def seed_oss_options(spec: Spec) -> dict[str, Any]:
    return llama_options(spec, attention_bias=spec.qkv_bias,
                         attention_out_bias=spec.attn_out_bias, mlp_bias=spec.feedforward.bias,
                         residual_dropout=spec.drop("resid"))


SEED_OSS = Family("SeedOssForCausalLM", "SeedOssConfig", seed_oss_spec, seed_oss_layer,
                  seed_oss_options, dropouts=("attn", "resid"))
