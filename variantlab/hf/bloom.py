"""BLOOM (BigScience 2022, "BLOOM: A 176B-Parameter Open-Access Multilingual Language
Model"): ``BloomForCausalLM``.

ALiBi (``positional: alibi``: BLOOM's slopes are Press et al.'s; its bias slope_h * j on key
j differs from -slope_h * (i - j) by a constant per query, which the softmax drops), a
LayerNorm on the embeddings (``embedding_norm: true``), pre-norm LayerNorms, one fused q/k/v
Linear with rows per head as (q_h, k_h, v_h) (Falcon's per-head layout), a 4x MLP with
BLOOM's tanh GELU, biases everywhere. :func:`bloom_table` names every weight on both sides.

On export an ALiBi spec with an embedding norm comes here: pre-norm LayerNorms, a 4x MLP with
tanh GELU, multi-head attention (biases the variant lacks exported as zeros, with a warning).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import Spec, check_classic, check_dropout, dropouts, need, reject, token_ids
from .falcon import falcon_sublayers
from .gpt2 import hidden_of
from .table import Pair, layer_norm, load_state, qkv_rows, same

CLS = "BloomForCausalLM"
#: BLOOM has no maximum length (ALiBi); the spec needs one: the config's ``seq_length`` when
#: it has one, else BLOOM's training length (edit it freely: no weight depends on it)
BLOOM_CONTEXT = 2048


def bloom_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``BloomConfig``."""
    if cfg.apply_residual_connection_post_layernorm:
        reject("apply_residual_connection_post_layernorm", True, "a residual taken after the "
               "norm (x' = norm(x) + f(norm(x))) is not a variantlab residual")
    d = cfg.hidden_size
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": int(getattr(cfg, "seq_length", None) or BLOOM_CONTEXT),
        "emb_dim": d, "n_heads": cfg.n_head, "n_layers": cfg.n_layer,
        **dropouts(0.0, cfg.attention_dropout, cfg.hidden_dropout),
        "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings), "embedding_norm": True,
        "norm": {"kind": "layer", "eps": cfg.layer_norm_epsilon},
        "activation": {"kind": "gelu", "approximate": "tanh"},  # BloomGelu
        "feedforward": {"kind": "mlp", "hidden_dim": 4 * d},
        "attention": {"kind": "mha"}, "residual": {"kind": "pre_norm"},
        "positional": {"kind": "alibi"},
    }


def bloom_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``BloomForCausalLM`` of ``cfg`` and ours, both ways."""
    heads = cfg.n_head
    rows = qkv_rows(heads, heads, cfg.hidden_size // heads, "per_head")
    pairs = [same("embed.tok_emb.weight", "transformer.word_embeddings.weight"),
             same("out_head.weight", "lm_head.weight"),
             *layer_norm("embed_norm", "transformer.word_embeddings_layernorm"),
             *layer_norm("final_norm", "transformer.ln_f")]
    for i in range(cfg.n_layer):
        ours, theirs = f"trf_blocks.{i}", f"transformer.h.{i}"
        pairs += layer_norm(f"{ours}.att.norm", f"{theirs}.input_layernorm")
        pairs += layer_norm(f"{ours}.ff.norm", f"{theirs}.post_attention_layernorm")
        pairs += falcon_sublayers(f"{ours}.att.sublayer", f"{ours}.ff.sublayer", theirs, rows,
                                  True)
    return pairs


def bloom_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``BloomForCausalLM``."""
    return load_state(bloom_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def check_alibi(spec: Spec, cls: str, approximate: str, **classic: bool) -> None:
    """What BLOOM and MPT share: ALiBi, pre-norm LayerNorm (``classic``: the rest of
    :func:`check_classic`), a 4x MLP whose GELU is ``approximate`` (``tanh`` or ``none``)."""
    check_classic(spec, cls, residuals=("pre_norm",), gqa=False, **classic)
    need(spec, cls, "feedforward.hidden_dim", hidden_of(spec) == 4 * spec.emb_dim,
         f"this class's MLP is 4 x emb_dim = {4 * spec.emb_dim} wide")
    act = spec.activation
    need(spec, cls, "activation.kind", (act.kind, getattr(act, "approximate", None)) ==
         ("gelu", approximate), f"this class's MLP uses GELU (approximate: {approximate})")


def bloom_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``BloomConfig`` of an ALiBi spec with an embedding norm."""
    import transformers

    check_alibi(spec, CLS, "tanh", embedding_norm=True)
    check_dropout(spec, CLS, ("attn", "resid"))
    config = transformers.BloomConfig
    length: dict[str, Any] = {"seq_length": spec.context_length}  # kept, read back on import
    return config(
        **token_ids(spec, config), **length, vocab_size=spec.vocab_size,
        hidden_size=spec.emb_dim, n_layer=spec.n_layers, n_head=spec.n_heads,
        layer_norm_epsilon=spec.norm.eps, hidden_dropout=spec.drop("resid"),
        attention_dropout=spec.drop("attn"), tie_word_embeddings=spec.tie_weights)
