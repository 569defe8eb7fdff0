"""``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` from a spec with sandwich residuals,
RMSNorm, a gated feed-forward, scaled embeddings and rotary positions: the inverse of
:mod:`variantlab.hfimport.gemma`. Each layer is ``full_attention`` or, with a window,
``sliding_attention`` (one window for all); Gemma 3 keeps a rotary base per layer type and
per-head QK RMSNorm; Gemma's RMSNorm scales by ``1 + weight``, so weights are scales - 1."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    hf_activation,
    need,
    refuse,
    rope,
    token_ids,
)
from .llama import llama_kwargs, llama_state

FULL, SLIDING = "full_attention", "sliding_attention"


def _layer_types(spec: Spec, cls: str) -> tuple[list[str], int | None, dict[str, float]]:
    """Each layer's HF type, the sliding window, and the rotary base per type; refuses a
    layer that differs from the model in anything but its window and (Gemma 3) rotary base."""
    base = spec.attention.model_copy(update={"window": None})
    types: list[str] = []
    windows: set[int] = set()
    thetas: dict[str, float] = {}
    for i in range(spec.n_layers):
        layer = spec.layer_spec(i)
        loc = "layout" if spec.layout is not None else "attention"
        for slot, comp in layer.components().items():
            if slot not in ("attention", "positional") and comp != getattr(spec, slot):
                refuse(f"{loc}.{slot}", cls, f"layer {i}'s {slot} differs from the model's; "
                       "Gemma layers differ only in their window and rotary base")
        need(spec, cls, loc, layer.attention.model_copy(update={"window": None}) == base,
             f"layer {i}'s attention differs from the model's in more than its window")
        kind = SLIDING if layer.attention.window else FULL
        if layer.attention.window:
            windows.add(layer.attention.window)
        need(spec, cls, f"{loc}.positional", layer.positional.kind == "rotary" and
             layer.positional.fraction == 1.0, f"layer {i}: Gemma rotates every head dim")
        theta = float(layer.positional.theta)
        need(spec, cls, f"{loc}.positional", thetas.setdefault(kind, theta) == theta,
             f"layer {i}: the {kind} layers of Gemma share one rotary base")
        types.append(kind)
    need(spec, cls, f"{loc}.attention.window", len(windows) <= 1,
         f"windows {sorted(windows)}: Gemma's sliding layers share one sliding_window")
    return types, (windows.pop() if windows else None), thetas


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
    types, window, thetas = _layer_types(spec, cls)
    if not gemma3:
        need(spec, cls, "layout.positional", len(set(thetas.values())) == 1,
             "Gemma 2 has one rotary base; a base per layer type is Gemma 3's")
    scale = att.scale if att.scale is not None else (att.head_dim or
                                                     spec.emb_dim // spec.n_heads) ** -0.5
    scalar = round(scale ** -2)
    need(spec, cls, "attention.scale", abs(scalar ** -0.5 - scale) <= 1e-6 * scale,
         f"scale={scale}: Gemma's query_pre_attn_scalar is an integer n, scale n^-0.5")
    theta = thetas.get(FULL, thetas.get(SLIDING))
    full = rope(spec.positional.model_copy(update={"theta": theta}))
    if gemma3:
        local = rope(spec.positional.model_copy(update={"theta": thetas.get(SLIDING, theta)}))
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


def gemma_state(spec: Spec, sd: dict[str, torch.Tensor], cls: str
                ) -> dict[str, torch.Tensor]:
    out = llama_state(spec, sd, cls, norms=("input_layernorm", "pre_feedforward_layernorm"),
                      norm_names=("norm_in", "norm_in"))
    for i in range(spec.n_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{theirs}.post_attention_layernorm.weight"] = sd[f"{ours}.att.norm_out.scale"]
        out[f"{theirs}.post_feedforward_layernorm.weight"] = sd[f"{ours}.ff.norm_out.scale"]
    # Gemma's RMSNorm multiplies by (1 + weight)
    return {k: v - 1.0 if "norm" in k else v for k, v in out.items()}
