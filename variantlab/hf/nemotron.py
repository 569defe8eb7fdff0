"""Nemotron (3/4), both ways: ``NemotronForCausalLM`` (NVIDIA 2024, "Nemotron-4 15B
technical report").

A pre-norm decoder with LayerNorm1P (LayerNorm with shift whose scale is ``1 + weight``:
imported as the scale ``1 + weight``, exported as ``scale - 1``; eps ``norm_eps``), a plain
MLP (up_proj, ReLU², down_proj; biased with ``mlp_bias``), attention biases with
``attention_bias``, grouped-query heads and rotary over the first
``partial_rotary_factor`` of each head. On export a pre-norm LayerNorm ``mlp`` spec with
grouped-query heads and partial rotary goes here (with all dims rotating: StarCoder 2; with
every head its own keys: GPT-NeoX).
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import MLP, Family, Layer, decoder_spec, llama_options


def nemotron_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``NemotronConfig``."""
    bias = bool(cfg.attention_bias)
    return decoder_spec(cfg, eps=cfg.norm_eps, norm="layer", norm_bias=True, qkv_bias=bias,
                        out_bias=bias, ffn="mlp", ffn_bias=cfg.mlp_bias, partial=True)


def nemotron_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(qkv_bias=bias, out_bias=bias, ffn=MLP, ffn_bias=bool(cfg.mlp_bias),
                 norm_shift=True, plus_one=True)


def nemotron_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, norm_eps=spec.norm.eps, attention_bias=spec.qkv_bias or spec.attn_out_bias,
                            mlp_bias=spec.ffn_bias)
    options["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    del options["rms_norm_eps"]
    return options


NEMOTRON = Family("NemotronForCausalLM", "NemotronConfig", nemotron_spec, nemotron_layer,
                  nemotron_options)
