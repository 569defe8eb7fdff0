"""``GPT2LMHeadModel`` from a spec with learned positions, LayerNorm, an MLP and pre-norm
residuals: the inverse of :mod:`variantlab.hfimport.gpt2` (q/k/v fused into one Conv1D,
whose weights are stored (in, out))."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    hf_activation,
    need,
    token_ids,
    warn_zero_biases,
    zero_bias,
)

CLS = "GPT2LMHeadModel"


def hidden_of(spec: Spec) -> int:
    ff = spec.feedforward
    return ff.hidden_dim or max(1, round(ff.hidden_mult * spec.emb_dim))


def gpt2_config(spec: Spec) -> Any:
    import transformers

    check_common(spec, CLS, norm="layer", rotary=False)
    check_attention(spec, CLS, gqa=False, head_dim_free=False)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: GPT-2 is pre-norm")
    need(spec, CLS, "feedforward.kind", spec.feedforward.kind == "mlp",
         f"feedforward {spec.feedforward.kind!r}: GPT-2 has a plain MLP")
    return transformers.GPT2Config(
        **token_ids(spec, transformers.GPT2Config),
        vocab_size=spec.vocab_size, n_positions=spec.context_length, n_embd=spec.emb_dim,
        n_layer=spec.n_layers, n_head=spec.n_heads, n_inner=hidden_of(spec),
        activation_function=hf_activation(spec, CLS), layer_norm_epsilon=spec.norm.eps,
        embd_pdrop=spec.drop("emb"), attn_pdrop=spec.drop("attn"),
        resid_pdrop=spec.drop("resid"), tie_word_embeddings=spec.tie_weights)


def gpt2_state(spec: Spec, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    d, hidden = spec.emb_dim, hidden_of(spec)
    zeros: list[str] = []
    for key, size, what in _biases(spec, d, hidden):
        zero_bias(sd, key, size, what, zeros)
    out = {"transformer.wte.weight": sd["embed.tok_emb.weight"],
           "transformer.wpe.weight": sd["embed.pos_emb.pos_emb.weight"],
           "lm_head.weight": sd.get("out_head.weight", sd["embed.tok_emb.weight"]),
           "transformer.ln_f.weight": sd["final_norm.scale"],
           "transformer.ln_f.bias": sd["final_norm.shift"]}
    for i in range(spec.n_layers):
        ours, theirs = f"trf_blocks.{i}", f"transformer.h.{i}"
        for mine, hf in (("att.norm", "ln_1"), ("ff.norm", "ln_2")):
            out[f"{theirs}.{hf}.weight"] = sd[f"{ours}.{mine}.scale"]
            out[f"{theirs}.{hf}.bias"] = sd[f"{ours}.{mine}.shift"]
        att = f"{ours}.att.sublayer"
        names = ("W_query", "W_key", "W_value")
        out[f"{theirs}.attn.c_attn.weight"] = torch.cat(  # (D, 3D), Conv1D is (in, out)
            [sd[f"{att}.{n}.weight"].t() for n in names], dim=1)
        out[f"{theirs}.attn.c_attn.bias"] = torch.cat([sd[f"{att}.{n}.bias"] for n in names])
        for mine, hf in (("att.sublayer.out_proj", "attn.c_proj"),
                         ("ff.sublayer.layers.0", "mlp.c_fc"),
                         ("ff.sublayer.layers.2", "mlp.c_proj")):
            out[f"{theirs}.{hf}.weight"] = sd[f"{ours}.{mine}.weight"].t()
            out[f"{theirs}.{hf}.bias"] = sd[f"{ours}.{mine}.bias"]
    warn_zero_biases(CLS, zeros)
    return out


def _biases(spec: Spec, d: int, hidden: int) -> list[tuple[str, int, str]]:
    """Every bias and norm shift GPT-2 has: (our key, size, what it is)."""
    out = [("final_norm.shift", d, "norm shifts")]
    for i in range(spec.n_layers):
        b = f"trf_blocks.{i}"
        out += [(f"{b}.att.norm.shift", d, "norm shifts"), (f"{b}.ff.norm.shift", d, "norm shifts")]
        out += [(f"{b}.att.sublayer.{n}.bias", d, "q/k/v biases")
                for n in ("W_query", "W_key", "W_value")]
        out += [(f"{b}.att.sublayer.out_proj.bias", d, "attention output bias"),
                (f"{b}.ff.sublayer.layers.0.bias", hidden, "feed-forward biases"),
                (f"{b}.ff.sublayer.layers.2.bias", d, "feed-forward biases")]
    return out
