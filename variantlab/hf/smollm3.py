"""SmolLM3: ``SmolLM3ForCausalLM`` (Hugging Face 2025, "SmolLM3: smol, multilingual,
long-context reasoner"; NoPE layers after Yang et al. 2025, "Rope to Nope and back again").

A Llama decoder whose rotary is dropped in the layers ``no_rope_layers`` marks 0 (by default
every ``no_rope_layer_interval``-th layer): a ``layout`` with the layer kinds ``rope`` (the
model's own rotary) and ``nope`` (``positional: none``), and, with ``use_sliding_window``, a
sliding window on the layers ``layer_types`` marks ``sliding_attention`` (kinds
``rope_sliding`` / ``nope_sliding``), each with the shortest repeating ``pattern``.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import period, reject
from .llama import llama_spec, llama_state


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


def smollm3_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``SmolLM3ForCausalLM`` (Llama's names)."""
    return llama_state(hf)
