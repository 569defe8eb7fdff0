"""gpt-oss: ``GptOssForCausalLM`` (OpenAI 2025, gpt-oss-120b & gpt-oss-20b model card).

A Llama-like pre-norm decoder (RMSNorm, grouped-query attention with biases, rotary) whose
attention has sinks (``attention.sinks``: a learned logit per head in the softmax, with no
value), alternating sliding-window and full layers (``layer_types``: a layout of ``sliding``
and ``full`` layer kinds), and a mixture of experts on every layer: the router a biased Linear
whose top-k logits are soft-maxed (``router: topk_softmax``, ``router_bias``), each expert a
biased clamped SwiGLU (``expert: {kind: clamped_swiglu, alpha: swiglu_alpha, limit:
swiglu_limit, bias: true}``). Transformers stores the experts transposed, gate and up
interleaved: ``gate_up_proj`` (E, D, 2 x hidden) with gate columns 0, 2, 4, ... and up
columns 1, 3, 5, ..., ``down_proj`` (E, hidden, D).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import period, reject
from .llama import llama_spec, llama_state

_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def gptoss_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GptOssConfig``."""
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - set(_KINDS))
    if unknown:
        reject("layer_types", unknown, f"supported layer types: {', '.join(_KINDS)}")
    data = llama_spec(cfg)
    data["attention"]["sinks"] = True
    data["feedforward"] = {
        "kind": "moe", "n_experts": int(cfg.num_local_experts),
        "top_k": int(cfg.num_experts_per_tok), "router": "topk_softmax", "router_bias": True,
        "expert": {"kind": "clamped_swiglu", "hidden_dim": int(cfg.intermediate_size),
                   "bias": True, "alpha": float(cfg.swiglu_alpha),
                   "limit": float(cfg.swiglu_limit)},
        "aux_loss_coef": float(cfg.router_aux_loss_coef) if cfg.output_router_logits else 0.0}
    if "sliding_attention" in types:
        sliding = {"attention": {**data["attention"], "window": int(cfg.sliding_window)}}
        if "full_attention" not in types:
            data["attention"] = sliding["attention"]
        else:
            data["layout"] = {"kinds": {"sliding": sliding, "full": {}},
                              "pattern": [_KINDS[t] for t in period(types)]}
    return data


def gptoss_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GptOssForCausalLM``."""
    sd, cfg = hf.state_dict(), hf.config
    out = llama_state(hf)
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.sublayer.sinks"] = sd[f"{theirs}.self_attn.sinks"]
        ff, mlp = f"{ours}.ff.sublayer", f"{theirs}.mlp"
        out[f"{ff}.gate.weight"] = sd[f"{mlp}.router.weight"]
        out[f"{ff}.gate.bias"] = sd[f"{mlp}.router.bias"]
        gate_up = sd[f"{mlp}.experts.gate_up_proj"].transpose(1, 2)  # (E, 2 hidden, D)
        gate_up_bias = sd[f"{mlp}.experts.gate_up_proj_bias"]  # (E, 2 hidden)
        out[f"{ff}.W_gate"], out[f"{ff}.W_up"] = gate_up[:, 0::2], gate_up[:, 1::2]
        out[f"{ff}.b_gate"], out[f"{ff}.b_up"] = gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]
        out[f"{ff}.W_down"] = sd[f"{mlp}.experts.down_proj"].transpose(1, 2)  # (E, D, hidden)
        out[f"{ff}.b_down"] = sd[f"{mlp}.experts.down_proj_bias"]
    return {k: v.contiguous() for k, v in out.items()}
