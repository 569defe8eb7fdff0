"""StableLM (2), both ways: ``StableLmForCausalLM`` (Bellagente et al. 2024, "Stable LM 2
1.6B technical report").

A Llama-like decoder with LayerNorm (with shift, ``layer_norm_eps``), rotary over the first
``partial_rotary_factor`` of each head, q/k/v biases with ``use_qkv_bias`` (the output
projection has none) and, with ``use_parallel_residual``, a parallel block reading one norm
(``residual: {kind: parallel, shared_norm: true}``), else pre-norm. Refused: per-head QK
LayerNorms (``qk_layernorm``, a weight per head) and ``hidden_dropout`` (StableLM drops the
feed-forward branch only). On export a parallel shared-norm ``glu`` spec with a norm shift
goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec, reject
from .decoder import Family, Layer, decoder_spec, llama_options


def stablelm_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``StableLmConfig``."""
    if cfg.qk_layernorm:
        reject("qk_layernorm", True, "StableLM's QK LayerNorms have a weight per head; "
               "variantlab's qk_norm shares one across heads")
    if cfg.hidden_dropout:
        reject("hidden_dropout", cfg.hidden_dropout, "StableLM drops the feed-forward branch "
               "only; variantlab's resid_drop_rate drops both branches")
    data = decoder_spec(cfg, eps=cfg.layer_norm_eps, norm="layer", norm_bias=True,
                        qkv_bias=cfg.use_qkv_bias, partial=True)
    if cfg.use_parallel_residual:
        data["residual"] = {"kind": "parallel", "shared_norm": True}
    return data


def stablelm_layer(cfg: Any) -> Layer:
    parallel = bool(cfg.use_parallel_residual)
    return Layer(residual="parallel" if parallel else "pre_norm",
                 norms=("input_layernorm",) if parallel else
                 ("input_layernorm", "post_attention_layernorm"),
                 qkv_bias=bool(cfg.use_qkv_bias), norm_shift=True)


def stablelm_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, layer_norm_eps=spec.norm.eps, use_qkv_bias=spec.qkv_bias,
                            use_parallel_residual=spec.residual.kind == "parallel")
    options["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    del options["rms_norm_eps"], options["head_dim"]
    return options


STABLELM = Family("StableLmForCausalLM", "StableLmConfig", stablelm_spec, stablelm_layer,
                  stablelm_options)
