"""MPT (MosaicML 2023, "MPT-7B"): ``MptForCausalLM``.

ALiBi (``positional: alibi``; transformers builds MPT's slopes with ``alibi_bias_max`` 8
whatever the config says, and those are Press et al.'s: for a head count that is not a power
of two, the odd-indexed slopes of the next power, then the even-indexed ones), LayerNorms
without a shift (``norm_bias: false``), no Linear biases (whatever ``no_bias`` says: so
transformers builds it), one fused q/k/v Linear (queries,
then keys, then values), a 4x MLP with exact GELU (transformers ignores
``expansion_ratio``), ``attn_config.softmax_scale`` as ``attention.scale``; the attention
dropout ``attn_pdrop`` also drops both residual branches (as transformers does).
:func:`mpt_table` names every weight on both sides.

On export an ALiBi spec without an embedding norm comes here: pre-norm LayerNorms without
shifts, no Linear biases, a 4x MLP with exact GELU, one dropout rate for the attention
weights and the residual branches (0: transformers types it as an int).
"""

from __future__ import annotations

from typing import Any

import torch

from .bloom import check_alibi
from .common import Spec, check_dropout, dropouts, need, reject, token_ids
from .table import Pair, fused_qkv, linear, load_state, same

CLS = "MptForCausalLM"


def mpt_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``MptConfig``."""
    att = cfg.attn_config
    if att.clip_qkv:
        reject("attn_config.clip_qkv", att.clip_qkv, "clamped queries, keys and values are "
               "not a variantlab attention option")
    d = cfg.d_model
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size, "context_length": cfg.max_seq_len,
        "emb_dim": d, "n_heads": cfg.n_heads, "n_layers": cfg.n_layers,
        **dropouts(0.0, att.attn_pdrop, att.attn_pdrop),
        "qkv_bias": False, "attn_out_bias": False, "ffn_bias": False, "norm_bias": False,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "layer", "eps": cfg.layer_norm_epsilon},
        "activation": {"kind": "gelu", "approximate": "none"},
        "feedforward": {"kind": "mlp", "hidden_dim": 4 * d},
        "attention": {"kind": "mha", "scale": att.softmax_scale},
        "residual": {"kind": "pre_norm"}, "positional": {"kind": "alibi"},
    }


def mpt_table(cfg: Any) -> list[Pair]:
    """Every weight of an ``MptForCausalLM`` of ``cfg`` and ours, both ways."""
    d = cfg.d_model
    rows = (torch.arange(d), torch.arange(d, 2 * d), torch.arange(2 * d, 3 * d))
    pairs = [same("embed.tok_emb.weight", "transformer.wte.weight"),
             same("out_head.weight", "lm_head.weight"),
             same("final_norm.scale", "transformer.norm_f.weight")]
    for i in range(cfg.n_layers):
        ours, theirs = f"trf_blocks.{i}", f"transformer.blocks.{i}"
        att, ff = f"{ours}.att.sublayer", f"{ours}.ff.sublayer"
        pairs += [same(f"{ours}.att.norm.scale", f"{theirs}.norm_1.weight"),
                  same(f"{ours}.ff.norm.scale", f"{theirs}.norm_2.weight")]
        pairs += fused_qkv(att, f"{theirs}.attn.Wqkv", rows, False)
        pairs += linear(f"{att}.out_proj", f"{theirs}.attn.out_proj", False)
        pairs += linear(f"{ff}.layers.0", f"{theirs}.ffn.up_proj", False)
        pairs += linear(f"{ff}.layers.2", f"{theirs}.ffn.down_proj", False)
    return pairs


def mpt_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from an ``MptForCausalLM``."""
    return load_state(mpt_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def mpt_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``MptConfig`` of a bias-free ALiBi spec."""
    import transformers

    scale = spec.attention.scale  # MPT's softmax_scale: any
    check_alibi(spec.model_copy(update={"attention": spec.attention.model_copy(
        update={"scale": None})}), CLS, "none", norm_shift=False)
    need(spec, CLS, "qkv_bias", not (spec.qkv_bias or spec.attn_out_bias or spec.ffn_bias),
         "MPT's Linears have no biases")
    check_dropout(spec, CLS, ("attn", "resid"))
    need(spec, CLS, "attn_drop_rate", spec.drop("attn") == spec.drop("resid") == 0.0,
         "MPT has one dropout (attn_pdrop) for the attention weights and residual branches, "
         "which transformers' MptAttentionConfig types as an int: only 0 can be exported")
    config = transformers.MptConfig
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size, d_model=spec.emb_dim,
        n_layers=spec.n_layers, n_heads=spec.n_heads, max_seq_len=spec.context_length,
        expansion_ratio=4, layer_norm_epsilon=spec.norm.eps, no_bias=True,
        attn_config={"attn_pdrop": 0, "softmax_scale": scale},
        tie_word_embeddings=spec.tie_weights)
