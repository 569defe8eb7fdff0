"""Llama 4 text: ``Llama4ForCausalLM`` with a ``Llama4TextConfig`` (Meta 2025, Llama 4 model
card, "iRoPE").

A Llama-like pre-norm decoder (RMSNorm, grouped-query attention, SwiGLU) with three per-layer
choices, each a layer kind of a ``layout`` (the shortest repeating ``pattern``):

- rotary layers (``no_rope_layers`` 1) attend within chunks of ``attention_chunk_size``
  positions (``attention.chunk``) with the parameter-free QK "L2 norm" (``qk_norm: {kind:
  l2}``) when ``use_qk_norm``; NoPE layers (0) attend to the whole sequence with neither
  (``positional: none``);
- MoE layers (``moe_layers``) hold ``feedforward: moe`` with ``router: sigmoid_topk`` (the
  top-k router logits through a sigmoid, not renormalised), ``scale_input`` (a chosen expert
  reads weight * x), and one ungated shared SwiGLU expert of ``intermediate_size``; the other
  layers a SwiGLU of ``intermediate_size_mlp`` (kinds ending in ``_dense``).

Llama 4's rotary pairs are interleaved (complex form): the query and key rows of each head
are reordered on import (even dims, then odd ones), which leaves every score unchanged and
makes the rotate-half rotary equal; the L2 norm has no parameters, so taking it before
rotary (as variantlab does) equals Hugging Face's after.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import ends_state, linear, period, reject
from .deepseek import deinterleave
from .llama import llama_spec

_GLU = {"W_gate": "gate_proj", "W_up": "up_proj", "W_down": "down_proj"}


def llama4_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Llama4TextConfig``."""
    if cfg.attn_temperature_tuning:
        reject("attn_temperature_tuning", True, "the NoPE layers' position-dependent query "
               "scaling is not in variantlab's attention; set it false")
    unknown = sorted(set(cfg.layer_types) - {"chunked_attention", "full_attention"})
    if unknown:
        reject("layer_types", unknown, "supported: chunked_attention, full_attention")
    data = llama_spec(cfg)
    dense = {"kind": "glu", "hidden_dim": int(cfg.intermediate_size_mlp)}
    moe = {"kind": "moe", "n_experts": int(cfg.num_local_experts),
           "top_k": int(cfg.num_experts_per_tok), "router": "sigmoid_topk",
           "renormalize": False, "scale_input": True,
           "expert": {"kind": "glu", "hidden_dim": int(cfg.intermediate_size)},
           "n_shared_experts": 1, "shared_hidden_dim": int(cfg.intermediate_size)}
    sparse = [i in set(cfg.moe_layers) for i in range(cfg.num_hidden_layers)]
    data["feedforward"] = moe if any(sparse) else dense
    plain = data["attention"]
    names: list[str] = []
    layers: dict[str, dict[str, Any]] = {}
    for i, (rope, kind) in enumerate(zip(cfg.no_rope_layers, cfg.layer_types)):
        attention = dict(plain)
        if rope and cfg.use_qk_norm:
            attention["qk_norm"] = {"kind": "l2", "eps": cfg.rms_norm_eps}
        if kind == "chunked_attention":
            attention["chunk"] = int(cfg.attention_chunk_size)
        name = ("rope" if rope else "nope") + ("" if sparse[i] or not any(sparse) else "_dense")
        slots: dict[str, Any] = {"attention": attention}
        if not rope:
            slots["positional"] = {"kind": "none"}
        if name.endswith("_dense"):
            slots["feedforward"] = dense
        names.append(name)
        layers[name] = slots
    data["attention"] = layers[names[0]]["attention"]  # the model's own: layer 0's
    kinds = {name: {slot: comp for slot, comp in slots.items()
                    if not (slot == "attention" and comp == data["attention"])}
             for name, slots in layers.items()}
    if any(kinds.values()):
        data["layout"] = {"kinds": kinds, "pattern": period(names)}
    return data


def llama4_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``Llama4ForCausalLM`` (text)."""
    sd, cfg = hf.state_dict(), hf.config
    bias, hd = bool(cfg.attention_bias), cfg.head_dim
    out = ends_state(sd)
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = sd[f"{theirs}.input_layernorm.weight"]
        out[f"{ours}.ff.norm.scale"] = sd[f"{theirs}.post_attention_layernorm.weight"]
        att, hf_att = f"{ours}.att.sublayer", f"{theirs}.self_attn"
        for mine, name in (("W_query", "q_proj"), ("W_key", "k_proj")):
            out[f"{att}.{mine}.weight"] = deinterleave(sd[f"{hf_att}.{name}.weight"], 0, hd, hd)
            if bias:
                out[f"{att}.{mine}.bias"] = deinterleave(sd[f"{hf_att}.{name}.bias"], 0, hd, hd)
        linear(out, f"{att}.W_value", sd, f"{hf_att}.v_proj", bias)
        linear(out, f"{att}.out_proj", sd, f"{hf_att}.o_proj", bias)
        ff, hf_ff = f"{ours}.ff.sublayer", f"{theirs}.feed_forward"
        if f"{hf_ff}.router.weight" not in sd:  # a dense layer
            for mine, name in _GLU.items():
                out[f"{ff}.{mine}.weight"] = sd[f"{hf_ff}.{name}.weight"]
            continue
        out[f"{ff}.gate.weight"] = sd[f"{hf_ff}.router.weight"]
        gate_up = sd[f"{hf_ff}.experts.gate_up_proj"].transpose(1, 2)  # (E, 2 hidden, D)
        hidden = gate_up.shape[1] // 2
        out[f"{ff}.W_gate"], out[f"{ff}.W_up"] = gate_up[:, :hidden], gate_up[:, hidden:]
        out[f"{ff}.W_down"] = sd[f"{hf_ff}.experts.down_proj"].transpose(1, 2)  # (E, D, hidden)
        for mine, name in _GLU.items():
            out[f"{ff}.shared_expert.{mine}.weight"] = sd[f"{hf_ff}.shared_expert.{name}.weight"]
    return {k: v.contiguous() for k, v in out.items()}
