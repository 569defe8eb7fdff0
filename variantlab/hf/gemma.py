"""Gemma 2 and Gemma 3 (text), both ways: ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM``.

Llama-like, plus what makes Gemma Gemma: embeddings times sqrt(hidden_size), RMSNorm before
and after each sublayer (``sandwich``) with HF's ``(1 + weight)`` scale (imported as
``1 + weight``, the same float32 value), GeGLU, scores scaled by ``query_pre_attn_scalar^-0.5``,
logit soft-capping of the scores (Gemma 2) and of the output, per-head QK RMSNorm (Gemma 3),
and a per-layer layout of sliding-window and full attention (``layer_types``), each with its
own rotary base in Gemma 3. On export each layer is ``full_attention`` or, with a window,
``sliding_attention`` (one window for all); Gemma's RMSNorm scales by ``1 + weight``, so the
exported weights are our scales - 1. :data:`NORMS` names the four norms of a layer on both
sides.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_attention,
    check_common,
    head_dim_of,
    hf_activation,
    need,
    period,
    refuse,
    reject,
    rope,
    rope_scaling,
    token_ids,
)
from .llama import llama_hf_state, llama_kwargs, llama_spec, llama_state

FULL, SLIDING = "full_attention", "sliding_attention"
#: HF layer types and the names of our layer kinds
_KINDS = {SLIDING: "sliding", FULL: "full"}
#: our norm under ``trf_blocks.{i}`` -> the HF norm under ``model.layers.{i}``: before and
#: after each sublayer
NORMS = {"att.norm_in": "input_layernorm", "ff.norm_in": "pre_feedforward_layernorm",
         "att.norm_out": "post_attention_layernorm", "ff.norm_out": "post_feedforward_layernorm"}
NORMS_IN = (NORMS["att.norm_in"], NORMS["ff.norm_in"])


# --- import ---------------------------------------------------------------------------

def _rotary(cfg: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The rotary of one layer type's rope parameters, its scaling included (Gemma 3's
    full-attention layers: linear, factor 8, in the released 4B-27B configs)."""
    return {"kind": "rotary", "theta": float(params["rope_theta"]), "fraction": 1.0,
            **rope_scaling(cfg, params, "rope_parameters")}


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
    data = llama_spec(cfg, positional=_rotary(cfg, params["full_attention"] if per_type
                                              else params))
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
        sliding["positional"] = _rotary(cfg, params["sliding_attention"])
    kinds = {"sliding": sliding, "full": {}}
    data["layout"] = {"kinds": kinds, "pattern": [_KINDS[t] for t in period(layer_types)]}
    return data


def gemma_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a Gemma model: HF's RMSNorm weights ``w`` become scales ``1 + w``."""
    sd, cfg = hf.state_dict(), hf.config
    out = llama_state(hf, norms=NORMS_IN)
    renamed = {}
    for key, value in out.items():
        key = key.replace(".att.norm.", ".att.norm_in.").replace(".ff.norm.", ".ff.norm_in.")
        renamed[key] = value
    for i in range(cfg.num_hidden_layers):
        theirs = f"model.layers.{i}"
        for mine in ("att.norm_out", "ff.norm_out"):
            renamed[f"trf_blocks.{i}.{mine}.scale"] = sd[f"{theirs}.{NORMS[mine]}.weight"]
        for name in ("q_norm", "k_norm"):
            if f"{theirs}.self_attn.{name}.weight" in sd:
                renamed[f"trf_blocks.{i}.att.sublayer.{name}.scale"] = \
                    sd[f"{theirs}.self_attn.{name}.weight"]
    return {k: 1.0 + v.float() if k.endswith(".scale") else v for k, v in renamed.items()}


# --- export ---------------------------------------------------------------------------

