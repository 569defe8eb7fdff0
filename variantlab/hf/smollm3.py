"""SmolLM3, both ways: ``SmolLM3ForCausalLM`` (Hugging Face 2025, "SmolLM3: smol,
multilingual, long-context reasoner"; NoPE layers after Yang et al. 2025, "Rope to Nope and
back again").

A Llama decoder whose rotary is dropped in the layers ``no_rope_layers`` marks 0 (by default
every ``no_rope_layer_interval``-th layer): a ``layout`` with the layer kinds ``rope`` (the
model's own rotary) and ``nope`` (``positional: none``), and, with ``use_sliding_window``, a
sliding window on the layers ``layer_types`` marks ``sliding_attention`` (kinds
``rope_sliding`` / ``nope_sliding``), each with the shortest repeating ``pattern``. On export a
spec whose layers differ only in NoPE and the window goes here. :func:`smollm3_table` names
every weight on both sides.
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
    period,
    reject,
    rotary_parameters,
    sliding_windows,
    token_ids,
)
from .llama import llama_kwargs, llama_spec
from .table import GLU, Pair, attention, ends, linear, load_state, norms

CLS = "SmolLM3ForCausalLM"


def smollm3_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``SmolLM3Config``."""
    data = llama_spec(cfg)
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        reject("layer_types", unknown, "supported layer types: sliding_attention, "
               "full_attention")
    sliding = [bool(cfg.use_sliding_window) and t == "sliding_attention" for t in types]
    names = [("rope" if rope else "nope") + ("_sliding" if window else "")
             for rope, window in zip(cfg.no_rope_layers, sliding)]
    kinds: dict[str, dict[str, Any]] = {}
    for name in names:
        slots: dict[str, Any] = {}
        if name.startswith("nope"):
            slots["positional"] = {"kind": "none"}
        if name.endswith("_sliding"):
            slots["attention"] = {**data["attention"], "window": int(cfg.sliding_window)}
        kinds[name] = slots
    if any(kinds.values()):
        data["layout"] = {"kinds": kinds, "pattern": period(names)}
    return data


def smollm3_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``SmolLM3ForCausalLM`` of ``cfg`` and ours (Llama's names)."""
    pairs = ends()
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "post_attention_layernorm")
        pairs += attention(f"{ours}.att.sublayer", f"{theirs}.self_attn", cfg.attention_bias)
        for mine, name in GLU.items():
            pairs += linear(f"{ours}.ff.sublayer.{mine}", f"{theirs}.mlp.{name}", cfg.mlp_bias)
    return pairs


def smollm3_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``SmolLM3ForCausalLM``."""
    return load_state(smollm3_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def smollm3_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``SmolLM3Config`` of a Llama-like spec with NoPE layers (and sliding windows)."""
    import transformers

    specs = layers(spec, CLS, ("attention", "positional"))
    parameters = rotary_parameters(spec, CLS, specs)
    check_common(spec.model_copy(update={"layout": None}), CLS, norm="rms", rotary=False)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: SmolLM3 is pre_norm")
    windows, window = sliding_windows(spec, CLS, specs)
    kwargs = llama_kwargs(spec, CLS)
    kwargs.pop("head_dim")
    config = transformers.SmolLM3Config
    return config(
        **kwargs, **token_ids(spec, config), hidden_act=hf_activation(spec, CLS),
        mlp_bias=spec.feedforward.bias,
        rope_parameters=parameters,
        no_rope_layers=[int(layer.positional.kind == "rotary") for layer in specs],
        use_sliding_window=window is not None, sliding_window=window,
        layer_types=["sliding_attention" if w else "full_attention" for w in windows])
