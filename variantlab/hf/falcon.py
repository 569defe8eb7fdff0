"""Falcon (TII 2023, "The Falcon Series of Open Language Models"): ``FalconForCausalLM``.

LayerNorm, rotary, an MLP (``ffn_hidden_size``, ``activation``) and one fused q/k/v Linear,
all Linears biased or not together (``bias``). Three block shapes: ``parallel_attn`` with one
norm feeding attention and MLP (Falcon-7B: ``residual: {kind: parallel, shared_norm:
true}``), ``new_decoder_architecture`` with ``ln_attn`` and ``ln_mlp`` (Falcon-40B/180B:
``shared_norm: false``; ``num_ln_in_parallel_attn: 1`` shares one), or sequential
(``parallel_attn: false``: ``pre_norm``). Heads: ``multi_query`` (one key/value head, the
fused rows laid out as every query head, then the key, then the value), the new architecture's
``num_kv_heads`` groups (each group's query heads, then its key, then its value), or full
multi-head attention with rows per head as (q_h, k_h, v_h). :func:`falcon_table` names every
weight on both sides.

On export a rotary LayerNorm spec comes here when its heads are grouped (``n_kv_heads``) or
its parallel block's norm is shared with the whole head rotated: one ``n_kv_heads`` gives
``multi_query``, other groups or two norms the new architecture; ``bias`` is set when any
Linear has one (the others exported as zeros, with a warning).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_classic,
    check_dropout,
    dropouts,
    hf_activation,
    need,
    reject,
    rope,
    rotary,
    token_ids,
)
from .gpt2 import hidden_of
from .table import Pair, fused_qkv, layer_norm, linear, load_state, qkv_rows, same

CLS = "FalconForCausalLM"


def falcon_heads(cfg: Any) -> tuple[int, str]:
    """The key/value heads of a ``FalconConfig`` and the fused q/k/v layout: ``grouped``
    (new architecture), ``multi_query`` or ``per_head``."""
    if cfg.new_decoder_architecture:
        return int(cfg.num_kv_heads), "grouped"
    if cfg.multi_query:
        return 1, "multi_query"
    return int(cfg.num_attention_heads), "per_head"


def _residual(cfg: Any) -> dict[str, Any]:
    if cfg.new_decoder_architecture:
        if not cfg.parallel_attn:
            reject("parallel_attn", False, "with new_decoder_architecture transformers builds "
                   "no ln_attn / ln_mlp and fails; the new architecture is parallel")
        shared = cfg.num_ln_in_parallel_attn == 1
        return {"kind": "parallel", "shared_norm": shared}
    if cfg.parallel_attn:
        return {"kind": "parallel", "shared_norm": True}
    return {"kind": "pre_norm"}


def falcon_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``FalconConfig``."""
    if cfg.alibi:
        reject("alibi", True, "Falcon's ALiBi is applied twice in transformers' eager "
               "attention and once in its sdpa attention (slopes / sqrt(head_dim)), so there "
               "is no one reference to match; use rotary (alibi: false)")
    heads = cfg.num_attention_heads
    kv_heads, layout = falcon_heads(cfg)
    if layout == "per_head" and cfg.num_kv_heads != heads:
        reject("num_kv_heads", cfg.num_kv_heads, "without multi_query or "
               "new_decoder_architecture Falcon's fused q/k/v has a key and value per head; "
               f"num_kv_heads must be num_attention_heads ({heads})")
    head_dim = cfg.hidden_size // heads
    bias = bool(cfg.bias)
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(0.0, 0.0, cfg.hidden_dropout or 0.0),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": bias, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "layer", "eps": cfg.layer_norm_epsilon},
        "activation": activation("activation", cfg.activation),
        "feedforward": {"kind": "mlp", "hidden_dim": cfg.ffn_hidden_size},
        "attention": {"kind": "mha", "n_kv_heads": kv_heads if kv_heads != heads else None},
        "residual": _residual(cfg),
        "positional": rotary(cfg, partial=False, head_dim=head_dim),
    }


