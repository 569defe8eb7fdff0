"""Gemma 2 and Gemma 3 (text): ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM``.

Llama-like, plus what makes Gemma Gemma: embeddings times sqrt(hidden_size), RMSNorm before
and after each sublayer (``sandwich``) with HF's ``(1 + weight)`` scale (imported as
``1 + weight``, the same float32 value), GeGLU, scores scaled by ``query_pre_attn_scalar^-0.5``,
logit soft-capping of the scores (Gemma 2) and of the output, per-head QK RMSNorm (Gemma 3),
and a per-layer layout of sliding-window and full attention (``layer_types``), each with its
own rotary base in Gemma 3.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import activation, head_dim_of, reject
from .llama import llama_spec, llama_state

#: HF layer types and the names of our layer kinds
_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def _period(items: list[str]) -> list[str]:
    """The shortest prefix that repeated gives ``items``."""
    for p in range(1, len(items) + 1):
        if all(items[i] == items[i % p] for i in range(len(items))):
            return items[:p]
    return items  # pragma: no cover (p = len(items) always matches)


def _rotary(params: dict[str, Any], name: str) -> dict[str, Any]:
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        reject(name, params, f"rope_type {rope_type!r} (scaled rotary) is not supported")
    return {"kind": "rotary", "theta": float(params["rope_theta"]), "fraction": 1.0}


def gemma_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Gemma2Config`` or ``Gemma3TextConfig``."""
    if getattr(cfg, "use_bidirectional_attention", False):
        reject("use_bidirectional_attention", True, "Gemma's bidirectional variant is not "
               "a causal LM")
    layer_types = list(cfg.layer_types)
    unknown = sorted(set(layer_types) - set(_KINDS))
    if unknown:
        reject("layer_types", unknown, f"supported layer types: {', '.join(_KINDS)}")
    params = cfg.rope_parameters
    per_type = isinstance(params.get("full_attention"), dict)  # Gemma 3: a base per layer type
    data = llama_spec(cfg, positional=_rotary(params["full_attention"] if per_type else params,
                                              "rope_parameters"))
    data.update({
        "norm": {"kind": "rms", "eps": cfg.rms_norm_eps},
        "residual": {"kind": "sandwich"},
        "activation": activation("hidden_activation", cfg.hidden_activation),
        "scale_embeddings": True,
    })
    if getattr(cfg, "final_logit_softcapping", None) is not None:
        data["logit_softcap"] = float(cfg.final_logit_softcapping)
    attention = data["attention"]
    attention["head_dim"] = head_dim_of(cfg)
    attention["scale"] = float(cfg.query_pre_attn_scalar) ** -0.5
    # Gemma 3's attention reads attn_logit_softcapping but never applies it: neither do we
    if cfg.model_type != "gemma3_text" and getattr(cfg, "attn_logit_softcapping", None):
        attention["softcap"] = float(cfg.attn_logit_softcapping)
    if cfg.model_type == "gemma3_text":
        attention["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
        attention["qk_norm_scope"] = "head"
    sliding = {"attention": {**attention, "window": int(cfg.sliding_window)}}
    if per_type:
        sliding["positional"] = _rotary(params["sliding_attention"], "rope_parameters")
    kinds = {"sliding": sliding, "full": {}}
    data["layout"] = {"kinds": kinds, "pattern": [_KINDS[t] for t in _period(layer_types)]}
    return data


def gemma_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a Gemma model: HF's RMSNorm weights ``w`` become scales ``1 + w``."""
    sd, cfg = hf.state_dict(), hf.config
    out = llama_state(hf, norms=("input_layernorm", "pre_feedforward_layernorm"))
    renamed = {}
    for key, value in out.items():
        key = key.replace(".att.norm.", ".att.norm_in.").replace(".ff.norm.", ".ff.norm_in.")
        renamed[key] = value
    for i in range(cfg.num_hidden_layers):
        theirs = f"model.layers.{i}"
        renamed[f"trf_blocks.{i}.att.norm_out.scale"] = sd[f"{theirs}.post_attention_layernorm.weight"]
        renamed[f"trf_blocks.{i}.ff.norm_out.scale"] = sd[f"{theirs}.post_feedforward_layernorm.weight"]
        for name in ("q_norm", "k_norm"):
            if f"{theirs}.self_attn.{name}.weight" in sd:
                renamed[f"trf_blocks.{i}.att.sublayer.{name}.scale"] = \
                    sd[f"{theirs}.self_attn.{name}.weight"]
    return {k: 1.0 + v.float() if k.endswith(".scale") else v for k, v in renamed.items()}
