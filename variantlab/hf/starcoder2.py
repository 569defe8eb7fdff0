"""StarCoder 2, both ways: ``Starcoder2ForCausalLM`` (Lozhkov et al. 2024, "StarCoder 2 and
The Stack v2").

A pre-norm decoder with LayerNorm (with shift, ``norm_epsilon``), a plain MLP (c_fc, c_proj)
and attention projections biased together (``use_bias``), grouped-query attention, rotary,
and a sliding window on every layer when ``sliding_window`` is set; dropouts
``embedding_dropout``, ``attention_dropout``, ``residual_dropout``. On export a rotary
pre-norm LayerNorm spec with grouped-query heads or a window goes here (without either:
GPT-NeoX).
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, llama_options


def starcoder2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Starcoder2Config``."""
    bias = bool(cfg.use_bias)
    data = decoder_spec(cfg, eps=cfg.norm_epsilon, norm="layer", norm_bias=True, qkv_bias=bias,
                        out_bias=bias, ffn="mlp", ffn_bias=bias,
                        drops=(cfg.embedding_dropout, cfg.attention_dropout,
                               cfg.residual_dropout))
    if cfg.sliding_window is not None:
        data["attention"]["window"] = int(cfg.sliding_window)
    return data


def starcoder2_layer(cfg: Any) -> Layer:
    bias = bool(cfg.use_bias)
    return Layer(qkv_bias=bias, out_bias=bias, ffn={"layers.0": "c_fc", "layers.2": "c_proj"},
                 ffn_bias=bias, norm_shift=True)


def starcoder2_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, norm_epsilon=spec.norm.eps, use_bias=spec.qkv_bias or spec.attn_out_bias,
                            sliding_window=spec.attention.window,
                            embedding_dropout=spec.drop("emb"),
                            residual_dropout=spec.drop("resid"))
    del options["rms_norm_eps"]
    return options


STARCODER2 = Family("Starcoder2ForCausalLM", "Starcoder2Config", starcoder2_spec,
                    starcoder2_layer, starcoder2_options, dropouts=("emb", "attn", "resid"))
