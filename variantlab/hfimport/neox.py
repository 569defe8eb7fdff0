"""``GPTNeoXForCausalLM``: LayerNorm, partial rotary, parallel or sequential residual, and
one fused q/k/v Linear whose output is laid out per head as (q_h, k_h, v_h)."""

from __future__ import annotations

from typing import Any

import torch

from .common import activation, dropouts, linear, norm, rotary


def neox_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GPTNeoXConfig``: ``use_parallel_residual`` true gives ``parallel``
    with a norm per sublayer, false gives ``pre_norm``."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    bias = bool(getattr(cfg, "attention_bias", True))
    residual = ({"kind": "parallel", "shared_norm": False} if cfg.use_parallel_residual
                else {"kind": "pre_norm"})
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(cfg.hidden_dropout, cfg.attention_dropout, cfg.hidden_dropout),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": True, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "layer", "eps": cfg.layer_norm_eps},
        "activation": activation("hidden_act", cfg.hidden_act),
        "feedforward": {"kind": "mlp", "hidden_dim": cfg.intermediate_size},
        "attention": {"kind": "mha"}, "residual": residual,
        "positional": rotary(cfg, partial=True, head_dim=head_dim),
    }


def neox_state(hf: Any) -> dict[str, torch.Tensor]:
    sd, cfg = hf.state_dict(), hf.config
    heads, width = cfg.num_attention_heads, cfg.hidden_size
    head_dim = width // heads
    bias = bool(getattr(cfg, "attention_bias", True))
    out = {"embed.tok_emb.weight": sd["gpt_neox.embed_in.weight"],
           "out_head.weight": sd["lm_head.weight"]}
    norm(out, "final_norm", sd, "gpt_neox.final_layer_norm", shift=True)
    for i in range(cfg.num_hidden_layers):
        theirs = f"gpt_neox.layers.{i}"
        if cfg.use_parallel_residual:
            block = f"trf_blocks.{i}.res"
            att, ff = f"{block}.attention", f"{block}.feedforward"
            norm_att, norm_ff = f"{block}.norm1", f"{block}.norm2"
        else:
            att, ff = f"trf_blocks.{i}.att.sublayer", f"trf_blocks.{i}.ff.sublayer"
            norm_att, norm_ff = f"trf_blocks.{i}.att.norm", f"trf_blocks.{i}.ff.norm"
        norm(out, norm_att, sd, f"{theirs}.input_layernorm", shift=True)
        norm(out, norm_ff, sd, f"{theirs}.post_attention_layernorm", shift=True)
        # output rows ordered (head, q/k/v, head_dim): regroup into q, k and v
        fused = sd[f"{theirs}.attention.query_key_value.weight"].view(heads, 3, head_dim, width)
        fused_bias = (sd[f"{theirs}.attention.query_key_value.bias"].view(heads, 3, head_dim)
                      if bias else None)
        for j, name in enumerate(("W_query", "W_key", "W_value")):
            out[f"{att}.{name}.weight"] = fused[:, j].reshape(width, width)
            if fused_bias is not None:
                out[f"{att}.{name}.bias"] = fused_bias[:, j].reshape(width)
        linear(out, f"{att}.out_proj", sd, f"{theirs}.attention.dense", bias)
        linear(out, f"{ff}.layers.0", sd, f"{theirs}.mlp.dense_h_to_4h", True)
        linear(out, f"{ff}.layers.2", sd, f"{theirs}.mlp.dense_4h_to_h", True)
    return out
