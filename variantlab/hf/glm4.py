"""GLM-4, both ways: ``Glm4ForCausalLM`` (GLM Team 2024, "ChatGLM: a family of large
language models from GLM-130B to GLM-4 all tools").

A Llama decoder with an RMSNorm before and after each sublayer (``residual: sandwich``:
input_layernorm / post_self_attn_layernorm around the attention, post_attention_layernorm /
post_mlp_layernorm around the feed-forward), biases on q/k/v only (``attention_bias``), one
fused gate_up_proj (gate rows first) and rotary over the first ``partial_rotary_factor`` of
each head (0.5 by default) in interleaved pairs, which become rotate-half pairs by
reordering the rotary rows of q_proj and k_proj (even dims, then odd ones). On export a
``sandwich`` spec without ``scale_embeddings`` (that is Gemma 2/3) goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, head_dim_of, rope_params
from .decoder import Family, Layer, decoder_spec, llama_options


def glm4_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Glm4Config``."""
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=cfg.attention_bias, partial=True)
    data["residual"] = {"kind": "sandwich"}
    return data


def glm4_layer(cfg: Any) -> Layer:
    head_dim = head_dim_of(cfg)
    fraction = float(rope_params(cfg).get("partial_rotary_factor", 1.0) or 1.0)
    return Layer(residual="sandwich", out_norms=("post_self_attn_layernorm", "post_mlp_layernorm"),
                 qkv_bias=bool(cfg.attention_bias), gate_up="gate_up_proj",
                 ffn={"W_down": "down_proj"}, rotary_dims=int(head_dim * fraction),
                 head_dim=head_dim)


def glm4_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, attention_bias=spec.qkv_bias)
    options["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    return options


GLM4 = Family("Glm4ForCausalLM", "Glm4Config", glm4_spec, glm4_layer, glm4_options)
