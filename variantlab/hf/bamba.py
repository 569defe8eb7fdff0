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
"""

from __future__ import annotations

from typing import Any

import torch

from .common import head_dim_of, period, reject, rms_decoder, rotary
from .table import Pair, attention, ends, linear, load_state, norms, same

CLS = "BambaForCausalLM"
_KINDS = {"linear_attention": "mamba", "full_attention": "attention"}
#: the Mamba-2 mixer's parameters (the same names on both sides)
MIXER = ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight",
         "out_proj.weight")


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
        for mine, name in (("W_gate", "gate_proj"), ("W_up", "up_proj"), ("W_down", "down_proj")):
            pairs += linear(f"{ours}.ff.sublayer.{mine}", f"{theirs}.feed_forward.{name}",
                            bool(cfg.mlp_bias), "feed-forward biases")
        att = f"{ours}.att.sublayer"
        if kind == "full_attention":
            pairs += attention(att, f"{theirs}.self_attn", bool(cfg.attention_bias))
            continue
        pairs += [same(f"{att}.{name}", f"{theirs}.mamba.{name}") for name in MIXER]
        if cfg.mamba_conv_bias:
            pairs.append(same(f"{att}.conv1d.bias", f"{theirs}.mamba.conv1d.bias"))
        if cfg.mamba_proj_bias:
            pairs += [same(f"{att}.in_proj.bias", f"{theirs}.mamba.in_proj.bias"),
                      same(f"{att}.out_proj.bias", f"{theirs}.mamba.out_proj.bias")]
    return pairs


def bamba_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``BambaForCausalLM``."""
    return load_state(bamba_table(hf.config), hf.state_dict())
