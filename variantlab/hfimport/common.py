"""What every importer shares: the error, config reading (rotary, activation, dropout) and
weight slicing helpers."""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from ..errors import SpecError


class ConversionError(SpecError):
    """A transformers class or config option that variantlab cannot express exactly."""


def reject(name: str, value: Any, why: str) -> NoReturn:
    """Raise a :class:`ConversionError` naming the config option ``name`` and its value."""
    raise ConversionError.at(["transformers", name], f"config option {name}={value!r}: {why}")


#: Hugging Face ``hidden_act`` / ``activation_function`` names (transformers.activations.ACT2FN)
#: and the registered activation that computes the same function
ACTIVATIONS: dict[str, dict[str, Any]] = {
    "gelu": {"kind": "gelu", "approximate": "none"},
    "gelu_new": {"kind": "gelu", "approximate": "tanh"},
    "gelu_pytorch_tanh": {"kind": "gelu", "approximate": "tanh"},
    "relu": {"kind": "relu"},
    "relu2": {"kind": "relu2"},
    "silu": {"kind": "silu"},
    "swish": {"kind": "silu"},
}


def activation(name: str, value: Any) -> dict[str, Any]:
    """The activation spec for the config option ``name`` (e.g. ``hidden_act``) = ``value``."""
    if not isinstance(value, str) or value not in ACTIVATIONS:
        reject(name, value, f"supported: {', '.join(sorted(ACTIVATIONS))}")
    return dict(ACTIVATIONS[value])


def rope_params(cfg: Any) -> dict[str, Any]:
    """The rotary settings: ``rope_parameters`` (transformers 5), or ``rope_scaling`` plus
    the separate attributes of older versions (``rope_theta`` / GPT-NeoX's
    ``rotary_emb_base``, ``partial_rotary_factor`` / GPT-NeoX's ``rotary_pct``), as one dict."""
    params = getattr(cfg, "rope_parameters", None)
    if params is None:
        params = dict(getattr(cfg, "rope_scaling", None) or {})
        theta = getattr(cfg, "rope_theta", None) or getattr(cfg, "rotary_emb_base", None)
        fraction = getattr(cfg, "partial_rotary_factor", None) or getattr(cfg, "rotary_pct", 1.0)
        params.setdefault("rope_theta", theta)
        params.setdefault("partial_rotary_factor", fraction)
    return dict(params)


def rotary(cfg: Any, partial: bool, head_dim: int) -> dict[str, Any]:
    """The ``rotary`` positional spec of ``cfg``; refuses scaled rotary (any ``rope_type``
    but ``default``) and partial rotary where the model has none (``partial`` false). An odd
    ``r = int(head_dim * fraction)`` gets ``odd_rounding: up``: Hugging Face's ``inv_freq``
    has ceil(r/2) frequencies theta^(-2i/r), each turning a pair, so r + 1 dims rotate."""
    params = rope_params(cfg)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        reject("rope_scaling", params, f"rope_type {rope_type!r} (scaled rotary) is not "
               "supported; only unscaled rotary (rope_type 'default')")
    theta = params.get("rope_theta")
    if theta is None:
        reject("rope_theta", theta, "a rotary base is needed")
    fraction = float(params.get("partial_rotary_factor", 1.0) or 1.0)
    if fraction != 1.0 and not partial:
        reject("partial_rotary_factor", fraction, "this class rotates every head dim")
    out = {"kind": "rotary", "theta": float(theta), "fraction": fraction}
    if int(head_dim * fraction) % 2:
        if int(head_dim * fraction) + 1 > head_dim:
            reject("partial_rotary_factor", fraction, f"rotates int({head_dim} * {fraction}) "
                   "dims, an odd count that rounded up to a pair exceeds the head")
        out["odd_rounding"] = "up"
    return out


def dropouts(emb: float, attn: float, resid: float) -> dict[str, float]:
    """The model's three dropout rates (``drop_rate`` itself 0)."""
    return {"drop_rate": 0.0, "emb_drop_rate": float(emb), "attn_drop_rate": float(attn),
            "resid_drop_rate": float(resid)}


def head_dim_of(cfg: Any) -> int:
    """The width of each attention head (``head_dim``, or hidden_size // num_attention_heads)."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def linear(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor], theirs: str,
           bias: bool) -> None:
    """Copy a Linear's weight (and bias when it has one) from ``theirs`` to ``ours``."""
    out[f"{ours}.weight"] = sd[f"{theirs}.weight"]
    if bias:
        out[f"{ours}.bias"] = sd[f"{theirs}.bias"]


def norm(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor], theirs: str,
         shift: bool) -> None:
    """Copy a norm's scale (``weight``) and, for LayerNorm, its shift (``bias``)."""
    out[f"{ours}.scale"] = sd[f"{theirs}.weight"]
    if shift:
        out[f"{ours}.shift"] = sd[f"{theirs}.bias"]


def rms_decoder(cfg: Any, bias: bool) -> dict[str, Any]:
    """The model keys every Llama-like config shares (pre-norm RMSNorm decoder, no feed-
    forward or norm biases; ``bias`` on the attention projections); the caller adds the
    feed-forward, attention and positional."""
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(0.0, getattr(cfg, "attention_dropout", 0.0) or 0.0, 0.0),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": False, "norm_bias": False,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "rms", "eps": cfg.rms_norm_eps},
        "activation": activation("hidden_act", cfg.hidden_act),
    }


def ends_state(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Token embedding, final norm and output head of a ``model.*`` / ``lm_head`` model."""
    return {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
            "final_norm.scale": sd["model.norm.weight"], "out_head.weight": sd["lm_head.weight"]}
