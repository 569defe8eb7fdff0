"""OPT (Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models"):
``OPTForCausalLM``.

Learned positions read two rows on (``positional: {kind: learned, offset: 2}``: a table of
``max_position_embeddings + 2`` rows, position p at row p + 2, as OPT's
``embed_positions``), LayerNorm, separate q/k/v/out projections and an MLP (``ffn_dim``),
biased together (``enable_bias``). ``do_layer_norm_before``: pre-norm with a final norm
(OPT-125m, 1.3b and larger), else post-norm without one (OPT-350m). A
``word_embed_proj_dim`` other than ``hidden_size`` (OPT-350m) is ``token_dim``: token
embeddings and output head of that width, ``project_in`` and ``project_out`` between them and
the model. :func:`opt_table` names every weight on both sides.

On export a spec with learned positions at an offset comes here: the offset 2, pre-norm with
a final norm or post-norm without one, LayerNorm of eps 1e-5 (transformers' default, which
OPT cannot set), ``enable_bias`` when any Linear has one (the others exported as zeros).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_classic,
    dropouts,
    hf_activation,
    need,
    reject,
    token_ids,
    warn,
)
from .gpt2 import hidden_of
from .table import Pair, attention, layer_norm, linear, load_state, same

CLS = "OPTForCausalLM"
#: OPT's learned position table starts two rows on (transformers' OPTLearnedPositionalEmbedding)
OFFSET = 2


def _projected(cfg: Any) -> bool:
    return bool(cfg.word_embed_proj_dim != cfg.hidden_size)


def _final_norm(cfg: Any) -> bool:
    return bool(cfg.do_layer_norm_before and not getattr(cfg, "_remove_final_layer_norm", False))


def opt_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``OPTConfig``."""
    if not cfg.layer_norm_elementwise_affine:
        reject("layer_norm_elementwise_affine", False, "LayerNorms without a scale and shift "
               "are not a variantlab norm")
    if cfg.layerdrop:
        reject("layerdrop", cfg.layerdrop, "variantlab does not skip layers at random in "
               "training; only 0")
    bias = bool(cfg.enable_bias)
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(cfg.dropout, cfg.attention_dropout, cfg.dropout),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": bias, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings), "final_norm": _final_norm(cfg),
        "token_dim": cfg.word_embed_proj_dim if _projected(cfg) else None,
        "norm": {"kind": "layer", "eps": 1e-5},  # transformers' nn.LayerNorm default
        "activation": activation("activation_function", cfg.activation_function),
        "feedforward": {"kind": "mlp", "hidden_dim": cfg.ffn_dim},
        "attention": {"kind": "mha"},
        "residual": {"kind": "pre_norm" if cfg.do_layer_norm_before else "post_norm"},
        "positional": {"kind": "learned", "offset": OFFSET},
    }


def opt_table(cfg: Any) -> list[Pair]:
    """Every weight of an ``OPTForCausalLM`` of ``cfg`` and ours, both ways."""
    bias = bool(cfg.enable_bias)
    pairs = [same("embed.tok_emb.weight", "model.decoder.embed_tokens.weight"),
             same("embed.pos_emb.pos_emb.weight", "model.decoder.embed_positions.weight"),
             same("out_head.weight", "lm_head.weight")]
    if _final_norm(cfg):
        pairs += layer_norm("final_norm", "model.decoder.final_layer_norm")
    if _projected(cfg):
        pairs += [same("embed.project_in.weight", "model.decoder.project_in.weight"),
                  same("project_out.weight", "model.decoder.project_out.weight")]
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.decoder.layers.{i}"
        pairs += layer_norm(f"{ours}.att.norm", f"{theirs}.self_attn_layer_norm")
        pairs += layer_norm(f"{ours}.ff.norm", f"{theirs}.final_layer_norm")
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


# --- export ---------------------------------------------------------------------------

def opt_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``OPTConfig`` of a learned-position spec at OPT's offset."""
    import transformers

    pre = spec.residual.kind == "pre_norm"
    check_classic(spec, CLS, residuals=("pre_norm", "post_norm"), gqa=False, final_norm=pre,
                  token_dim=True)
    need(spec, CLS, "final_norm", spec.final_norm == pre, "OPT has a final norm with "
         "pre_norm residuals (do_layer_norm_before) and none with post_norm")
    need(spec, CLS, "positional.offset", spec.positional.offset == OFFSET,
         f"offset={spec.positional.offset}: OPT's position table starts {OFFSET} rows on")
    need(spec, CLS, "norm.eps", spec.norm.eps == 1e-5,
         f"eps={spec.norm.eps}: OPT's LayerNorms have torch's default 1e-5")
    if spec.drop("emb") != spec.drop("resid"):
        warn(f"{CLS} has one dropout for embeddings and residual branches: exported as the "
             f"residual rate {spec.drop('resid')}")
    config = transformers.OPTConfig
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size,
        max_position_embeddings=spec.context_length, hidden_size=spec.emb_dim,
        word_embed_proj_dim=spec.token_dim or spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads, ffn_dim=hidden_of(spec),
        activation_function=hf_activation(spec, CLS), do_layer_norm_before=pre,
        enable_bias=spec.qkv_bias or spec.attn_out_bias or spec.ffn_bias,
        dropout=spec.drop("resid"), attention_dropout=spec.drop("attn"),
        layerdrop=0.0, tie_word_embeddings=spec.tie_weights)
