"""Granite-MoE (3.x MoE), both ways: ``GraniteMoeForCausalLM`` (IBM 2024, "Granite 3.0
language models").

Granite (its four multipliers as spec options, see :mod:`variantlab.hf.granite`) whose
feed-forward is a mixture of experts on every layer: the router's top
``num_experts_per_tok`` logits soft-maxed (``router: topk_softmax``), SwiGLU experts of
width ``intermediate_size`` stored fused as in Mixtral (block_sparse_moe.router →
``gate``). On export a pre-norm spec whose experts are routed by ``topk_softmax`` without
shared experts or biases goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer
from .granite import granite_options, granite_spec


def granitemoe_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GraniteMoeConfig``."""
    data = granite_spec(cfg)
    coef = float(cfg.router_aux_loss_coef) if cfg.output_router_logits else 0.0
    data["feedforward"] = {
        "kind": "moe", "n_experts": int(cfg.num_local_experts),
        "top_k": int(cfg.num_experts_per_tok), "router": "topk_softmax",
        "expert": {"kind": "glu", "hidden_dim": int(cfg.intermediate_size)},
        "aux_loss_coef": coef}
    return data


def granitemoe_layer(cfg: Any) -> Layer:
    bias = bool(cfg.attention_bias)
    return Layer(qkv_bias=bias, out_bias=bias, mlp="block_sparse_moe", router="router",
                 sparse=(True,) * cfg.num_hidden_layers)


def granitemoe_options(spec: Spec) -> dict[str, Any]:
    ff = spec.feedforward
    dense = spec.model_copy(update={"feedforward": ff.expert})
    options = granite_options(dense)
    options.pop("mlp_bias")
    options.update(num_local_experts=ff.n_experts, num_experts_per_tok=ff.top_k,
                   intermediate_size=ff.expert.hidden(spec.emb_dim),
                   output_router_logits=ff.aux_loss_coef > 0,
                   router_aux_loss_coef=ff.aux_loss_coef or 0.001)
    return options


GRANITEMOE = Family("GraniteMoeForCausalLM", "GraniteMoeConfig", granitemoe_spec,
                    granitemoe_layer, granitemoe_options)
