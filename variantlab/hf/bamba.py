"""Bamba (IBM, Princeton, CMU, UIUC 2024, "Bamba: inference-efficient hybrid Mamba2
model"): ``BambaForCausalLM``.

Pre-norm RMSNorm layers, each a sequence mixer then a SwiGLU (``intermediate_size``,
``mlp_bias``): most layers' mixer is Mamba-2 (``linear_attention``: the layer kind ``mamba``,
``attention: {kind: mamba2, d_state: mamba_d_state, expand: mamba_expand, head_dim:
mamba_d_head, n_groups: mamba_n_groups, conv_width: mamba_d_conv, chunk_size:
mamba_chunk_size, bias: mamba_proj_bias, conv_bias: mamba_conv_bias}`` with the norm after
the gate, as Mamba-2's), the layers ``attn_layer_indices`` lists are grouped-query attention
(the kind ``attention``: the model's ``mha``) with rotary over half of each head (Bamba's
fixed ``partial_rotary_factor``). :func:`bamba_table` names every weight on both sides.

On export a spec whose layers are Mamba-2 or ``mha`` (one of each for all such layers) comes
here: pre-norm RMSNorm, a SwiGLU on every layer, rotary over half of each head.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    head_dim_of,
    layers,
    need,
    one,
    period,
    reject,
    rms_decoder,
    rope,
    rotary,
    token_ids,
)
from .gpt2 import hidden_of
from .mamba import MAMBA2_MIXER, mamba2_heads, mixer
from .table import GLU, Pair, attention, ends, linear, load_state, norms

CLS = "BambaForCausalLM"
_KINDS = {"linear_attention": "mamba", "full_attention": "attention"}


def bamba_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``BambaConfig``."""
    if cfg.hidden_act not in ("silu", "swish"):
        reject("hidden_act", cfg.hidden_act, "Bamba's Mamba-2 convolution uses it; only silu")
    if tuple(cfg.time_step_limit) != (0.0, float("inf")):
        reject("time_step_limit", cfg.time_step_limit, "dt clamping is not in mamba2; only "
               "(0.0, inf)")
    inner = int(cfg.mamba_expand * cfg.hidden_size)
    if cfg.mamba_n_heads * cfg.mamba_d_head != inner:
        reject("mamba_d_head", cfg.mamba_d_head, f"mamba_n_heads * mamba_d_head must equal "
               f"mamba_expand * hidden_size ({inner})")
    head_dim = head_dim_of(cfg)
    data = {
        **rms_decoder(cfg, bool(cfg.attention_bias)),
        "feedforward": {"kind": "glu", "hidden_dim": cfg.intermediate_size,
                        "bias": bool(cfg.mlp_bias)},
        "attention": {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads,
                      "head_dim": head_dim if head_dim * cfg.num_attention_heads
                      != cfg.hidden_size else None},
        "positional": rotary(cfg, partial=True, head_dim=head_dim),
    }
    mamba = {"kind": "mamba2", "d_state": cfg.mamba_d_state, "expand": cfg.mamba_expand,
             "head_dim": cfg.mamba_d_head, "n_groups": cfg.mamba_n_groups,
             "conv_width": cfg.mamba_d_conv, "chunk_size": cfg.mamba_chunk_size,
             "bias": bool(cfg.mamba_proj_bias), "conv_bias": bool(cfg.mamba_conv_bias),
             "norm_eps": cfg.rms_norm_eps}
    names = [_KINDS[t] for t in cfg.layers_block_type]
    data["layout"] = {"kinds": {"mamba": {"attention": mamba}, "attention": {}},
                      "pattern": period(names)}
    return data


def bamba_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``BambaForCausalLM`` of ``cfg`` and ours, both ways."""
    pairs = ends("model.final_layernorm")
    for i, kind in enumerate(cfg.layers_block_type):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "pre_ff_layernorm")
        for mine, name in GLU.items():
            pairs += linear(f"{ours}.ff.sublayer.{mine}", f"{theirs}.feed_forward.{name}",
                            bool(cfg.mlp_bias), "feed-forward biases")
        att = f"{ours}.att.sublayer"
        if kind == "full_attention":
            pairs += attention(att, f"{theirs}.self_attn", bool(cfg.attention_bias))
            continue
        pairs += mixer(att, f"{theirs}.mamba", MAMBA2_MIXER, bool(cfg.mamba_proj_bias),
                       bool(cfg.mamba_conv_bias))
    return pairs


def bamba_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``BambaForCausalLM``."""
    return load_state(bamba_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

#: Bamba's rotary share of each head (transformers sets it whatever the config says)
FRACTION = 0.5


def bamba_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``BambaConfig`` of a spec mixing Mamba-2 and attention layers."""
    import transformers

    specs = layers(spec, CLS, ("attention",))
    check_common(spec.model_copy(update={"layout": None}), CLS, norm="rms", rotary=False)
    check_dropout(spec, CLS, ())
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: Bamba is pre_norm")
    ff = spec.feedforward
    need(spec, CLS, "feedforward.kind", ff.kind == "glu",
         f"feedforward {ff.kind!r}: Bamba's feed-forward is a SwiGLU (glu)")
    need(spec, CLS, "activation.kind", spec.activation.kind == "silu",
         f"activation {spec.activation.kind!r}: Bamba uses silu (its convolution too)")
    pos = spec.positional
    need(spec, CLS, "positional.fraction", pos.kind == "rotary" and pos.fraction == FRACTION,
         f"Bamba rotates {FRACTION} of each head (rotary, fraction {FRACTION})")
    mixers = [layer.attention for layer in specs if layer.attention.kind == "mamba2"]
    atts = [layer.attention for layer in specs if layer.attention.kind != "mamba2"]
    for layer in specs:
        if layer.attention.kind != "mamba2":
            check_attention(layer, CLS, gqa=True, head_dim_free=False)
    ssm = one(spec, CLS, "layout.attention", mixers, "Mamba-2 mixers")
    att = one(spec, CLS, "layout.attention", atts, "attentions")
    need(spec, CLS, "qkv_bias", spec.qkv_bias == spec.attn_out_bias,
         "Bamba's attention_bias is on q/k/v and the output together")
    kwargs: dict[str, Any] = {}
    if ssm is not None:
        heads, head = mamba2_heads(spec, CLS, ssm, "layout.attention")
        kwargs = dict(mamba_n_heads=heads, mamba_d_head=head,
                      mamba_n_groups=ssm.n_groups, mamba_d_state=ssm.d_state,
                      mamba_d_conv=ssm.conv_width, mamba_expand=ssm.expand,
                      mamba_chunk_size=ssm.chunk_size, mamba_conv_bias=ssm.conv_bias,
                      mamba_proj_bias=ssm.bias)
    config = transformers.BambaConfig
    return config(
        **token_ids(spec, config), **kwargs, vocab_size=spec.vocab_size,
        max_position_embeddings=spec.context_length, hidden_size=spec.emb_dim,
        num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=getattr(att, "n_kv_heads", None) or spec.n_heads,
        intermediate_size=hidden_of(spec), mlp_bias=ff.bias, attention_bias=spec.qkv_bias,
        rms_norm_eps=spec.norm.eps, rope_parameters=rope(pos, False, spec.context_length, CLS),
        attn_layer_indices=[i for i, layer in enumerate(specs)
                            if layer.attention.kind != "mamba2"],
        tie_word_embeddings=spec.tie_weights)
