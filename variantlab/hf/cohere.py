"""Cohere (Command R), both ways: ``CohereForCausalLM`` (Cohere 2024, "Command R").

A parallel block (``residual: {kind: parallel, shared_norm: true}``: attention and SwiGLU
read one norm of the input, both outputs added to it), LayerNorm without a shift
(``norm_bias: false``, eps ``layer_norm_eps``), attention biases with ``attention_bias``,
rotary in interleaved pairs (q/k rows reordered per head to rotate-half pairs), the logits
times ``logit_scale``, and with ``use_qk_norm`` a LayerNorm without shift on each query and
key head, each head its own weight (``qk_norm: {kind: layer}``, ``qk_norm_scope:
each_head``; the stacked (heads, head_dim) weight split per head). On export a parallel spec
with a shared norm, ``glu`` and a LayerNorm without shift goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, head_dim_of
from .decoder import Family, Layer, decoder_spec, llama_options


def cohere_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``CohereConfig``."""
    bias = bool(cfg.attention_bias)
    data = decoder_spec(cfg, eps=cfg.layer_norm_eps, norm="layer", qkv_bias=bias, out_bias=bias)
    data["residual"] = {"kind": "parallel", "shared_norm": True}
    if cfg.use_qk_norm:  # a LayerNorm without shift per head, each its own weight
        data["attention"]["qk_norm"] = {"kind": "layer", "eps": float(cfg.layer_norm_eps),
                                        "impl": "fused"}
        data["attention"]["qk_norm_scope"] = "each_head"
    if cfg.logit_scale is not None and float(cfg.logit_scale) != 1.0:
        data["logit_scale"] = float(cfg.logit_scale)
    return data


def cohere_layer(cfg: Any) -> Layer:
    bias, head_dim = bool(cfg.attention_bias), head_dim_of(cfg)
    return Layer(residual="parallel", norms=("input_layernorm",), qkv_bias=bias, out_bias=bias,
                 rotary_dims=head_dim, head_dim=head_dim,
                 qk_norms=("q_norm", "k_norm") if cfg.use_qk_norm else None,
                 qk_norm_stacked=True)


def cohere_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, attention_bias=spec.qkv_bias or spec.attn_out_bias,
                            layer_norm_eps=spec.norm.eps, logit_scale=spec.logit_scale or 1.0,
                            use_qk_norm=spec.attention.qk_norm is not None)
    del options["rms_norm_eps"], options["head_dim"]
    return options


COHERE = Family("CohereForCausalLM", "CohereConfig", cohere_spec, cohere_layer, cohere_options)
