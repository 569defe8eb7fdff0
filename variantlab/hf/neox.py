"""``GPTNeoXForCausalLM``, both ways: LayerNorm, partial rotary (any fraction that rotates
an even number of dims, or an odd number rounded up, ``odd_rounding: up``, as transformers
does), an MLP, a parallel or sequential (pre-norm) residual, and one fused q/k/v Linear whose
output is laid out per head as (q_h, k_h, v_h). :data:`NORMS` and :data:`MLP` name the
per-layer weights on both sides."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_attention,
    check_common,
    dropouts,
    head_dim,
    hf_activation,
    linear,
    need,
    norm,
    rope,
    rotary,
    token_ids,
    warn,
    warn_zero_biases,
    zero_bias,
)
from .gpt2 import QKV, hidden_of

CLS = "GPTNeoXForCausalLM"
#: the HF names (under ``gpt_neox.layers.{i}``) of the norms before attention and before
#: the feed-forward, and our feed-forward layers -> HF's (under ``.mlp``)
NORMS = ("input_layernorm", "post_attention_layernorm")
MLP = (("layers.0", "dense_h_to_4h"), ("layers.2", "dense_4h_to_h"))


def _sublayers(i: int, parallel: bool) -> tuple[str, str, str]:
    """Our prefixes of layer ``i``'s attention, feed-forward and (parallel) residual block."""
    if parallel:
        block = f"trf_blocks.{i}.res"
        return f"{block}.attention", f"{block}.feedforward", block
    return f"trf_blocks.{i}.att.sublayer", f"trf_blocks.{i}.ff.sublayer", f"trf_blocks.{i}"


# --- import ---------------------------------------------------------------------------

def neox_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GPTNeoXConfig``: ``use_parallel_residual`` true gives ``parallel``
    with a norm per sublayer, false gives ``pre_norm``."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    bias = bool(getattr(cfg, "attention_bias", True))
    residual = ({"kind": "parallel", "shared_norm": False} if cfg.use_parallel_residual
                else {"kind": "pre_norm"})
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(cfg.hidden_dropout, cfg.attention_dropout, cfg.hidden_dropout),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": True, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "layer", "eps": cfg.layer_norm_eps},
        "activation": activation("hidden_act", cfg.hidden_act),
        "feedforward": {"kind": "mlp", "hidden_dim": cfg.intermediate_size},
        "attention": {"kind": "mha"}, "residual": residual,
        "positional": rotary(cfg, partial=True, head_dim=head_dim),
    }


def neox_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GPTNeoXForCausalLM``."""
    sd, cfg = hf.state_dict(), hf.config
    heads, width = cfg.num_attention_heads, cfg.hidden_size
    head_dim = width // heads
    bias = bool(getattr(cfg, "attention_bias", True))
    out = {"embed.tok_emb.weight": sd["gpt_neox.embed_in.weight"],
           "out_head.weight": sd["lm_head.weight"]}
    norm(out, "final_norm", sd, "gpt_neox.final_layer_norm", shift=True)
    for i in range(cfg.num_hidden_layers):
        theirs = f"gpt_neox.layers.{i}"
        att, ff, block = _sublayers(i, cfg.use_parallel_residual)
        ours = ((f"{block}.norm1", f"{block}.norm2") if cfg.use_parallel_residual
                else (f"{block}.att.norm", f"{block}.ff.norm"))
        for mine, hf_name in zip(ours, NORMS):
            norm(out, mine, sd, f"{theirs}.{hf_name}", shift=True)
        # output rows ordered (head, q/k/v, head_dim): regroup into q, k and v
        fused = sd[f"{theirs}.attention.query_key_value.weight"].view(heads, 3, head_dim, width)
        fused_bias = (sd[f"{theirs}.attention.query_key_value.bias"].view(heads, 3, head_dim)
                      if bias else None)
        for j, name in enumerate(QKV):
            out[f"{att}.{name}.weight"] = fused[:, j].reshape(width, width)
            if fused_bias is not None:
                out[f"{att}.{name}.bias"] = fused_bias[:, j].reshape(width)
        linear(out, f"{att}.out_proj", sd, f"{theirs}.attention.dense", bias)
        for mine, hf_name in MLP:
            linear(out, f"{ff}.{mine}", sd, f"{theirs}.mlp.{hf_name}", True)
    return out


# --- export ---------------------------------------------------------------------------

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
        rope_parameters=rope(spec.positional, True, spec.context_length, cls=CLS),
        use_parallel_residual=res.kind == "parallel",
        attention_bias=spec.qkv_bias or spec.attn_out_bias,
        hidden_dropout=spec.drop("resid"), attention_dropout=spec.drop("attn"),
        tie_word_embeddings=spec.tie_weights)


def neox_hf_state(spec: Spec, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``GPTNeoXForCausalLM`` state dict from ours (``sd``; biases it lacks become zeros,
    a shared parallel norm becomes two equal ones)."""
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
        att, ff, block = _sublayers(i, parallel)
        if parallel:
            norm2 = f"{block}.norm2" if f"{block}.norm2.scale" in sd else f"{block}.norm1"
            norms = (f"{block}.norm1", norm2)
        else:
            norms = (f"{block}.att.norm", f"{block}.ff.norm")
        for mine, hf in zip(norms, NORMS):
            zero_bias(sd, f"{mine}.shift", width, "norm shifts", zeros)
            out[f"{theirs}.{hf}.weight"] = sd[f"{mine}.scale"]
            out[f"{theirs}.{hf}.bias"] = sd[f"{mine}.shift"]
        # rows ordered (head, q/k/v, head_dim): interleave q, k and v per head
        fused = torch.stack([sd[f"{att}.{n}.weight"].view(heads, hd, width) for n in QKV],
                            dim=1)  # (H, 3, hd, D)
        out[f"{theirs}.attention.query_key_value.weight"] = fused.reshape(3 * width, width)
        if bias:
            for n in (*QKV, "out_proj"):
                zero_bias(sd, f"{att}.{n}.bias", width, "attention biases", zeros)
            fused_bias = torch.stack([sd[f"{att}.{n}.bias"].view(heads, hd) for n in QKV],
                                     dim=1)  # (H, 3, hd)
            out[f"{theirs}.attention.query_key_value.bias"] = fused_bias.reshape(3 * width)
            out[f"{theirs}.attention.dense.bias"] = sd[f"{att}.out_proj.bias"]
        out[f"{theirs}.attention.dense.weight"] = sd[f"{att}.out_proj.weight"]
        for (mine, hf), size in zip(MLP, (hidden_of(spec), width)):
            zero_bias(sd, f"{ff}.{mine}.bias", size, "feed-forward biases", zeros)
            out[f"{theirs}.mlp.{hf}.weight"] = sd[f"{ff}.{mine}.weight"]
            out[f"{theirs}.mlp.{hf}.bias"] = sd[f"{ff}.{mine}.bias"]
    warn_zero_biases(CLS, zeros)
    return out
