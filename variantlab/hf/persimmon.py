"""Persimmon, both ways: ``PersimmonForCausalLM`` (Adept 2023, "Releasing Persimmon-8B").

A pre-norm decoder with LayerNorm (with shift, ``layer_norm_eps``), one fused
query_key_value Linear whose output rows are laid out per head as (q_h, k_h, v_h) (as
GPT-NeoX; split into ``W_query/W_key/W_value``), LayerNorms on queries and keys shared across
heads (``qk_layernorm``: ``qk_norm: {kind: layer}``, scope ``head``), rotary over the first
``partial_rotary_factor`` of each head, a plain MLP (dense_h_to_4h, ReLU², dense_4h_to_h)
and every Linear biased. ``hidden_dropout`` > 0 is refused (Persimmon drops the feed-forward
branch only). On export a pre-norm LayerNorm ``mlp`` spec with a LayerNorm QK-norm per head
goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, head_dim_of, reject
from .decoder import Family, Layer, decoder_spec, llama_options


def persimmon_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``PersimmonConfig``."""
    if cfg.hidden_dropout:
        reject("hidden_dropout", cfg.hidden_dropout, "Persimmon drops the feed-forward branch "
               "only; variantlab's resid_drop_rate drops both branches")
    data = decoder_spec(cfg, eps=cfg.layer_norm_eps, norm="layer", norm_bias=True,
                        qkv_bias=True, out_bias=True, ffn="mlp", ffn_bias=True, partial=True)
    data["attention"]["n_kv_heads"] = cfg.num_attention_heads  # no grouped-query heads
    if cfg.qk_layernorm:
        data["attention"]["qk_norm"] = {"kind": "layer", "eps": float(cfg.layer_norm_eps)}
        data["attention"]["qk_norm_scope"] = "head"
    return data


def persimmon_layer(cfg: Any) -> Layer:
    return Layer(fused_qkv="query_key_value", projections={"out_proj": "dense"},
                 qkv_bias=True, out_bias=True,
                 ffn={"layers.0": "dense_h_to_4h", "layers.2": "dense_4h_to_h"},
                 ffn_bias=True, norm_shift=True, final_norm="final_layernorm",
                 head_dim=head_dim_of(cfg),
                 qk_norms=("q_layernorm", "k_layernorm") if cfg.qk_layernorm else None)


def persimmon_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, layer_norm_eps=spec.norm.eps,
                            qk_layernorm=spec.attention.qk_norm is not None)
    options["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    for key in ("rms_norm_eps", "head_dim", "num_key_value_heads"):
        del options[key]
    return options


PERSIMMON = Family("PersimmonForCausalLM", "PersimmonConfig", persimmon_spec, persimmon_layer,
                   persimmon_options)
