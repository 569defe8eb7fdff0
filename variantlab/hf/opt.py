"""OPT (Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models"):
``OPTForCausalLM``.

Learned positions read two rows on (``positional: {kind: learned, offset: 2}``: a table of
``max_position_embeddings + 2`` rows, position p at row p + 2, as OPT's
``embed_positions``), LayerNorm, separate q/k/v/out projections and an MLP (``ffn_dim``),
biased together (``enable_bias``). ``do_layer_norm_before``: pre-norm with a final norm
(OPT-125m, 1.3b and larger), else post-norm without one (OPT-350m). :func:`opt_table` names
every weight on both sides.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import activation, dropouts, reject
from .table import Pair, attention, linear, load_state, same

CLS = "OPTForCausalLM"
#: OPT's learned position table starts two rows on (transformers' OPTLearnedPositionalEmbedding)
OFFSET = 2


def _final_norm(cfg: Any) -> bool:
    return bool(cfg.do_layer_norm_before and not getattr(cfg, "_remove_final_layer_norm", False))


def opt_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``OPTConfig``."""
    if cfg.word_embed_proj_dim != cfg.hidden_size:
        reject("word_embed_proj_dim", cfg.word_embed_proj_dim, "projected embeddings "
               "(project_in / project_out, OPT-350m) are not a variantlab option; only "
               f"word_embed_proj_dim = hidden_size ({cfg.hidden_size})")
    if not cfg.layer_norm_elementwise_affine:
        reject("layer_norm_elementwise_affine", False, "LayerNorms without a scale and shift "
               "are not a variantlab norm")
    for name in ("activation_dropout", "layerdrop"):
        if getattr(cfg, name, 0.0):
            reject(name, getattr(cfg, name), "variantlab has no dropout of this kind; only 0 "
                   "(it acts in training only)")
    bias = bool(cfg.enable_bias)
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(cfg.dropout, cfg.attention_dropout, cfg.dropout),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": bias, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings), "final_norm": _final_norm(cfg),
        "norm": {"kind": "layer", "eps": 1e-5},  # transformers' nn.LayerNorm default
        "activation": activation("activation_function", cfg.activation_function),
        "feedforward": {"kind": "mlp", "hidden_dim": cfg.ffn_dim},
        "attention": {"kind": "mha"},
        "residual": {"kind": "pre_norm" if cfg.do_layer_norm_before else "post_norm"},
        "positional": {"kind": "learned", "offset": OFFSET},
    }


def _norm(ours: str, theirs: str) -> list[Pair]:
    return [same(f"{ours}.scale", f"{theirs}.weight"),
            same(f"{ours}.shift", f"{theirs}.bias", "norm shifts")]


def opt_table(cfg: Any) -> list[Pair]:
    """Every weight of an ``OPTForCausalLM`` of ``cfg`` and ours, both ways."""
    bias = bool(cfg.enable_bias)
    pairs = [same("embed.tok_emb.weight", "model.decoder.embed_tokens.weight"),
             same("embed.pos_emb.pos_emb.weight", "model.decoder.embed_positions.weight"),
             same("out_head.weight", "lm_head.weight")]
    if _final_norm(cfg):
        pairs += _norm("final_norm", "model.decoder.final_layer_norm")
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.decoder.layers.{i}"
        pairs += _norm(f"{ours}.att.norm", f"{theirs}.self_attn_layer_norm")
        pairs += _norm(f"{ours}.ff.norm", f"{theirs}.final_layer_norm")
        pairs += attention(f"{ours}.att.sublayer", f"{theirs}.self_attn", bias,
                           {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj",
                            "out_proj": "out_proj"})
        pairs += linear(f"{ours}.ff.sublayer.layers.0", f"{theirs}.fc1", bias,
                        "feed-forward biases")
        pairs += linear(f"{ours}.ff.sublayer.layers.2", f"{theirs}.fc2", bias,
                        "feed-forward biases")
    return pairs


def opt_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from an ``OPTForCausalLM``."""
    return load_state(opt_table(hf.config), hf.state_dict())
