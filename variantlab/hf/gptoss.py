"""gpt-oss, both ways: ``GptOssForCausalLM`` (OpenAI 2025, gpt-oss-120b & gpt-oss-20b model
card).

A Llama-like pre-norm decoder (RMSNorm, grouped-query attention with biases, rotary) whose
attention has sinks (``attention.sinks``: a learned logit per head in the softmax, with no
value), alternating sliding-window and full layers (``layer_types``: a layout of ``sliding``
and ``full`` layer kinds), and a mixture of experts on every layer: the router a biased Linear
whose top-k logits are soft-maxed (``router: topk_softmax``, ``router_bias``), each expert a
biased clamped SwiGLU (``expert: {kind: clamped_swiglu, alpha: swiglu_alpha, limit:
swiglu_limit, bias: true}``). Transformers stores the experts transposed, gate and up
interleaved: ``gate_up_proj`` (E, D, 2 x hidden) with gate columns 0, 2, 4, ... and up
columns 1, 3, 5, ..., ``down_proj`` (E, hidden, D). :func:`gptoss_table` names every weight
on both sides; on export a router or expert bias the variant lacks becomes zeros.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    check_moe,
    layers,
    need,
    one,
    period,
    reject,
    rope,
    token_ids,
)
from .llama import llama_spec
from .table import Pair, attention, ends, halves, linear, load_state, norms, same, transposed

CLS = "GptOssForCausalLM"
_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def gptoss_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``GptOssConfig``."""
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - set(_KINDS))
    if unknown:
        reject("layer_types", unknown, f"supported layer types: {', '.join(_KINDS)}")
    data = llama_spec(cfg)
    data["attention"]["sinks"] = True
    data["feedforward"] = {
        "kind": "moe", "n_experts": int(cfg.num_local_experts),
        "top_k": int(cfg.num_experts_per_tok), "router": "topk_softmax", "router_bias": True,
        "expert": {"kind": "clamped_swiglu", "hidden_dim": int(cfg.intermediate_size),
                   "bias": True, "alpha": float(cfg.swiglu_alpha),
                   "limit": float(cfg.swiglu_limit)},
        "aux_loss_coef": float(cfg.router_aux_loss_coef) if cfg.output_router_logits else 0.0}
    if "sliding_attention" in types:
        sliding = {"attention": {**data["attention"], "window": int(cfg.sliding_window)}}
        if "full_attention" not in types:
            data["attention"] = sliding["attention"]
        else:
            data["layout"] = {"kinds": {"sliding": sliding, "full": {}},
                              "pattern": [_KINDS[t] for t in period(types)]}
    return data


def gptoss_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``GptOssForCausalLM`` of ``cfg`` and ours, both ways."""
    pairs = ends()
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "post_attention_layernorm")
        pairs += attention(f"{ours}.att.sublayer", f"{theirs}.self_attn", cfg.attention_bias)
        pairs.append(same(f"{ours}.att.sublayer.sinks", f"{theirs}.self_attn.sinks"))
        ff, experts = f"{ours}.ff.sublayer", f"{theirs}.mlp.experts"
        pairs += linear(f"{ff}.gate", f"{theirs}.mlp.router", True, "router bias")
        pairs += [  # gate_up_proj (E, D, 2 hidden): transposed, gate and up interleaved
            halves((f"{ff}.W_gate", f"{ff}.W_up"), f"{experts}.gate_up_proj", dim=1,
                   transposed=True, interleaved=True),
            halves((f"{ff}.b_gate", f"{ff}.b_up"), f"{experts}.gate_up_proj_bias", dim=1,
                   interleaved=True, zeros="expert biases"),
            transposed(f"{ff}.W_down", f"{experts}.down_proj"),  # (E, hidden, D)
            same(f"{ff}.b_down", f"{experts}.down_proj_bias", "expert biases")]
    return pairs


def gptoss_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GptOssForCausalLM``."""
    return load_state(gptoss_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def gptoss_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``GptOssConfig`` of a spec with attention sinks."""
    import transformers

    specs = layers(spec, CLS, ("attention",))
    check_common(spec.model_copy(update={"layout": None}), CLS, norm="rms", rotary=True)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: gpt-oss is pre_norm")
    check_dropout(spec, CLS, ("attn",))
    for layer in specs:
        check_attention(layer, CLS, gqa=True, head_dim_free=True, window=True, sinks=True)
        need(spec, CLS, "layout.attention.sinks", layer.attention.sinks,
             "gpt-oss has sinks in every layer's attention")
    base = one(spec, CLS, "layout.attention", [
        layer.attention.model_copy(update={"window": None}) for layer in specs],
        "attentions (apart from the window)")
    windows = [layer.attention.window for layer in specs]
    window = one(spec, CLS, "layout.attention.window", [w for w in windows if w], "windows")
    ff = spec.feedforward
    check_moe(spec, CLS, ff, "feedforward", expert="clamped_swiglu", router="topk_softmax",
              free=("renormalize", "router_bias"))
    config = transformers.GptOssConfig
    return config(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads, num_key_value_heads=base.n_kv_heads or spec.n_heads,
        head_dim=base.head_dim or spec.emb_dim // spec.n_heads,
        intermediate_size=ff.expert.hidden(spec.emb_dim), rms_norm_eps=spec.norm.eps,
        attention_bias=spec.qkv_bias or spec.attn_out_bias, attention_dropout=spec.drop("attn"),
        tie_word_embeddings=spec.tie_weights,
        rope_parameters=rope(spec.positional, False, spec.context_length, cls=cls),
        num_local_experts=ff.n_experts, num_experts_per_tok=ff.top_k,
        swiglu_alpha=ff.expert.alpha, swiglu_limit=ff.expert.limit,
        output_router_logits=ff.aux_loss_coef > 0,
        router_aux_loss_coef=ff.aux_loss_coef if ff.aux_loss_coef > 0 else 0.001,
        sliding_window=window or spec.context_length,
        layer_types=["sliding_attention" if w else "full_attention" for w in windows],
        **token_ids(spec, config))
