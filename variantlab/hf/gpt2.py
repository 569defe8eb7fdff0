"""``GPT2LMHeadModel``, both ways: learned positions, LayerNorm, an MLP and pre-norm
residuals, q/k/v fused into one Conv1D whose weights are stored (in, out), so transposed
on the way in and out. :data:`LAYER` names each per-layer weight on both sides."""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_attention,
    check_common,
    dropouts,
    hf_activation,
    need,
    norm,
    reject,
    token_ids,
    warn_zero_biases,
    zero_bias,
)

CLS = "GPT2LMHeadModel"
#: our module under ``trf_blocks.{i}`` -> the HF module under ``transformer.h.{i}``: the
#: norms, then the Conv1D layers other than the fused q/k/v (``attn.c_attn``)
NORMS = (("att.norm", "ln_1"), ("ff.norm", "ln_2"))
LINEARS = (("att.sublayer.out_proj", "attn.c_proj"), ("ff.sublayer.layers.0", "mlp.c_fc"),
           ("ff.sublayer.layers.2", "mlp.c_proj"))
QKV = ("W_query", "W_key", "W_value")


# --- import ---------------------------------------------------------------------------

def gpt2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GPT2Config``; refuses the options variantlab's attention lacks."""
    if not getattr(cfg, "scale_attn_weights", True):
        reject("scale_attn_weights", False, "unscaled attention scores are not supported")
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        reject("scale_attn_by_inverse_layer_idx", True, "per-layer score scaling is not "
               "supported")
    if getattr(cfg, "add_cross_attention", False):
        reject("add_cross_attention", True, "a decoder-only model is imported")
    inner = cfg.n_inner if cfg.n_inner is not None else 4 * cfg.n_embd
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size, "context_length": cfg.n_positions,
        "emb_dim": cfg.n_embd, "n_heads": cfg.n_head, "n_layers": cfg.n_layer,
        **dropouts(cfg.embd_pdrop, cfg.attn_pdrop, cfg.resid_pdrop),
        "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True, "norm_bias": True,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "layer", "eps": cfg.layer_norm_epsilon},
        "activation": activation("activation_function", cfg.activation_function),
        "feedforward": {"kind": "mlp", "hidden_dim": inner},
        "attention": {"kind": "mha"}, "positional": {"kind": "learned"},
    }


def _conv1d(out: dict[str, torch.Tensor], ours: str, weight: torch.Tensor,
            bias: torch.Tensor) -> None:
    out[f"{ours}.weight"], out[f"{ours}.bias"] = weight.t(), bias


def gpt2_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GPT2LMHeadModel``."""
    sd, cfg = hf.state_dict(), hf.config
    out = {"embed.tok_emb.weight": sd["transformer.wte.weight"],
           "embed.pos_emb.pos_emb.weight": sd["transformer.wpe.weight"],
           "out_head.weight": sd["lm_head.weight"]}
    norm(out, "final_norm", sd, "transformer.ln_f", shift=True)
    for i in range(cfg.n_layer):
        ours, theirs = f"trf_blocks.{i}", f"transformer.h.{i}"
        for mine, hf_name in NORMS:
            norm(out, f"{ours}.{mine}", sd, f"{theirs}.{hf_name}", shift=True)
        weights = sd[f"{theirs}.attn.c_attn.weight"].split(cfg.n_embd, dim=1)  # 3 x (D, D)
        biases = sd[f"{theirs}.attn.c_attn.bias"].split(cfg.n_embd)  # 3 x (D,)
        for name, w, b in zip(QKV, weights, biases):
            _conv1d(out, f"{ours}.att.sublayer.{name}", w, b)
        for mine, hf_name in LINEARS:
            _conv1d(out, f"{ours}.{mine}", sd[f"{theirs}.{hf_name}.weight"],
                    sd[f"{theirs}.{hf_name}.bias"])
    return out


# --- export ---------------------------------------------------------------------------

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
    need(spec, CLS, "positional.offset", spec.positional.offset == 0,
         f"offset={spec.positional.offset}: GPT-2's position table starts at position 0 "
         "(an offset is OPT's)")
    return transformers.GPT2Config(
        **token_ids(spec, transformers.GPT2Config),
        vocab_size=spec.vocab_size, n_positions=spec.context_length, n_embd=spec.emb_dim,
        n_layer=spec.n_layers, n_head=spec.n_heads, n_inner=hidden_of(spec),
        activation_function=hf_activation(spec, CLS), layer_norm_epsilon=spec.norm.eps,
        embd_pdrop=spec.drop("emb"), attn_pdrop=spec.drop("attn"),
        resid_pdrop=spec.drop("resid"), tie_word_embeddings=spec.tie_weights)


def gpt2_hf_state(spec: Spec, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``GPT2LMHeadModel`` state dict from ours (``sd``; biases it lacks become zeros)."""
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
        for mine, hf in NORMS:
            out[f"{theirs}.{hf}.weight"] = sd[f"{ours}.{mine}.scale"]
            out[f"{theirs}.{hf}.bias"] = sd[f"{ours}.{mine}.shift"]
        att = f"{ours}.att.sublayer"
        out[f"{theirs}.attn.c_attn.weight"] = torch.cat(  # (D, 3D), Conv1D is (in, out)
            [sd[f"{att}.{n}.weight"].t() for n in QKV], dim=1)
        out[f"{theirs}.attn.c_attn.bias"] = torch.cat([sd[f"{att}.{n}.bias"] for n in QKV])
        for mine, hf in LINEARS:
            out[f"{theirs}.{hf}.weight"] = sd[f"{ours}.{mine}.weight"].t()
            out[f"{theirs}.{hf}.bias"] = sd[f"{ours}.{mine}.bias"]
    warn_zero_biases(CLS, zeros)
    return out


def _biases(spec: Spec, d: int, hidden: int) -> list[tuple[str, int, str]]:
    """Every bias and norm shift GPT-2 has: (our key, size, what it is)."""
    out = [("final_norm.shift", d, "norm shifts")]
    for i in range(spec.n_layers):
        b = f"trf_blocks.{i}"
        out += [(f"{b}.{mine}.shift", d, "norm shifts") for mine, _ in NORMS]
        out += [(f"{b}.att.sublayer.{n}.bias", d, "q/k/v biases") for n in QKV]
        out += [(f"{b}.att.sublayer.out_proj.bias", d, "attention output bias"),
                (f"{b}.ff.sublayer.layers.0.bias", hidden, "feed-forward biases"),
                (f"{b}.ff.sublayer.layers.2.bias", d, "feed-forward biases")]
    return out
