"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B), both ways: ``Qwen2MoeForCausalLM`` (Qwen Team
2024, "Qwen2 technical report").

A Llama decoder with q/k/v biases (``qkv_bias``; o_proj has none) whose feed-forward is a
mixture of experts (``feedforward: {kind: moe}``: softmax over ``num_experts`` router
logits, the top ``num_experts_per_tok`` as weights, renormalised when ``norm_topk_prob``;
SwiGLU experts of width ``moe_intermediate_size``, stored fused as in Mixtral) plus one
shared SwiGLU expert of width ``shared_expert_intermediate_size`` scaled by
sigmoid(shared_expert_gate(x)) (``n_shared_experts: 1, shared_gate: true``), and a dense
SwiGLU of width ``intermediate_size`` on the layers ``mlp_only_layers`` names or off the
``decoder_sparse_step`` (a layout of ``moe`` and ``dense`` layer kinds). Sliding windows
(``use_sliding_window``) are refused. On export a pre-norm RMSNorm spec whose experts have a
gated shared expert, without QK-norm, goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, reject
from .decoder import Family, Layer, decoder_spec, llama_options
from .moe import moe_feedforward, sparse_layers, with_dense_layers


def qwen2moe_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Qwen2MoeConfig``."""
    if cfg.use_sliding_window:
        reject("use_sliding_window", True, "Qwen2-MoE's per-layer sliding windows "
               "(max_window_layers) are not imported")
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=cfg.qkv_bias)
    moe = moe_feedforward(cfg, cfg.moe_intermediate_size, renormalize=cfg.norm_topk_prob,
                          shared_hidden=cfg.shared_expert_intermediate_size)
    return with_dense_layers(data, cfg, moe)


def qwen2moe_layer(cfg: Any) -> Layer:
    return Layer(qkv_bias=bool(cfg.qkv_bias), sparse=tuple(sparse_layers(cfg)),
                 shared_expert=True)


def qwen2moe_options(spec: Spec) -> dict[str, Any]:
    ffs = [spec.layer_spec(i).feedforward for i in range(spec.n_layers)]
    moes = [ff for ff in ffs if ff.kind == "moe"]
    dense = next((ff for ff in ffs if ff.kind != "moe"), None)
    moe = moes[0] if moes else spec.feedforward
    options = llama_options(
        spec, qkv_bias=spec.qkv_bias, num_experts=getattr(moe, "n_experts", 0) if moes else 0,
        num_experts_per_tok=getattr(moe, "top_k", 1),
        moe_intermediate_size=moe.expert.hidden(spec.emb_dim) if moes else 1,
        shared_expert_intermediate_size=getattr(moe, "shared_hidden_dim", None) or 1,
        norm_topk_prob=bool(getattr(moe, "renormalize", False)),
        output_router_logits=getattr(moe, "aux_loss_coef", 0.0) > 0,
        router_aux_loss_coef=getattr(moe, "aux_loss_coef", 0.0) or 0.001,
        mlp_only_layers=[i for i, ff in enumerate(ffs) if ff.kind != "moe"],
        intermediate_size=(dense.hidden_dim if dense is not None else None) or
        4 * spec.emb_dim)
    del options["head_dim"]
    return options


QWEN2MOE = Family("Qwen2MoeForCausalLM", "Qwen2MoeConfig", qwen2moe_spec, qwen2moe_layer,
                  qwen2moe_options)
