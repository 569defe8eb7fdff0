"""GLM-4-MoE (GLM-4.5, GLM-4.6), both ways: ``Glm4MoeForCausalLM`` (GLM Team 2025, "GLM-4.5:
agentic, reasoning, and coding (ARC) foundation models").

A pre-norm Llama decoder with q/k/v biases (``attention_bias``; o_proj has none), rotary over
the first ``partial_rotary_factor`` of each head (rotate-half pairs, unlike GLM-4), an
optional per-head QK RMSNorm (``use_qk_norm``), and from layer ``first_k_dense_replace`` on
DeepSeek-V3's experts (``router: sigmoid_topk``, the choice bias e_score_correction_bias →
``expert_bias``, ``n_group`` / ``topk_group``, ``routed_scaling_factor``, ``norm_topk_prob``,
``n_shared_experts`` ungated shared experts); the first layers a SwiGLU of width
``intermediate_size`` (the layer kind ``dense``). On export a pre-norm ``mha`` spec with
experts routed by ``sigmoid_topk`` goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, reject
from .decoder import Family, Layer, decoder_spec, llama_options
from .deepseek import deepseek_moe


def glm4moe_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Glm4MoeConfig``."""
    if cfg.n_routed_experts % (cfg.n_group or 1):
        reject("n_group", cfg.n_group, "the experts must split into equal groups")
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps, qkv_bias=cfg.attention_bias, partial=True)
    if cfg.use_qk_norm:
        data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
        data["attention"]["qk_norm_scope"] = "head"
    first_dense = int(cfg.first_k_dense_replace or 0)
    if first_dense < cfg.num_hidden_layers:
        dense, data["feedforward"] = data["feedforward"], deepseek_moe(cfg, v3=True)
        if first_dense:
            data["layout"] = {"kinds": {"dense": {"feedforward": dense}},
                              "layers": dict.fromkeys(range(first_dense), "dense")}
    return data


def glm4moe_layer(cfg: Any) -> Layer:
    first_dense = int(cfg.first_k_dense_replace or 0)
    return Layer(qkv_bias=bool(cfg.attention_bias),
                 qk_norms=("q_norm", "k_norm") if cfg.use_qk_norm else None,
                 sparse=tuple(i >= first_dense for i in range(cfg.num_hidden_layers)),
                 choice_bias="gate.e_score_correction_bias",
                 shared_experts=bool(cfg.n_shared_experts),
                 empty_shared=0 if cfg.n_shared_experts else cfg.hidden_size)


def glm4moe_options(spec: Spec) -> dict[str, Any]:
    ffs = [spec.layer_spec(i).feedforward for i in range(spec.n_layers)]
    first = next((i for i, ff in enumerate(ffs) if ff.kind == "moe"), len(ffs))
    moe = ffs[first] if first < len(ffs) else None
    dense = ffs[0] if first else None
    shared = moe.n_shared_experts if moe is not None else 0
    expert = moe.expert.hidden(spec.emb_dim) if moe is not None else 1
    options = llama_options(
        spec.model_copy(update={"feedforward": dense or spec.feedforward.expert}),
        attention_bias=spec.qkv_bias, use_qk_norm=spec.attention.qk_norm is not None,
        first_k_dense_replace=first, moe_intermediate_size=expert,
        n_routed_experts=moe.n_experts if moe is not None else 1,
        num_experts_per_tok=moe.top_k if moe is not None else 1,
        n_shared_experts=shared, norm_topk_prob=bool(moe is None or moe.renormalize),
        routed_scaling_factor=moe.routed_scaling_factor if moe is not None else 1.0,
        n_group=(moe.n_group or 1) if moe is not None else 1,
        topk_group=(moe.topk_group or 1) if moe is not None else 1)
    options["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    return options


GLM4MOE = Family("Glm4MoeForCausalLM", "Glm4MoeConfig", glm4moe_spec, glm4moe_layer,
                 glm4moe_options)
