"""Qwen2 and Qwen2.5, both ways: ``Qwen2ForCausalLM`` (Yang et al. 2024, "Qwen2 Technical
Report"; Qwen2.5 is the same class). A Llama decoder whose query, key and value projections
have biases and whose output projection has none (``qkv_bias: true``, ``attn_out_bias:
false``); Qwen2.5's long-context configs add YaRN rope scaling (the rotary's ``scaling:
yarn``). Qwen2's sliding windows (``use_sliding_window``) are refused. :func:`qwen2_table`
names every weight on both sides (Llama's names).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import Spec, check_attention, check_common, hf_activation, need, reject, rope, token_ids
from .llama import llama_kwargs, llama_spec
from .table import ATTENTION, GLU, Pair, ends, glu, linear, load_state, norms

CLS = "Qwen2ForCausalLM"


def qwen2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Qwen2Config``."""
    if getattr(cfg, "use_sliding_window", False):
        reject("use_sliding_window", True, "Qwen2's sliding windows on the layers past "
               "max_window_layers are not imported; set it false")
    data = llama_spec(cfg)
    data.update(qkv_bias=True, attn_out_bias=False)
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
    """The ``Qwen2Config`` of a Llama-like spec with query, key and value biases only."""
    import transformers

    check_common(spec, CLS, norm="rms", rotary=True)
    check_attention(spec, CLS, gqa=True, head_dim_free=False)
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
                  rope_parameters=rope(spec.positional, False, spec.context_length, CLS))
