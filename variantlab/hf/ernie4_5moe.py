"""ERNIE 4.5 MoE, import: ``Ernie4_5_MoeForCausalLM`` (Baidu 2025, "ERNIE 4.5 technical
report").

ERNIE 4.5 (:mod:`variantlab.hf.ernie4_5`: interleaved rotary pairs reordered, ``use_bias``)
whose layers from ``moe_layer_start_index`` to ``moe_layer_end_index``, every
``moe_layer_interval``-th, are a mixture of experts: a softmax over ``moe_num_experts``
router logits, the top ``moe_k`` chosen by probability plus the frozen choice bias
(gate.moe_statics.e_score_correction_bias, (1, E) → ``expert_bias``, ``choice_bias: true``),
their probabilities renormalised, SwiGLU experts of width ``moe_intermediate_size`` (fused
as in Mixtral) and ``moe_num_shared_experts`` ungated shared experts; the other layers a
SwiGLU of width ``intermediate_size`` (layer kinds ``moe`` and ``dense``). Refused:
``use_bias`` with shared experts (their biases and the bias-free experts are not one
``moe`` option). Import only: the choice bias is a frozen parameter there, a buffer here.
"""

from __future__ import annotations

from typing import Any

from .common import head_dim_of, period, reject
from .decoder import Family, Layer, decoder_spec


def _sparse(cfg: Any) -> list[bool]:
    end = cfg.moe_layer_end_index
    end = cfg.num_hidden_layers - 1 if end is None or end < 0 else end
    return [(i + 1) % cfg.moe_layer_interval == 0 and cfg.moe_layer_start_index <= i <= end
            for i in range(cfg.num_hidden_layers)]


def ernie4_5moe_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``Ernie4_5_MoeConfig``."""
    bias = bool(cfg.use_bias)
    if bias and cfg.moe_num_shared_experts:
        reject("use_bias", True, "ERNIE's shared experts then have biases and its routed "
               "experts none; variantlab's moe biases both or neither")
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=bias, out_bias=bias, ffn_bias=bias)
    shared = int(cfg.moe_num_shared_experts or 0)
    moe: dict[str, Any] = {
        "kind": "moe", "n_experts": int(cfg.moe_num_experts), "top_k": int(cfg.moe_k),
        "expert": {"kind": "glu", "hidden_dim": int(cfg.moe_intermediate_size)},
        "router": "softmax_topk", "renormalize": True, "choice_bias": True,
        "aux_loss_coef": float(cfg.router_aux_loss_coef) if cfg.output_router_logits else 0.0}
    if shared:
        moe.update(n_shared_experts=shared,
                   shared_hidden_dim=int(cfg.moe_intermediate_size) * shared)
    sparse = _sparse(cfg)
    if any(sparse):
        dense, data["feedforward"] = data["feedforward"], moe
        if not all(sparse):
            kinds = ["moe" if s else "dense" for s in sparse]
            data["layout"] = {"kinds": {"moe": {}, "dense": {"feedforward": dense}},
                              "pattern": period(kinds)}
    return data


def ernie4_5moe_layer(cfg: Any) -> Layer:
    bias, head_dim = bool(cfg.use_bias), head_dim_of(cfg)
    return Layer(qkv_bias=bias, out_bias=bias, ffn_bias=bias, rotary_dims=head_dim,
                 head_dim=head_dim, sparse=tuple(_sparse(cfg)),
                 choice_bias="gate.moe_statics.e_score_correction_bias", choice_bias_row=True,
                 shared_experts=bool(cfg.moe_num_shared_experts))


ERNIE4_5MOE = Family("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", ernie4_5moe_spec,
                     ernie4_5moe_layer)
