"""Qwen3-Next: ``Qwen3NextForCausalLM``.

A hybrid (Qwen team 2025): most layers are Gated DeltaNet mixers (``attention:
gated_deltanet`` in the layer kind ``linear``), every ``full_attention_interval``-th layer is
gated attention (``mha`` with ``output_gate: elementwise``, per-head QK RMSNorm, partial
rotary), each followed by a mixture of experts (``feedforward: moe``: softmax then top-k,
renormalised when ``norm_topk_prob``, plus one shared SwiGLU expert scaled by
``sigmoid(shared_expert_gate(x))``) or, on layers in ``mlp_only_layers``, off the
``decoder_sparse_step`` or with ``num_experts: 0``, a dense SwiGLU (layer kinds ``linear_dense``
and ``full_dense`` when both occur). RMSNorms scale by ``(1 + weight)`` (imported as the
scale ``1 + weight``), except the Gated DeltaNet's output norm (a plain weight).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import linear, reject, rms_decoder, rotary
from .llama import ATTENTION, MLP, QK_NORMS
from .moe import experts_state, hybrid_layout, moe_feedforward, sparse_layers

_KINDS = {"linear_attention": "linear", "full_attention": "full"}


def qwen3next_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Qwen3NextConfig``."""
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - set(_KINDS))
    if unknown:
        reject("layer_types", unknown, f"supported layer types: {', '.join(_KINDS)}")
    bias = bool(cfg.attention_bias)
    data = {
        **rms_decoder(cfg, bias),
        "feedforward": {"kind": "glu", "hidden_dim": cfg.intermediate_size},
        "attention": {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads,
                      "head_dim": cfg.head_dim, "output_gate": "elementwise",
                      "qk_norm": {"kind": "rms", "eps": cfg.rms_norm_eps},
                      "qk_norm_scope": "head"},
        "positional": rotary(cfg, partial=True, head_dim=cfg.head_dim),
    }
    gdn = {"kind": "gated_deltanet", "n_k_heads": cfg.linear_num_key_heads,
           "n_v_heads": cfg.linear_num_value_heads, "head_k_dim": cfg.linear_key_head_dim,
           "head_v_dim": cfg.linear_value_head_dim,
           "conv_width": cfg.linear_conv_kernel_dim, "norm_eps": cfg.rms_norm_eps}
    sparse = sparse_layers(cfg)
    dense = data["feedforward"]
    if any(sparse):  # the model's feed-forward is the MoE; dense layers override it
        data["feedforward"] = moe_feedforward(cfg, cfg.moe_intermediate_size,
                                              cfg.norm_topk_prob,
                                              cfg.shared_expert_intermediate_size)
    layout = hybrid_layout([_KINDS[t] for t in types], {"linear": {"attention": gdn}},
                           sparse, dense)
    if layout is not None:
        data["layout"] = layout
    return data


def qwen3next_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``Qwen3NextForCausalLM``; (1 + w) norms become scales 1 + w."""
    sd, cfg = hf.state_dict(), hf.config
    one = lambda w: 1.0 + w.float()  # noqa: E731
    out = {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
           "final_norm.scale": one(sd["model.norm.weight"]), "out_head.weight": sd["lm_head.weight"]}
    heads, hd, bias = cfg.num_attention_heads, cfg.head_dim, bool(cfg.attention_bias)
    for i, kind in enumerate(cfg.layer_types):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = one(sd[f"{theirs}.input_layernorm.weight"])
        out[f"{ours}.ff.norm.scale"] = one(sd[f"{theirs}.post_attention_layernorm.weight"])
        if f"{theirs}.mlp.gate.weight" in sd:  # a mixture-of-experts layer
            experts_state(out, f"{ours}.ff.sublayer", sd, f"{theirs}.mlp")
        else:
            for mine, name in MLP.items():
                linear(out, f"{ours}.ff.sublayer.{mine}", sd, f"{theirs}.mlp.{name}", False)
        att = f"{ours}.att.sublayer"
        if kind == "linear_attention":
            prefix = f"{theirs}.linear_attn."
            out.update({f"{att}.{k[len(prefix):]}": v for k, v in sd.items() if k.startswith(prefix)})
            continue
        q = sd[f"{theirs}.self_attn.q_proj.weight"].view(heads, 2, hd, -1)  # (H, [q, gate], hd, D)
        out[f"{att}.W_query.weight"] = q[:, 0].reshape(heads * hd, -1)
        out[f"{att}.W_gate.weight"] = q[:, 1].reshape(heads * hd, -1)
        if bias:
            qb = sd[f"{theirs}.self_attn.q_proj.bias"].view(heads, 2, hd)
            out[f"{att}.W_query.bias"] = qb[:, 0].reshape(-1)
            out[f"{att}.W_gate.bias"] = qb[:, 1].reshape(-1)
        for mine, name in ATTENTION.items():
            if mine != "W_query":  # the query was split from its gate above
                linear(out, f"{att}.{mine}", sd, f"{theirs}.self_attn.{name}", bias)
        for name in QK_NORMS:
            out[f"{att}.{name}.scale"] = one(sd[f"{theirs}.self_attn.{name}.weight"])
    return out
