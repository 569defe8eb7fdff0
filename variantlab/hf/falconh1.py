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
model moves those weights at the folded scale, not at Falcon-H1's. On export those folded
multipliers are 1 (the weights carry them) and the block's four are the spec's.
:func:`falconh1_table` names every weight on both sides, the folding included.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    layers,
    need,
    reject,
    rms_decoder,
    rope,
    rotary,
    token_ids,
)
from .gpt2 import hidden_of
from .table import Pair, attention, linear, load_state, norms, same, scaled

CLS = "FalconH1ForCausalLM"
#: the mixer's gated-norm setting -> (mamba_rms_norm, mamba_norm_before_gate)
_GATE_NORMS = {"gate_only": (False, True), "norm_before_gate": (True, True),
               "norm_after_gate": (True, False)}


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


def falconh1_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``FalconH1ForCausalLM`` of ``cfg`` and ours, both ways, each folded
    multiplier applied on import and divided out on export."""
    bias = bool(cfg.attention_bias)
    pairs = [scaled("embed.tok_emb.weight", "model.embed_tokens.weight", cfg.embedding_multiplier),
             same("final_norm.scale", "model.final_layernorm.weight"),
             scaled("out_head.weight", "lm_head.weight", cfg.lm_head_multiplier)]
    rows = mup_rows(cfg)
    gate_m, down_m = cfg.mlp_multipliers
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "pre_ff_layernorm")
        ff, hf_ff = f"{ours}.ff.sublayer", f"{theirs}.feed_forward"
        pairs += [scaled(f"{ff}.W_gate.weight", f"{hf_ff}.gate_proj.weight", gate_m),
                  same(f"{ff}.W_up.weight", f"{hf_ff}.up_proj.weight"),
                  scaled(f"{ff}.W_down.weight", f"{hf_ff}.down_proj.weight", down_m)]
        att, hf_att = f"{ours}.att.sublayer.attention", f"{theirs}.self_attn"
        pairs += attention(att, hf_att, bias, {"W_query": "q_proj", "W_value": "v_proj",
                                               "out_proj": "o_proj"})
        key = [("weight", "")] + ([("bias", "attention biases")] if bias else [])
        pairs += [scaled(f"{att}.W_key.{p}", f"{hf_att}.k_proj.{p}", cfg.key_multiplier,
                         zeros or None) for p, zeros in key]
        mix, hf_mix = f"{ours}.att.sublayer.mixer", f"{theirs}.mamba"
        pairs.append(scaled(f"{mix}.in_proj.weight", f"{hf_mix}.in_proj.weight", rows))
        if cfg.mamba_proj_bias:
            pairs.append(scaled(f"{mix}.in_proj.bias", f"{hf_mix}.in_proj.bias", rows))
        pairs += linear(f"{mix}.out_proj", f"{hf_mix}.out_proj", bool(cfg.projectors_bias))
        pairs += linear(f"{mix}.conv1d", f"{hf_mix}.conv1d", bool(cfg.mamba_conv_bias))
        pairs += [same(f"{mix}.{name}", f"{hf_mix}.{name}") for name in ("dt_bias", "A_log", "D")]
        if cfg.mamba_rms_norm:
            pairs.append(same(f"{mix}.norm.weight", f"{hf_mix}.norm.weight"))
    return pairs


def falconh1_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``FalconH1ForCausalLM``, the folded multipliers applied."""
    return load_state(falconh1_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def falconh1_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``FalconH1Config`` of a spec whose every layer is a ``parallel_hybrid`` of
    attention and a Mamba-2 mixer."""
    import transformers

    layers(spec, CLS, ())
    hybrid = spec.attention
    check_common(spec, CLS, norm="rms", rotary=True)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: Falcon-H1 is pre_norm")
    check_dropout(spec, CLS, ("attn",))
    need(spec, CLS, "feedforward.kind", spec.feedforward.kind == "glu" and
         not spec.feedforward.bias, "Falcon-H1's feed-forward is a bias-free SwiGLU (glu)")
    need(spec, CLS, "activation.kind", spec.activation.kind == "silu",
         f"activation {spec.activation.kind!r}: Falcon-H1's mixer and SwiGLU use silu")
    part = spec.model_copy(update={"attention": hybrid.attention})
    check_attention(part, CLS, gqa=True, head_dim_free=False)
    mixer = hybrid.mixer
    rms_norm, before = _GATE_NORMS[mixer.gate_norm]
    need(spec, CLS, "attention.mixer.norm_eps", not rms_norm or mixer.norm_eps == spec.norm.eps,
         f"the mixer's norm eps {mixer.norm_eps} differs from the norm's {spec.norm.eps}; "
         "Falcon-H1 uses one rms_norm_eps for both")
    inner = mixer.inner_dim or mixer.expand * spec.emb_dim
    head_dim = mixer.head_dim or inner // spec.n_heads
    config = transformers.FalconH1Config
    return config(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=hybrid.attention.n_kv_heads or spec.n_heads,
        intermediate_size=hidden_of(spec), rms_norm_eps=spec.norm.eps, hidden_act="silu",
        attention_bias=spec.qkv_bias or spec.attn_out_bias, attention_dropout=spec.drop("attn"),
        tie_word_embeddings=spec.tie_weights,
        rope_parameters=rope(spec.positional, False, spec.context_length, cls=cls),
        mamba_d_ssm=inner, mamba_n_heads=inner // head_dim, mamba_d_head=head_dim,
        mamba_n_groups=mixer.n_groups, mamba_d_state=mixer.d_state,
        mamba_d_conv=mixer.conv_width, mamba_chunk_size=mixer.chunk_size,
        mamba_conv_bias=mixer.conv_bias, mamba_proj_bias=mixer.bias, projectors_bias=mixer.bias,
        mamba_rms_norm=rms_norm, mamba_norm_before_gate=before,
        attention_in_multiplier=hybrid.attention_in, attention_out_multiplier=hybrid.attention_out,
        ssm_in_multiplier=hybrid.mixer_in, ssm_out_multiplier=hybrid.mixer_out,
        **token_ids(spec, config))
