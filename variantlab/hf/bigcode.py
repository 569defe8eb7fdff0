"""GPTBigCode (Allal et al. 2023, "SantaCoder: don't reach for the stars!"; StarCoder,
Li et al. 2023): ``GPTBigCodeForCausalLM``.

GPT-2 (learned positions, LayerNorm, an MLP, biases everywhere) with multi-query attention
(``multi_query``: ``attention: {kind: mha, n_kv_heads: 1}``) and a fused q/k/v ``nn.Linear``
(stored (out, in), unlike GPT-2's Conv1D): every query head, then the one key, then the one
value; without ``multi_query`` its rows are per head (q_h, k_h, v_h).
:func:`bigcode_table` names every weight on both sides.

On export a learned-position spec with one key/value head comes here (with one per head,
GPT-2); biases the variant lacks are exported as zeros, with a warning.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_classic,
    hf_activation,
    need,
    token_ids,
)
from .gpt2 import gpt2_spec, hidden_of
from .table import Pair, fused_qkv, layer_norm, linear, load_state, qkv_rows, same

CLS = "GPTBigCodeForCausalLM"


def bigcode_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GPTBigCodeConfig``: GPT-2's (the same config names), multi-query
    with ``multi_query``."""
    return {**gpt2_spec(cfg), "attention": {"kind": "mha",
                                             "n_kv_heads": 1 if cfg.multi_query else None}}


def bigcode_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``GPTBigCodeForCausalLM`` of ``cfg`` and ours, both ways."""
    heads = cfg.n_head
    layout = ("multi_query", 1) if cfg.multi_query else ("per_head", heads)
    rows = qkv_rows(heads, layout[1], cfg.n_embd // heads, layout[0])
    pairs = [same("embed.tok_emb.weight", "transformer.wte.weight"),
             same("embed.pos_emb.pos_emb.weight", "transformer.wpe.weight"),
             same("out_head.weight", "lm_head.weight"),
             *layer_norm("final_norm", "transformer.ln_f")]
    for i in range(cfg.n_layer):
        ours, theirs = f"trf_blocks.{i}", f"transformer.h.{i}"
        for mine, name in (("att.norm", "ln_1"), ("ff.norm", "ln_2")):
            pairs += layer_norm(f"{ours}.{mine}", f"{theirs}.{name}")
        att, ff = f"{ours}.att.sublayer", f"{ours}.ff.sublayer"
        pairs += fused_qkv(att, f"{theirs}.attn.c_attn", rows, True, "attention biases")
        pairs += linear(f"{att}.out_proj", f"{theirs}.attn.c_proj", True, "attention biases")
        pairs += linear(f"{ff}.layers.0", f"{theirs}.mlp.c_fc", True, "feed-forward biases")
        pairs += linear(f"{ff}.layers.2", f"{theirs}.mlp.c_proj", True, "feed-forward biases")
    return pairs


def bigcode_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GPTBigCodeForCausalLM``."""
    return load_state(bigcode_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def bigcode_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``GPTBigCodeConfig`` of a learned-position multi-query spec."""
    import transformers

    check_classic(spec, CLS, residuals=("pre_norm",), gqa=True)
    kv = spec.attention.n_kv_heads or spec.n_heads
    need(spec, CLS, "attention.n_kv_heads", kv in (1, spec.n_heads),
         f"n_kv_heads={kv}: GPTBigCode has one key/value head (multi_query) or one per head")
    need(spec, CLS, "positional.offset", spec.positional.offset == 0,
         f"offset={spec.positional.offset}: GPTBigCode's position table starts at 0")
    config = transformers.GPTBigCodeConfig
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size, n_positions=spec.context_length,
        n_embd=spec.emb_dim, n_layer=spec.n_layers, n_head=spec.n_heads,
        n_inner=hidden_of(spec), activation_function=hf_activation(spec, CLS),
        layer_norm_epsilon=spec.norm.eps, multi_query=kv == 1, embd_pdrop=spec.drop("emb"),
        attn_pdrop=spec.drop("attn"), resid_pdrop=spec.drop("resid"),
        tie_word_embeddings=spec.tie_weights)
