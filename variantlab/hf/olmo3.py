"""OLMo 3, both ways: ``Olmo3ForCausalLM`` (Allen AI 2025, "OLMo 3").

OLMo 2 (norms on each sublayer's output, ``residual: post_sublayer``; an RMSNorm across the
whole query and key projections, ``qk_norm_scope: projection``) with sliding-window layers:
``layer_types`` becomes a layout of ``sliding`` (``attention.window: sliding_window``) and
``full`` layers, each with its own rotary from ``rope_parameters`` per layer type. On export
a ``post_sublayer`` spec with a projection QK-norm and a window on some layer goes here
(without windows: OLMo 2).
"""

from __future__ import annotations

from typing import Any

from .common import Spec, rope
from .decoder import (
    Family,
    Layer,
    decoder_spec,
    layer_types,
    llama_options,
    typed_layers,
    typed_rotary,
)


def olmo3_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``Olmo3Config``."""
    bias = bool(cfg.attention_bias)
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias,
                        positional=typed_rotary(cfg, "full_attention"))
    data["residual"] = {"kind": "post_sublayer"}
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "projection"
    typed_layers(cfg, data)
    return data


def olmo3_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(residual="post_sublayer",
                 norms=("post_attention_layernorm", "post_feedforward_layernorm"),
                 qkv_bias=bias, out_bias=bias, qk_norms=("q_norm", "k_norm"))


def olmo3_options(spec: Spec) -> dict[str, Any]:
    types, window, positionals = layer_types(spec)
    full = positionals.get("full_attention", spec.positional)
    options = llama_options(
        spec.model_copy(update={"attention": spec.layer_spec(0).attention}),
        attention_bias=spec.qkv_bias or spec.attn_out_bias, layer_types=types,
        sliding_window=window or spec.context_length,
        rope_parameters={kind: rope(pos, False, spec.context_length) for kind, pos in (
            ("full_attention", full),
            ("sliding_attention", positionals.get("sliding_attention", full)))})
    del options["head_dim"]
    return options


OLMO3 = Family("Olmo3ForCausalLM", "Olmo3Config", olmo3_spec, olmo3_layer, olmo3_options)
