"""Qwen2 and Qwen2.5, both ways: ``Qwen2ForCausalLM`` (Yang et al. 2024, "Qwen2 Technical
Report"; Qwen2.5 is the same class). A Llama decoder whose query, key and value projections
have biases and whose output projection has none (``qkv_bias: true``, ``attn_out_bias:
false``); Qwen2.5's long-context configs add YaRN rope scaling (the rotary's ``scaling:
yarn``). With ``use_sliding_window``, the layers ``layer_types`` marks ``sliding_attention``
(by default those from ``max_window_layers`` on) get ``attention.window: sliding_window``: a
``layout`` whose kind ``sliding`` holds them. :func:`qwen2_table` names every weight on both
sides (Llama's names).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_common,
    hf_activation,
    layers,
    need,
    reject,
    rope,
    sliding_windows,
    token_ids,
)
from .llama import llama_kwargs, llama_spec
from .table import ATTENTION, GLU, Pair, ends, glu, linear, load_state, norms

CLS = "Qwen2ForCausalLM"


def qwen2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Qwen2Config``."""
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        reject("layer_types", unknown, "supported layer types: sliding_attention, "
               "full_attention")
    data = llama_spec(cfg)
    data.update(qkv_bias=True, attn_out_bias=False)
    window = int(cfg.sliding_window or 0) if getattr(cfg, "use_sliding_window", False) else 0
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention" and window]
    if len(sliding) == len(types):
        data["attention"]["window"] = window
    elif sliding:
        data["layout"] = {"kinds": {"sliding": {"attention": {**data["attention"],
                                                              "window": window}}},
                          "layers": dict.fromkeys(sliding, "sliding")}
    return data


def qwen2_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``Qwen2ForCausalLM`` of ``cfg`` and ours."""
    pairs = ends()
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "post_attention_layernorm")
        for mine, name in ATTENTION.items():
            pairs += linear(f"{ours}.att.sublayer.{mine}", f"{theirs}.self_attn.{name}",
                            name != "o_proj")
        pairs += glu(f"{ours}.ff.sublayer", f"{theirs}.mlp", GLU)
    return pairs


def qwen2_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``Qwen2ForCausalLM``."""
    return load_state(qwen2_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def qwen2_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``Qwen2Config`` of a Llama-like spec with query, key and value biases only (its
    layers may differ in their sliding window, one for all)."""
    import transformers

    specs = layers(spec, CLS, ("attention",))
    check_common(spec.model_copy(update={"layout": None}), CLS, norm="rms", rotary=True)
    windows, window = sliding_windows(spec, CLS, specs)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: Qwen2 is pre_norm")
    need(spec, CLS, "qkv_bias", spec.qkv_bias, "Qwen2's query, key and value projections "
         "have biases")
    need(spec, CLS, "attn_out_bias", not spec.attn_out_bias, "Qwen2's output projection "
         "has no bias")
    need(spec, CLS, "feedforward.bias", not spec.feedforward.bias,
         "Qwen2's feed-forward has no biases")
    kwargs = llama_kwargs(spec, CLS)
    for name in ("head_dim", "attention_bias"):
        kwargs.pop(name)
    config = transformers.Qwen2Config
    return config(**kwargs, **token_ids(spec, config), hidden_act=hf_activation(spec, CLS),
                  rope_parameters=rope(spec.positional, False, spec.context_length, CLS),
                  use_sliding_window=window is not None, sliding_window=window,
                  layer_types=["sliding_attention" if w else "full_attention" for w in windows])
