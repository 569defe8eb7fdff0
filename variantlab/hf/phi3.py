"""Phi-3 and Phi-4, both ways: ``Phi3ForCausalLM`` (Abdin et al. 2024, "Phi-3 Technical
Report"; Phi-4 and Phi-4-mini are the same class). A Llama decoder with its query, key and
value projections fused in one ``qkv_proj`` (rows: queries, keys, values) and its gate and up
projections in one ``gate_up_proj`` (gate rows first), split into ours on import and fused
back on export; a partial rotary (``partial_rotary_factor``, Phi-4-mini), LongRoPE scaling
(``scaling: longrope`` with the config's ``original_max_position_embeddings``), a sliding
window on every layer, and ``resid_pdrop`` on both residual branches. :func:`phi3_table`
names every weight on both sides.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    dropouts,
    head_dim,
    hf_activation,
    need,
    rope,
    rotary,
    token_ids,
)
from .gpt2 import hidden_of
from .llama import llama_spec
from .table import Pair, ends, load_state, norms, same, stacked

CLS = "Phi3ForCausalLM"


def phi3_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Phi3Config``."""
    width = cfg.hidden_size // cfg.num_attention_heads
    data = llama_spec(cfg, positional=rotary(cfg, partial=True, head_dim=width))
    data.update(dropouts(0.0, cfg.attention_dropout or 0.0, cfg.resid_pdrop or 0.0))
    if cfg.sliding_window is not None:
        data["attention"]["window"] = int(cfg.sliding_window)
    return data


def phi3_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``Phi3ForCausalLM`` of ``cfg`` and ours."""
    width = cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * width, cfg.num_key_value_heads * width
    pairs = ends()
    for i in range(cfg.num_hidden_layers):
        att, ff = f"trf_blocks.{i}.att.sublayer", f"trf_blocks.{i}.ff.sublayer"
        theirs = f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "post_attention_layernorm")
        pairs += [
            stacked((f"{att}.W_query.weight", f"{att}.W_key.weight", f"{att}.W_value.weight"),
                    f"{theirs}.self_attn.qkv_proj.weight", (q, kv, kv)),
            same(f"{att}.out_proj.weight", f"{theirs}.self_attn.o_proj.weight"),
            stacked((f"{ff}.W_gate.weight", f"{ff}.W_up.weight"),
                    f"{theirs}.mlp.gate_up_proj.weight", (cfg.intermediate_size,) * 2),
            same(f"{ff}.W_down.weight", f"{theirs}.mlp.down_proj.weight")]
    return pairs


def phi3_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``Phi3ForCausalLM``."""
    return load_state(phi3_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def phi3_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``Phi3Config`` of a bias-free Llama-like spec (partial rotary, LongRoPE and a
    sliding window allowed)."""
    import transformers

    check_common(spec, CLS, norm="rms", rotary=False)
    check_attention(spec, CLS, gqa=True, head_dim_free=False, window=True)
    need(spec, CLS, "feedforward.kind", spec.feedforward.kind == "glu",
         f"feedforward {spec.feedforward.kind!r}: Phi-3 has a gated feed-forward (glu)")
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: Phi-3 is pre_norm")
    need(spec, CLS, "qkv_bias", not (spec.qkv_bias or spec.attn_out_bias),
         "Phi-3's attention has no biases")
    need(spec, CLS, "feedforward.bias", not spec.feedforward.bias,
         "Phi-3's feed-forward has no biases")
    pos = spec.positional
    need(spec, CLS, "positional.odd_rounding", int(head_dim(spec) * pos.fraction) % 2 == 0,
         f"fraction={pos.fraction} rotates an odd count of dims; Phi-3 needs an even one")
    need(spec, CLS, "positional.scaling", pos.scaling in ("none", "longrope"),
         f"scaling {pos.scaling!r}: Phi-3's config takes LongRoPE only (a full rotary with "
         "another scaling exports to Llama)")
    check_dropout(spec, CLS, ("attn", "resid"))
    parameters = rope(pos, True, spec.context_length, CLS)
    config = transformers.Phi3Config
    return config(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        original_max_position_embeddings=pos.original_context or spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.attention.n_kv_heads or spec.n_heads,
        intermediate_size=hidden_of(spec), rms_norm_eps=spec.norm.eps,
        attention_dropout=spec.drop("attn"), resid_pdrop=spec.drop("resid"), embd_pdrop=0.0,
        tie_word_embeddings=spec.tie_weights, sliding_window=spec.attention.window,
        hidden_act=hf_activation(spec, CLS), rope_parameters=parameters,
        **token_ids(spec, config))
