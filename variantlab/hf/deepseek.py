"""DeepSeek-V2 and DeepSeek-V3: ``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``.

Llama-like pre-norm blocks whose attention is multi-head latent attention (``attention:
{kind: mla}``, variantlab_plugins/mla.py) and whose feed-forward is a mixture of experts
from layer ``first_k_dense_replace`` on (the first layers a dense SwiGLU: a layout with a
``dense`` layer kind on those layers), with ``n_shared_experts`` shared experts (one SwiGLU
of width ``moe_intermediate_size * n_shared_experts``, ungated).

Routing: V2 takes a softmax over the experts, the top-k as they are (``topk_method: greedy``)
or within the ``topk_group`` best of ``n_group`` groups scored by their best expert
(``group_limited_greedy``); V3 takes a sigmoid per expert, chooses with the
``e_score_correction_bias`` added among the ``topk_group`` best groups scored by the sum of
their two best experts, renormalises when ``norm_topk_prob``; both scale the weights by
``routed_scaling_factor``.

DeepSeek's rotary dims are interleaved pairs (V2 always, V3 with ``rope_interleave``): the
rows of the rotary parts of the query and key projections are reordered (even dims, then odd
ones) on import, after which the rotate-half rotary gives the same scores.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import ends_state, linear, reject, rms_decoder, rotary
from .moe import fused_experts

_GLU = {"W_gate": "gate_proj", "W_up": "up_proj", "W_down": "down_proj"}


def deepseek_spec(cfg: Any, v3: bool) -> dict[str, Any]:
    """Spec data of a ``DeepseekV2Config`` (``v3`` false) or ``DeepseekV3Config``."""
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        reject("num_key_value_heads", cfg.num_key_value_heads, "MLA expands the latent to "
               "every head; Hugging Face's eager attention needs it equal to "
               "num_attention_heads")
    if getattr(cfg, "mlp_bias", False):
        reject("mlp_bias", True, "the DeepSeek experts have no biases; biased dense and "
               "shared feed-forwards are not imported")
    bias = bool(cfg.attention_bias)
    dense = {"kind": "glu", "hidden_dim": cfg.intermediate_size}
    data: dict[str, Any] = {
        **rms_decoder(cfg, bias),
        "feedforward": dense,
        "attention": {"kind": "mla", "kv_lora_rank": cfg.kv_lora_rank,
                      "q_lora_rank": cfg.q_lora_rank, "qk_rope_head_dim": cfg.qk_rope_head_dim,
                      "qk_nope_head_dim": cfg.qk_nope_head_dim, "v_head_dim": cfg.v_head_dim},
        "positional": rotary(cfg, partial=False, head_dim=cfg.qk_rope_head_dim),
    }
    first_dense = int(cfg.first_k_dense_replace or 0)
    if first_dense >= cfg.num_hidden_layers:
        return data
    data["feedforward"] = _moe(cfg, v3)
    if first_dense:
        data["layout"] = {"kinds": {"dense": {"feedforward": dense}},
                          "layers": dict.fromkeys(range(first_dense), "dense")}
    return data


def _moe(cfg: Any, v3: bool) -> dict[str, Any]:
    """The ``moe`` feed-forward of a DeepSeek config."""
    moe: dict[str, Any] = {
        "kind": "moe", "n_experts": int(cfg.n_routed_experts), "top_k": int(cfg.num_experts_per_tok),
        "expert": {"kind": "glu", "hidden_dim": int(cfg.moe_intermediate_size)},
        "routed_scaling_factor": float(cfg.routed_scaling_factor)}
    if cfg.n_shared_experts:
        moe.update(n_shared_experts=int(cfg.n_shared_experts),
                   shared_hidden_dim=int(cfg.moe_intermediate_size * cfg.n_shared_experts))
    if v3:
        moe.update(router="sigmoid_topk", renormalize=bool(cfg.norm_topk_prob), choice_bias=True)
        if cfg.n_group and cfg.n_group > 1:
            moe.update(n_group=int(cfg.n_group), topk_group=int(cfg.topk_group),
                       group_score="top2_sum")
        return moe
    moe.update(router="softmax_topk", renormalize=False)  # V2's router never renormalises
    if cfg.topk_method == "group_limited_greedy":
        moe.update(n_group=int(cfg.n_group), topk_group=int(cfg.topk_group), group_score="max")
    elif cfg.topk_method != "greedy":
        reject("topk_method", cfg.topk_method, "supported: greedy, group_limited_greedy")
    return moe


def deepseek_v2_spec(cfg: Any) -> dict[str, Any]:
    return deepseek_spec(cfg, v3=False)


def deepseek_v3_spec(cfg: Any) -> dict[str, Any]:
    return deepseek_spec(cfg, v3=True)


def deinterleave(w: torch.Tensor, start: int, width: int, period: int) -> torch.Tensor:
    """``w`` (rows, ...) with the rows ``start .. start + width`` of every block of
    ``period`` rows reordered from interleaved pairs (x0, x1, x2, x3, ...) to halves
    (x0, x2, ..., x1, x3, ...)."""
    blocks = w.reshape(-1, period, *w.shape[1:]).clone()  # (blocks, period, ...)
    part = blocks[:, start:start + width]
    blocks[:, start:start + width] = torch.cat([part[:, 0::2], part[:, 1::2]], dim=1)
    return blocks.reshape(w.shape)


def _attention(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor],
               theirs: str, cfg: Any, interleaved: bool) -> None:
    bias = bool(cfg.attention_bias)
    nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    rank = cfg.kv_lora_rank
    q_name = "q_proj" if cfg.q_lora_rank is None else "q_b_proj"
    if cfg.q_lora_rank is not None:
        linear(out, f"{ours}.q_a_proj", sd, f"{theirs}.q_a_proj", bias)
        out[f"{ours}.q_a_norm.scale"] = sd[f"{theirs}.q_a_layernorm.weight"]
    q = sd[f"{theirs}.{q_name}.weight"]  # (H * (nope + rope), in)
    kv_a = sd[f"{theirs}.kv_a_proj_with_mqa.weight"]  # (rank + rope, D)
    if interleaved:
        q = deinterleave(q, nope, rope, nope + rope)
        kv_a = deinterleave(kv_a, rank, rope, rank + rope)
    out[f"{ours}.{q_name}.weight"] = q
    out[f"{ours}.kv_a_proj.weight"] = kv_a
    if bias:
        kv_bias = sd[f"{theirs}.kv_a_proj_with_mqa.bias"]
        out[f"{ours}.kv_a_proj.bias"] = (deinterleave(kv_bias, rank, rope, rank + rope)
                                         if interleaved else kv_bias)
    out[f"{ours}.kv_a_norm.scale"] = sd[f"{theirs}.kv_a_layernorm.weight"]
    out[f"{ours}.kv_b_proj.weight"] = sd[f"{theirs}.kv_b_proj.weight"]
    linear(out, f"{ours}.out_proj", sd, f"{theirs}.o_proj", bias)


def deepseek_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``."""
    sd, cfg = hf.state_dict(), hf.config
    interleaved = bool(getattr(cfg, "rope_interleave", True))  # V2 has no option: always
    out = ends_state(sd)
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = sd[f"{theirs}.input_layernorm.weight"]
        out[f"{ours}.ff.norm.scale"] = sd[f"{theirs}.post_attention_layernorm.weight"]
        _attention(out, f"{ours}.att.sublayer", sd, f"{theirs}.self_attn", cfg, interleaved)
        ff, mlp = f"{ours}.ff.sublayer", f"{theirs}.mlp"
        if f"{mlp}.gate.weight" not in sd:  # a dense layer
            for mine, name in _GLU.items():
                out[f"{ff}.{mine}.weight"] = sd[f"{mlp}.{name}.weight"]
            continue
        out[f"{ff}.gate.weight"] = sd[f"{mlp}.gate.weight"]
        if f"{mlp}.gate.e_score_correction_bias" in sd:
            out[f"{ff}.expert_bias"] = sd[f"{mlp}.gate.e_score_correction_bias"]
        fused_experts(out, ff, sd, f"{mlp}.experts")
        if cfg.n_shared_experts:
            for mine, name in _GLU.items():
                out[f"{ff}.shared_expert.{mine}.weight"] = sd[f"{mlp}.shared_experts.{name}.weight"]
    return out
