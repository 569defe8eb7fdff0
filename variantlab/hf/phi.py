"""Phi-1 / Phi-1.5 / Phi-2, both ways: ``PhiForCausalLM`` (Gunasekar et al. 2023, "Textbooks
are all you need"; Li et al. 2023).

A parallel block with one LayerNorm (``residual: {kind: parallel, shared_norm: true}``,
with shift), a plain MLP (fc1, fc2, biased; ``gelu_new``), biased q/k/v and output (dense)
projections, rotary over the first ``partial_rotary_factor`` of each head, optional
LayerNorms on queries and keys shared across heads (``qk_layernorm``: ``qk_norm: {kind:
layer}``, scope ``head``), a biased output head (``head_bias: true``) and the dropouts
``embd_pdrop``, ``attention_dropout``, ``resid_pdrop``. On export a spec with
``head_bias`` goes here.
"""

from __future__ import annotations

from typing import Any

from .common import Spec
from .decoder import Family, Layer, decoder_spec, llama_options


def phi_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``PhiConfig``."""
    data = decoder_spec(cfg, eps=cfg.layer_norm_eps, norm="layer", norm_bias=True,
                        qkv_bias=True, out_bias=True, ffn="mlp", ffn_bias=True, partial=True,
                        drops=(cfg.embd_pdrop, cfg.attention_dropout, cfg.resid_pdrop))
    data["residual"] = {"kind": "parallel", "shared_norm": True}
    data["head_bias"] = True
    if cfg.qk_layernorm:
        data["attention"]["qk_norm"] = {"kind": "layer", "eps": float(cfg.layer_norm_eps)}
        data["attention"]["qk_norm_scope"] = "head"
    return data


def phi_layer(cfg: Any) -> Layer:
    return Layer(residual="parallel", norms=("input_layernorm",),
                 projections={"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj",
                              "out_proj": "dense"},
                 qkv_bias=True, out_bias=True, ffn={"layers.0": "fc1", "layers.2": "fc2"},
                 ffn_bias=True, norm_shift=True, final_norm="final_layernorm",
                 lm_head_bias=True,
                 qk_norms=("q_layernorm", "k_layernorm") if cfg.qk_layernorm else None)


def phi_options(spec: Spec) -> dict[str, Any]:
    options = llama_options(spec, layer_norm_eps=spec.norm.eps,
                            qk_layernorm=spec.attention.qk_norm is not None,
                            embd_pdrop=spec.drop("emb"), resid_pdrop=spec.drop("resid"))
    options["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    del options["rms_norm_eps"], options["head_dim"]
    return options


PHI = Family("PhiForCausalLM", "PhiConfig", phi_spec, phi_layer, phi_options,
             dropouts=("emb", "attn", "resid"))
