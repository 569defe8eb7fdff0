"""OLMo (1), both ways: ``OlmoForCausalLM`` (Groeneveld et al. 2024, "OLMo: accelerating the
science of language models").

A Llama decoder whose norms are LayerNorms without any parameter (``norm: {kind: layer,
affine: false}``, eps 1e-5, fixed in transformers), attention biases with
``attention_bias``, and with ``clip_qkv`` the q, k and v projections clamped to [-c, c]
(``attention.clip_qkv``). On export a spec whose
LayerNorm has no parameters goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, llama_options

#: transformers' OlmoLayerNorm eps
EPS = 1e-5


def olmo_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``OlmoConfig``."""
    bias = bool(cfg.attention_bias)
    data = decoder_spec(cfg, eps=EPS, norm="layer", qkv_bias=bias, out_bias=bias)
    data["norm"]["affine"] = False
    if cfg.clip_qkv is not None:
        data["attention"]["clip_qkv"] = float(cfg.clip_qkv)
    return data


def olmo_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(qkv_bias=bias, out_bias=bias, affine=False)


def olmo_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, attention_bias=spec.qkv_bias or spec.attn_out_bias,
                            clip_qkv=spec.attention.clip_qkv)
    del options["rms_norm_eps"], options["head_dim"]
    return options


OLMO = Family("OlmoForCausalLM", "OlmoConfig", olmo_spec, olmo_layer, olmo_options)