def falcon_sublayers(att: str, ff: str, theirs: str, rows: tuple[torch.Tensor, ...],
                     bias: bool) -> list[Pair]:
    """A Falcon or BLOOM layer's fused q/k/v and output projection (``self_attention``) and
    MLP (``mlp``) at ``theirs``, ours at ``att`` and ``ff``."""
    return [*fused_qkv(att, f"{theirs}.self_attention.query_key_value", rows, bias,
                       "attention biases"),
            *linear(f"{att}.out_proj", f"{theirs}.self_attention.dense", bias,
                    "attention biases"),
            *linear(f"{ff}.layers.0", f"{theirs}.mlp.dense_h_to_4h", bias, "feed-forward biases"),
            *linear(f"{ff}.layers.2", f"{theirs}.mlp.dense_4h_to_h", bias, "feed-forward biases")]


def falcon_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``FalconForCausalLM`` of ``cfg`` and ours, both ways."""
    heads, bias = cfg.num_attention_heads, bool(cfg.bias)
    kv_heads, layout = falcon_heads(cfg)
    rows = qkv_rows(heads, kv_heads, cfg.hidden_size // heads, layout)
    residual = _residual(cfg)
    pairs = [same("embed.tok_emb.weight", "transformer.word_embeddings.weight"),
             same("out_head.weight", "lm_head.weight"),
             *layer_norm("final_norm", "transformer.ln_f")]
    for i in range(cfg.num_hidden_layers):
        theirs = f"transformer.h.{i}"
        if residual["kind"] == "parallel":
            block = f"trf_blocks.{i}.res"
            att, ff = f"{block}.attention", f"{block}.feedforward"
            if residual["shared_norm"]:
                pairs += layer_norm(f"{block}.norm1", f"{theirs}.input_layernorm")
            else:
                pairs += layer_norm(f"{block}.norm1", f"{theirs}.ln_attn")
                pairs += layer_norm(f"{block}.norm2", f"{theirs}.ln_mlp")
        else:
            att, ff = f"trf_blocks.{i}.att.sublayer", f"trf_blocks.{i}.ff.sublayer"
            pairs += layer_norm(f"trf_blocks.{i}.att.norm", f"{theirs}.input_layernorm")
            pairs += layer_norm(f"trf_blocks.{i}.ff.norm", f"{theirs}.post_attention_layernorm")
        pairs += falcon_sublayers(att, ff, theirs, rows, bias)
    return pairs


def falcon_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``FalconForCausalLM``."""
    return load_state(falcon_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def falcon_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``FalconConfig`` of a rotary LayerNorm spec, parallel or sequential."""
    import transformers

    check_classic(spec, CLS, residuals=("parallel", "pre_norm"), gqa=True, rotary=True)
    check_dropout(spec, CLS, ("resid",))
    heads, res = spec.n_heads, spec.residual
    kv = spec.attention.n_kv_heads or heads
    parallel = res.kind == "parallel"
    new = parallel and (not res.shared_norm or kv not in (1, heads))
    need(spec, CLS, "attention.n_kv_heads", new or kv in (1, heads), f"n_kv_heads={kv}: "
         "sequential Falcon has one key/value head (multi_query) or one per head")
    config = transformers.FalconConfig
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size,
        max_position_embeddings=spec.context_length, hidden_size=spec.emb_dim,
        num_hidden_layers=spec.n_layers, num_attention_heads=heads, num_kv_heads=kv,
        multi_query=kv == 1 and not new, new_decoder_architecture=new, parallel_attn=parallel,
        num_ln_in_parallel_attn=(1 if res.shared_norm else 2) if new else None,
        bias=spec.qkv_bias or spec.attn_out_bias or spec.ffn_bias, alibi=False,
        ffn_hidden_size=hidden_of(spec), activation=hf_activation(spec, CLS),
        layer_norm_epsilon=spec.norm.eps,
        rope_parameters=rope(spec.positional, False, spec.context_length, CLS),
        hidden_dropout=spec.drop("resid"),  # sequential Falcon drops the attention's branch
        attention_dropout=0.0 if parallel else spec.drop("resid"),  # with this one
        tie_word_embeddings=spec.tie_weights)
