"""Falcon-H1: ``FalconH1ForCausalLM`` (TII 2025, "Falcon-H1: A Family of Hybrid-Head Language
Models Redefining Efficiency and Performance").

Every layer is a parallel hybrid (``attention: {kind: parallel_hybrid}``,
variantlab_plugins/hybrid.py): grouped-query attention with rotary (``self_attn`` →
``attention``) and a Mamba-2 mixer (``mamba`` → ``mixer``; inner width ``mamba_d_ssm``, heads
``mamba_n_heads``; its gated RMSNorm only with ``mamba_rms_norm``, norm before the gate with
``mamba_norm_before_gate``, else y * silu(z)) read the same normalised input; their outputs,
scaled, are added; then a SwiGLU (pre-norm, ``pre_ff_layernorm``).

Falcon-H1's μP multipliers: ``attention_in_multiplier``, ``attention_out_multiplier``,
``ssm_in_multiplier`` and ``ssm_out_multiplier`` are the block's own (``attention_in``,
``attention_out``, ``mixer_in``, ``mixer_out``); the others scale a linear map and are folded
into its weights on import: ``key_multiplier`` into k_proj, ``ssm_multipliers`` (the
``mup_vector`` over the z, x, B, C and dt rows of in_proj) into in_proj, ``mlp_multipliers``
into gate_proj and down_proj, ``embedding_multiplier`` into the embedding and
``lm_head_multiplier`` into the output head. The logits are equal; training the imported
model moves those weights at the folded scale, not at Falcon-H1's.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import linear, reject, rms_decoder, rotary


def _inner(cfg: Any) -> int:
    return int(cfg.mamba_d_ssm or cfg.mamba_expand * cfg.hidden_size)


def falconh1_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``FalconH1Config``."""
    if cfg.projectors_bias != cfg.mamba_proj_bias:
        reject("projectors_bias", cfg.projectors_bias, "the mixer's out_proj bias must match "
               f"in_proj's (mamba_proj_bias={cfg.mamba_proj_bias})")
    if tuple(cfg.time_step_limit) != (0.0, float("inf")):
        reject("time_step_limit", cfg.time_step_limit, "dt clamping is not in mamba2")
    if getattr(cfg, "mlp_bias", False):
        reject("mlp_bias", True, "the multipliers are folded into bias-free projections")
    folded = (cfg.embedding_multiplier, cfg.lm_head_multiplier)
    if cfg.tie_word_embeddings and folded != (1.0, 1.0):
        reject("tie_word_embeddings", True, f"embedding and lm_head multipliers {folded} "
               "cannot both fold into one tied matrix")
    bias = bool(cfg.attention_bias)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inner = _inner(cfg)
    mixer = {"kind": "mamba2", "d_state": cfg.mamba_d_state, "inner_dim": inner,
             "head_dim": inner // cfg.mamba_n_heads, "n_groups": cfg.mamba_n_groups,
             "conv_width": cfg.mamba_d_conv, "chunk_size": cfg.mamba_chunk_size,
             "bias": bool(cfg.mamba_proj_bias), "conv_bias": bool(cfg.mamba_conv_bias),
             "norm_eps": cfg.rms_norm_eps,
             "gate_norm": ("gate_only" if not cfg.mamba_rms_norm else
                           "norm_before_gate" if cfg.mamba_norm_before_gate else
                           "norm_after_gate")}
    attention = {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads,
                 "head_dim": head_dim if head_dim * cfg.num_attention_heads != cfg.hidden_size
                 else None}
    return {
        **rms_decoder(cfg, bias),
        "feedforward": {"kind": "glu", "hidden_dim": cfg.intermediate_size},
        "attention": {"kind": "parallel_hybrid", "attention": attention, "mixer": mixer,
                      "attention_in": float(cfg.attention_in_multiplier),
                      "attention_out": float(cfg.attention_out_multiplier),
                      "mixer_in": float(cfg.ssm_in_multiplier),
                      "mixer_out": float(cfg.ssm_out_multiplier)},
        "positional": rotary(cfg, partial=False, head_dim=head_dim),
    }


def mup_rows(cfg: Any) -> torch.Tensor:
    """Falcon-H1's per-row multipliers of the mixer's in_proj output (z, x, B, C, dt)."""
    inner, gs = _inner(cfg), cfg.mamba_n_groups * cfg.mamba_d_state
    sizes = [inner, inner, gs, gs, cfg.mamba_n_heads]
    return torch.cat([torch.full((n,), float(m)) for n, m in zip(sizes, cfg.ssm_multipliers)])


def falconh1_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``FalconH1ForCausalLM``, the folded multipliers applied."""
    sd, cfg = hf.state_dict(), hf.config
    bias = bool(cfg.attention_bias)
    out = {"embed.tok_emb.weight": sd["model.embed_tokens.weight"] * cfg.embedding_multiplier,
           "final_norm.scale": sd["model.final_layernorm.weight"],
           "out_head.weight": sd["lm_head.weight"] * cfg.lm_head_multiplier}
    rows = mup_rows(cfg)
    gate_m, down_m = cfg.mlp_multipliers
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = sd[f"{theirs}.input_layernorm.weight"]
        out[f"{ours}.ff.norm.scale"] = sd[f"{theirs}.pre_ff_layernorm.weight"]
        ff = f"{ours}.ff.sublayer"
        out[f"{ff}.W_gate.weight"] = sd[f"{theirs}.feed_forward.gate_proj.weight"] * gate_m
        out[f"{ff}.W_up.weight"] = sd[f"{theirs}.feed_forward.up_proj.weight"]
        out[f"{ff}.W_down.weight"] = sd[f"{theirs}.feed_forward.down_proj.weight"] * down_m
        att, hf_att = f"{ours}.att.sublayer.attention", f"{theirs}.self_attn"
        for mine, name in (("W_query", "q_proj"), ("W_value", "v_proj"), ("out_proj", "o_proj")):
            linear(out, f"{att}.{mine}", sd, f"{hf_att}.{name}", bias)
        out[f"{att}.W_key.weight"] = sd[f"{hf_att}.k_proj.weight"] * cfg.key_multiplier
        if bias:
            out[f"{att}.W_key.bias"] = sd[f"{hf_att}.k_proj.bias"] * cfg.key_multiplier
        mix, hf_mix = f"{ours}.att.sublayer.mixer", f"{theirs}.mamba"
        out[f"{mix}.in_proj.weight"] = sd[f"{hf_mix}.in_proj.weight"] * rows[:, None]
        if cfg.mamba_proj_bias:
            out[f"{mix}.in_proj.bias"] = sd[f"{hf_mix}.in_proj.bias"] * rows
        linear(out, f"{mix}.out_proj", sd, f"{hf_mix}.out_proj", bool(cfg.projectors_bias))
        linear(out, f"{mix}.conv1d", sd, f"{hf_mix}.conv1d", bool(cfg.mamba_conv_bias))
        for name in ("dt_bias", "A_log", "D"):
            out[f"{mix}.{name}"] = sd[f"{hf_mix}.{name}"]
        if cfg.mamba_rms_norm:
            out[f"{mix}.norm.weight"] = sd[f"{hf_mix}.norm.weight"]
    return out
