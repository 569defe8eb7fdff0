"""GPT-J (Wang & Komatsuzaki 2021, "GPT-J-6B"): ``GPTJForCausalLM``.

A parallel block with one LayerNorm feeding attention and MLP (``residual: {kind: parallel,
shared_norm: true}``), bias-free q/k/v/out projections, a biased MLP and a biased output head
(``head_bias: true``). Rotary on the first ``rotary_dim`` dims of each head, base 10000, in
interleaved pairs (dims 2i and 2i + 1 turn together): the import reorders those rows of
q_proj and k_proj to the rotate-half pairs of ``positional: rotary`` (even dims, then odd
ones; every score unchanged) and the export puts them back. :func:`gptj_table` names every
weight on both sides.

On export a rotary LayerNorm spec with an output head bias comes here: a shared-norm
parallel block, whole heads, base 10000, an even count of rotated dims (``rotary_dim``), no
attention biases.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_classic,
    dropouts,
    head_dim,
    hf_activation,
    need,
    reject,
    token_ids,
)
from .gpt2 import hidden_of
from .table import Pair, interleaved_rows, layer_norm, linear, load_state, permuted, same

CLS = "GPTJForCausalLM"
#: GPT-J's rotary base (fixed in transformers)
THETA = 10000.0


def _rotary_dim(cfg: Any) -> int:
    head_dim = cfg.n_embd // cfg.n_head
    rot = cfg.rotary_dim  # an int: GPTJConfig refuses None
    if rot % 2 or not 0 < rot <= head_dim:
        reject("rotary_dim", rot, f"an even count of dims in (0, {head_dim}] (the head) is "
               "needed: transformers pairs every two")
    return int(rot)


def gptj_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GPTJConfig``."""
    head_dim = cfg.n_embd // cfg.n_head
    rot = _rotary_dim(cfg)
    fraction = rot / head_dim
    if int(head_dim * fraction) != rot:  # pragma: no cover (binary fractions of the head)
        reject("rotary_dim", rot, f"{rot} / {head_dim} is not exact in floating point")
    inner = cfg.n_inner if cfg.n_inner is not None else 4 * cfg.n_embd
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size, "context_length": cfg.n_positions,
        "emb_dim": cfg.n_embd, "n_heads": cfg.n_head, "n_layers": cfg.n_layer,
        **dropouts(cfg.embd_pdrop, cfg.attn_pdrop, cfg.resid_pdrop),
        "qkv_bias": False, "attn_out_bias": False, "ffn_bias": True, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings), "head_bias": True,
        "norm": {"kind": "layer", "eps": cfg.layer_norm_epsilon},
        "activation": activation("activation_function", cfg.activation_function),
        "feedforward": {"kind": "mlp", "hidden_dim": inner},
        "attention": {"kind": "mha"}, "residual": {"kind": "parallel", "shared_norm": True},
        "positional": {"kind": "rotary", "theta": THETA, "fraction": fraction},
    }


def gptj_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``GPTJForCausalLM`` of ``cfg`` and ours, both ways."""
    head_dim = cfg.n_embd // cfg.n_head
    order = interleaved_rows(cfg.n_embd, 0, _rotary_dim(cfg), head_dim)
    pairs = [same("embed.tok_emb.weight", "transformer.wte.weight"),
             same("out_head.weight", "lm_head.weight"),
             same("out_head.bias", "lm_head.bias", "output head bias"),
             *layer_norm("final_norm", "transformer.ln_f")]
    for i in range(cfg.n_layer):
        block, theirs = f"trf_blocks.{i}.res", f"transformer.h.{i}"
        att, ff = f"{block}.attention", f"{block}.feedforward"
        pairs += [*layer_norm(f"{block}.norm1", f"{theirs}.ln_1"),
                  permuted(f"{att}.W_query.weight", f"{theirs}.attn.q_proj.weight", order),
                  permuted(f"{att}.W_key.weight", f"{theirs}.attn.k_proj.weight", order),
                  same(f"{att}.W_value.weight", f"{theirs}.attn.v_proj.weight"),
                  same(f"{att}.out_proj.weight", f"{theirs}.attn.out_proj.weight")]
        pairs += linear(f"{ff}.layers.0", f"{theirs}.mlp.fc_in", True, "feed-forward biases")
        pairs += linear(f"{ff}.layers.2", f"{theirs}.mlp.fc_out", True, "feed-forward biases")
    return pairs


def gptj_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GPTJForCausalLM``."""
    return load_state(gptj_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def gptj_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``GPTJConfig`` of a parallel rotary spec with an output head bias."""
    import transformers

    check_classic(spec, CLS, residuals=("parallel",), gqa=False, head_bias=True)
    pos = spec.positional
    need(spec, CLS, "residual.shared_norm", spec.residual.shared_norm,
         "GPT-J's parallel block has one norm for both sublayers")
    need(spec, CLS, "positional.theta", pos.theta == THETA,
         f"theta={pos.theta}: GPT-J's rotary base is {THETA:g}")
    need(spec, CLS, "positional.scaling", pos.scaling == "none",
         f"scaling {pos.scaling!r}: GPT-J's rotary is unscaled")
    rot = int(head_dim(spec) * pos.fraction)
    need(spec, CLS, "positional.fraction", rot % 2 == 0, f"fraction={pos.fraction} rotates "
         f"{rot} dims: GPT-J pairs every two, so an even count")
    need(spec, CLS, "qkv_bias", not (spec.qkv_bias or spec.attn_out_bias),
         "GPT-J's attention projections have no biases")
    config = transformers.GPTJConfig
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size, n_positions=spec.context_length,
        n_embd=spec.emb_dim, n_layer=spec.n_layers, n_head=spec.n_heads, rotary_dim=rot,
        n_inner=hidden_of(spec), activation_function=hf_activation(spec, CLS),
        layer_norm_epsilon=spec.norm.eps, embd_pdrop=spec.drop("emb"),
        attn_pdrop=spec.drop("attn"), resid_pdrop=spec.drop("resid"),
        tie_word_embeddings=spec.tie_weights)
