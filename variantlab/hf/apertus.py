"""Apertus, both ways: ``ApertusForCausalLM`` (Swiss AI 2025, "Apertus: democratizing open
and compliant LLMs for global language environments").

A Llama decoder (pre-norm RMSNorm: attention_layernorm, feedforward_layernorm) with a
per-head QK RMSNorm and a feed-forward without a gate (up_proj, xIELU, down_proj:
``feedforward: mlp``, ``activation: xielu``, whose two learned scalars per layer are
mlp.act_fn.alpha_p / alpha_n → the activation's ``alpha_p`` / ``alpha_n``). Its default
rotary is ``llama3``-scaled (the rotary's ``scaling: llama3``; tests/test_rope_scaling.py).
On export a pre-norm spec with a per-head RMS QK-norm and an
``mlp`` goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import MLP, Family, Layer, decoder_spec, llama_options

#: xIELU's buffers in transformers (fixed there)
XIELU_BUFFERS = {"beta": 0.5, "eps": -1e-6}


def apertus_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``ApertusConfig``."""
    bias = bool(cfg.attention_bias)
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias, ffn="mlp")
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "head"
    return data


def apertus_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    xielu = cfg.hidden_act == "xielu"
    return Layer(norms=("attention_layernorm", "feedforward_layernorm"), qkv_bias=bias,
                 out_bias=bias, qk_norms=("q_norm", "k_norm"), ffn=MLP,
                 act_params=("alpha_p", "alpha_n") if xielu else (),
                 act_buffers=XIELU_BUFFERS if xielu else {})


def apertus_options(spec: Spec) -> dict[str, Any]:
    return llama_options(spec, attention_bias=spec.qkv_bias or spec.attn_out_bias)


APERTUS = Family("ApertusForCausalLM", "ApertusConfig", apertus_spec, apertus_layer,
                 apertus_options)
