"""EXAONE 4.0, both ways: ``Exaone4ForCausalLM`` (LG AI Research 2025, "EXAONE 4.0: unified
large language models integrating non-reasoning and reasoning modes").

A Llama decoder with norms on each sublayer's output (``residual: post_sublayer``:
post_attention_layernorm, post_feedforward_layernorm), a per-head QK RMSNorm, and, with a
``sliding_window``, a layout from ``layer_types``: ``sliding`` layers attend within the
window and rotate, ``full`` layers attend to everything and do not rotate (NoPE,
``positional: none``). On export a ``post_sublayer`` spec with a per-head QK-norm goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, layer_types, llama_options, typed_layers


def exaone4_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of an ``Exaone4Config``."""
    data = decoder_spec(cfg, eps=cfg.rms_norm_eps)
    data["residual"] = {"kind": "post_sublayer"}
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "head"
    typed_layers(cfg, data, nope_full=True)
    return data


def exaone4_layer(cfg: Any) -> Layer:
    return Layer(residual="post_sublayer",
                 norms=("post_attention_layernorm", "post_feedforward_layernorm"),
                 qk_norms=("q_norm", "k_norm"))


def exaone4_options(spec: Spec) -> dict[str, Any]:
    types, window, positionals = layer_types(spec)
    rotary = positionals.get("sliding_attention", positionals.get("full_attention"))
    base = spec.model_copy(update={"attention": spec.layer_spec(0).attention,
                                   "positional": rotary or spec.positional})
    options = llama_options(base, layer_types=types, sliding_window=window,
                            sliding_window_pattern=None)
    return options


EXAONE4 = Family("Exaone4ForCausalLM", "Exaone4Config", exaone4_spec, exaone4_layer,
                 exaone4_options)