def _layer_types(spec: Spec, cls: str) -> tuple[list[str], int | None, dict[str, Any]]:
    """Each layer's HF type, the sliding window, and the rotary per type; refuses a layer
    that differs from the model in anything but its window and (Gemma 3) rotary."""
    base = spec.attention.model_copy(update={"window": None})
    types: list[str] = []
    windows: set[int] = set()
    rotaries: dict[str, Any] = {}
    for i in range(spec.n_layers):
        layer = spec.layer_spec(i)
        loc = "layout" if spec.layout is not None else "attention"
        for slot, comp in layer.components().items():
            if slot not in ("attention", "positional") and comp != getattr(spec, slot):
                refuse(f"{loc}.{slot}", cls, f"layer {i}'s {slot} differs from the model's; "
                       "Gemma layers differ only in their window and rotary")
        need(spec, cls, loc, layer.attention.model_copy(update={"window": None}) == base,
             f"layer {i}'s attention differs from the model's in more than its window")
        kind = SLIDING if layer.attention.window else FULL
        if layer.attention.window:
            windows.add(layer.attention.window)
        need(spec, cls, f"{loc}.positional", layer.positional.kind == "rotary" and
             layer.positional.fraction == 1.0, f"layer {i}: Gemma rotates every head dim")
        need(spec, cls, f"{loc}.positional", rotaries.setdefault(kind, layer.positional)
             == layer.positional, f"layer {i}: the {kind} layers of Gemma share one rotary "
             "(base and scaling)")
        types.append(kind)
    need(spec, cls, f"{loc}.attention.window", len(windows) <= 1,
         f"windows {sorted(windows)}: Gemma's sliding layers share one sliding_window")
    return types, (windows.pop() if windows else None), rotaries


def gemma_config(spec: Spec, cls: str) -> Any:
    import transformers

    check_common(spec.model_copy(update={"layout": None, "scale_embeddings": False,
                                         "logit_softcap": None}), cls, norm="rms", rotary=True)
    gemma3 = cls == "Gemma3ForCausalLM"
    check_attention(spec, cls, gqa=True, head_dim_free=True, qk_norm="head" if gemma3 else None,
                    gemma=True)
    att = spec.attention
    need(spec, cls, "attention.softcap", not (gemma3 and att.softcap),
         "Gemma 3 has QK-norm but does not apply attn_logit_softcapping; Gemma 2 applies "
         "it but has no QK-norm")
    need(spec, cls, "residual.kind", spec.residual.kind == "sandwich",
         f"residual {spec.residual.kind!r}: Gemma is sandwich (a norm before and after)")
    need(spec, cls, "scale_embeddings", spec.scale_embeddings,
         "Gemma multiplies the embeddings by sqrt(hidden_size); set scale_embeddings: true")
    need(spec, cls, "feedforward.bias", not spec.feedforward.bias,
         "Gemma has no feed-forward biases")
    types, window, rotaries = _layer_types(spec, cls)
    if not gemma3:
        need(spec, cls, "layout.positional", len(set(map(repr, rotaries.values()))) == 1,
             "Gemma 2 has one rotary; a base (and scaling) per layer type is Gemma 3's")
    scale = att.scale if att.scale is not None else (att.head_dim or
                                                     spec.emb_dim // spec.n_heads) ** -0.5
    scalar = round(scale ** -2)
    need(spec, cls, "attention.scale", abs(scalar ** -0.5 - scale) <= 1e-6 * scale,
         f"scale={scale}: Gemma's query_pre_attn_scalar is an integer n, scale n^-0.5")
    full_pos = rotaries.get(FULL, rotaries.get(SLIDING))
    full = rope(full_pos, False, spec.context_length, cls)
    if gemma3:
        local = rope(rotaries.get(SLIDING, full_pos), False, spec.context_length, cls)
        params: dict[str, Any] = {"full_attention": full, "sliding_attention": local}
        config_cls: Any = transformers.Gemma3TextConfig
    else:
        params, config_cls = full, transformers.Gemma2Config
    return config_cls(
        **token_ids(spec, config_cls),
        **llama_kwargs(spec, cls), hidden_activation=hf_activation(spec, cls),
        rope_parameters=params, query_pre_attn_scalar=scalar, layer_types=types,
        sliding_window=window or spec.context_length,
        final_logit_softcapping=spec.logit_softcap, attn_logit_softcapping=att.softcap)


def gemma_hf_state(spec: Spec, sd: dict[str, torch.Tensor], cls: str
                   ) -> dict[str, torch.Tensor]:
    out = llama_hf_state(spec, sd, cls, norms=NORMS_IN, norm_names=("norm_in", "norm_in"))
    for i in range(spec.n_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        for mine in ("att.norm_out", "ff.norm_out"):
            out[f"{theirs}.{NORMS[mine]}.weight"] = sd[f"{ours}.{mine}.scale"]
    # Gemma's RMSNorm multiplies by (1 + weight)
    return {k: v - 1.0 if "norm" in k else v for k, v in out.items()}
