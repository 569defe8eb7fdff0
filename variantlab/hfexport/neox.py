"""``GPTNeoXForCausalLM`` from a spec with rotary positions (any fraction that rotates an
even number of dims, or an odd number rounded up, ``odd_rounding: up``, as transformers
does), LayerNorm, an MLP and a parallel or pre-norm residual: the inverse of
:mod:`variantlab.hfimport.neox` (q/k/v fused per head as (q_h, k_h, v_h))."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    head_dim,
    hf_activation,
    need,
    rope,
    token_ids,
    warn,
    warn_zero_biases,
    zero_bias,
)
from .gpt2 import hidden_of

CLS = "GPTNeoXForCausalLM"


def neox_config(spec: Spec) -> Any:
    import transformers

    check_common(spec, CLS, norm="layer", rotary=False)
    check_attention(spec, CLS, gqa=False, head_dim_free=False)
    res = spec.residual
    need(spec, CLS, "residual.kind", res.kind in ("parallel", "pre_norm"),
         f"residual {res.kind!r}: GPT-NeoX is parallel or pre-norm")
    need(spec, CLS, "feedforward.kind", spec.feedforward.kind == "mlp",
         f"feedforward {spec.feedforward.kind!r}: GPT-NeoX has a plain MLP")
    dims = int(head_dim(spec) * spec.positional.fraction)
    need(spec, CLS, "positional.fraction", dims % 2 == 0 or
         spec.positional.odd_rounding == "up",
         f"fraction={spec.positional.fraction} rotates int({head_dim(spec)} * fraction) = "
         f"{dims} dims, an odd count, rounded down to {dims - 1} here and up to {dims + 1} in "
         "transformers; set odd_rounding: up or choose a fraction that gives an even count")
    if res.kind == "parallel" and res.shared_norm:
        warn(f"{CLS} has a norm per sublayer: the shared norm is exported as two equal "
             "norms (same logits; training the exported model trains them apart)")
    if spec.drop("emb") != spec.drop("resid"):
        warn(f"{CLS} has one hidden_dropout for embeddings and residual branches: exported "
             f"as the residual rate {spec.drop('resid')}")
    return transformers.GPTNeoXConfig(
        **token_ids(spec, transformers.GPTNeoXConfig),
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads, intermediate_size=hidden_of(spec),
        hidden_act=hf_activation(spec, CLS), layer_norm_eps=spec.norm.eps,
        rope_parameters=rope(spec.positional, fraction=True),
        use_parallel_residual=res.kind == "parallel",
        attention_bias=spec.qkv_bias or spec.attn_out_bias,
        hidden_dropout=spec.drop("resid"), attention_dropout=spec.drop("attn"),
        tie_word_embeddings=spec.tie_weights)


def neox_state(spec: Spec, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    heads, width, hd = spec.n_heads, spec.emb_dim, head_dim(spec)
    bias = spec.qkv_bias or spec.attn_out_bias
    parallel = spec.residual.kind == "parallel"
    out = {"gpt_neox.embed_in.weight": sd["embed.tok_emb.weight"],
           "lm_head.weight": sd.get("out_head.weight", sd["embed.tok_emb.weight"])}
    zeros: list[str] = []
    zero_bias(sd, "final_norm.shift", width, "norm shifts", zeros)
    out["gpt_neox.final_layer_norm.weight"] = sd["final_norm.scale"]
    out["gpt_neox.final_layer_norm.bias"] = sd["final_norm.shift"]
    for i in range(spec.n_layers):
        theirs = f"gpt_neox.layers.{i}"
        if parallel:
            block = f"trf_blocks.{i}.res"
            att, ff = f"{block}.attention", f"{block}.feedforward"
            norm2 = f"{block}.norm2" if f"{block}.norm2.scale" in sd else f"{block}.norm1"
            norms = (f"{block}.norm1", norm2)
        else:
            att, ff = f"trf_blocks.{i}.att.sublayer", f"trf_blocks.{i}.ff.sublayer"
            norms = (f"trf_blocks.{i}.att.norm", f"trf_blocks.{i}.ff.norm")
        for mine, hf in zip(norms, ("input_layernorm", "post_attention_layernorm")):
            zero_bias(sd, f"{mine}.shift", width, "norm shifts", zeros)
            out[f"{theirs}.{hf}.weight"] = sd[f"{mine}.scale"]
            out[f"{theirs}.{hf}.bias"] = sd[f"{mine}.shift"]
        names = ("W_query", "W_key", "W_value")
        # rows ordered (head, q/k/v, head_dim): interleave q, k and v per head
        fused = torch.stack([sd[f"{att}.{n}.weight"].view(heads, hd, width) for n in names],
                            dim=1)  # (H, 3, hd, D)
        out[f"{theirs}.attention.query_key_value.weight"] = fused.reshape(3 * width, width)
        if bias:
            for n in (*names, "out_proj"):
                zero_bias(sd, f"{att}.{n}.bias", width, "attention biases", zeros)
            fused_bias = torch.stack([sd[f"{att}.{n}.bias"].view(heads, hd) for n in names],
                                     dim=1)  # (H, 3, hd)
            out[f"{theirs}.attention.query_key_value.bias"] = fused_bias.reshape(3 * width)
            out[f"{theirs}.attention.dense.bias"] = sd[f"{att}.out_proj.bias"]
        out[f"{theirs}.attention.dense.weight"] = sd[f"{att}.out_proj.weight"]
        for mine, hf, size in (("layers.0", "dense_h_to_4h", hidden_of(spec)),
                               ("layers.2", "dense_4h_to_h", width)):
            zero_bias(sd, f"{ff}.{mine}.bias", size, "feed-forward biases", zeros)
            out[f"{theirs}.mlp.{hf}.weight"] = sd[f"{ff}.{mine}.weight"]
            out[f"{theirs}.mlp.{hf}.bias"] = sd[f"{ff}.{mine}.bias"]
    warn_zero_biases(CLS, zeros)
    return out
