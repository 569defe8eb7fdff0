"""``GPT2LMHeadModel``: learned positions, LayerNorm, fused Conv1D q/k/v (weights stored
(in, out), so transposed here)."""

from __future__ import annotations

from typing import Any

import torch

from .common import activation, dropouts, norm, reject


def gpt2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GPT2Config``; refuses the options variantlab's attention lacks."""
    if not getattr(cfg, "scale_attn_weights", True):
        reject("scale_attn_weights", False, "unscaled attention scores are not supported")
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        reject("scale_attn_by_inverse_layer_idx", True, "per-layer score scaling is not "
               "supported")
    if getattr(cfg, "add_cross_attention", False):
        reject("add_cross_attention", True, "a decoder-only model is imported")
    inner = cfg.n_inner if cfg.n_inner is not None else 4 * cfg.n_embd
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size, "context_length": cfg.n_positions,
        "emb_dim": cfg.n_embd, "n_heads": cfg.n_head, "n_layers": cfg.n_layer,
        **dropouts(cfg.embd_pdrop, cfg.attn_pdrop, cfg.resid_pdrop),
        "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "layer", "eps": cfg.layer_norm_epsilon},
        "activation": activation("activation_function", cfg.activation_function),
        "feedforward": {"kind": "mlp", "hidden_dim": inner},
        "attention": {"kind": "mha"}, "positional": {"kind": "learned"},
    }


def _conv1d(out: dict[str, torch.Tensor], ours: str, weight: torch.Tensor,
            bias: torch.Tensor) -> None:
    out[f"{ours}.weight"], out[f"{ours}.bias"] = weight.t(), bias


def gpt2_state(hf: Any) -> dict[str, torch.Tensor]:
    sd, cfg = hf.state_dict(), hf.config
    out = {"embed.tok_emb.weight": sd["transformer.wte.weight"],
           "embed.pos_emb.pos_emb.weight": sd["transformer.wpe.weight"],
           "out_head.weight": sd["lm_head.weight"]}
    norm(out, "final_norm", sd, "transformer.ln_f", shift=True)
    for i in range(cfg.n_layer):
        ours, theirs = f"trf_blocks.{i}", f"transformer.h.{i}"
        norm(out, f"{ours}.att.norm", sd, f"{theirs}.ln_1", shift=True)
        norm(out, f"{ours}.ff.norm", sd, f"{theirs}.ln_2", shift=True)
        weights = sd[f"{theirs}.attn.c_attn.weight"].split(cfg.n_embd, dim=1)  # 3 x (D, D)
        biases = sd[f"{theirs}.attn.c_attn.bias"].split(cfg.n_embd)  # 3 x (D,)
        for name, w, b in zip(("W_query", "W_key", "W_value"), weights, biases):
            _conv1d(out, f"{ours}.att.sublayer.{name}", w, b)
        for mine, hf_name in (("att.sublayer.out_proj", "attn.c_proj"),
                              ("ff.sublayer.layers.0", "mlp.c_fc"),
                              ("ff.sublayer.layers.2", "mlp.c_proj")):
            _conv1d(out, f"{ours}.{mine}", sd[f"{theirs}.{hf_name}.weight"],
                    sd[f"{theirs}.{hf_name}.bias"])
    return out
