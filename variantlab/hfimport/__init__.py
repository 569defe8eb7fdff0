"""Import a Hugging Face ``transformers`` causal LM into variantlab: ``(spec, model)``.

``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``MistralForCausalLM``, ``GPTNeoXForCausalLM``,
``Qwen3ForCausalLM``, ``Olmo2ForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``,
``MixtralForCausalLM``, ``Qwen3MoeForCausalLM``, ``OlmoeForCausalLM``, ``Mamba2ForCausalLM``,
``JambaForCausalLM``, ``Qwen3NextForCausalLM``, ``DeepseekV2ForCausalLM`` and
``DeepseekV3ForCausalLM`` (one module per family;
see docs/transformers.md). Other classes and config options that variantlab cannot
express raise :class:`ConversionError` naming them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..model.build import build_model
from ..model.specs import ModelSpec, parse_model_spec
from ..plugin.registry import Registry
from .common import ConversionError
from .deepseek import deepseek_state, deepseek_v2_spec, deepseek_v3_spec
from .gemma import gemma_spec, gemma_state
from .gpt2 import gpt2_spec, gpt2_state
from .llama import llama_spec, llama_state, mistral_spec, olmo2_spec, olmo2_state, qwen3_spec, qwen3_state
from .mamba import jamba_spec, jamba_state, mamba2_spec, mamba2_state
from .moe import mixtral_spec, mixtral_state, olmoe_spec, olmoe_state, qwen3moe_spec, qwen3moe_state
from .neox import neox_spec, neox_state
from .qwen3next import qwen3next_spec, qwen3next_state

__all__ = ["CONVERTERS", "ConversionError", "from_transformers", "spec_yaml"]

Converter = tuple[Callable[[Any], dict[str, Any]], Callable[[Any], dict[str, torch.Tensor]]]

#: class name -> (config -> spec data, HF model -> our state dict)
CONVERTERS: dict[str, Converter] = {
    "DeepseekV2ForCausalLM": (deepseek_v2_spec, deepseek_state),
    "DeepseekV3ForCausalLM": (deepseek_v3_spec, deepseek_state),
    "GPT2LMHeadModel": (gpt2_spec, gpt2_state),
    "Gemma2ForCausalLM": (gemma_spec, gemma_state),
    "Gemma3ForCausalLM": (gemma_spec, gemma_state),
    "GPTNeoXForCausalLM": (neox_spec, neox_state),
    "JambaForCausalLM": (jamba_spec, jamba_state),
    "LlamaForCausalLM": (llama_spec, llama_state),
    "Mamba2ForCausalLM": (mamba2_spec, mamba2_state),
    "MistralForCausalLM": (mistral_spec, llama_state),
    "MixtralForCausalLM": (mixtral_spec, mixtral_state),
    "OlmoeForCausalLM": (olmoe_spec, olmoe_state),
    "Olmo2ForCausalLM": (olmo2_spec, olmo2_state),
    "Qwen3ForCausalLM": (qwen3_spec, qwen3_state),
    "Qwen3MoeForCausalLM": (qwen3moe_spec, qwen3moe_state),
    "Qwen3NextForCausalLM": (qwen3next_spec, qwen3next_state),
}


def from_transformers(hf_model: Any, registry: Registry, impl: str = "naive",
                      ) -> tuple[ModelSpec, torch.nn.Module]:
    """The variantlab spec equal to ``hf_model`` and a variantlab model holding copies of its
    weights (logits equal in float32), built with the built-in components of ``registry``.
    ``impl`` picks the implementation of the mha and mla attentions."""
    name = type(hf_model).__name__
    if name not in CONVERTERS:
        raise ConversionError.at(["transformers"], f"class {name} is not supported; "
                                 f"supported: {', '.join(sorted(CONVERTERS))}")
    make_spec, make_state = CONVERTERS[name]
    data = make_spec(hf_model.config)
    for slots in [data, *(data.get("layout") or {}).get("kinds", {}).values()]:
        if "attention" in slots and slots["attention"].get("kind", "mha") in ("mha", "mla"):
            slots["attention"]["impl"] = impl  # the sequence mixers keep their chunked form
    spec = parse_model_spec(data, registry)
    model = build_model(spec, registry)
    state = {k: v.detach().clone() for k, v in make_state(hf_model).items()}
    if spec.tie_weights:
        state.pop("out_head.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    left = [k for k in missing if not (spec.tie_weights and k == "out_head.weight")]
    if left or unexpected:
        raise ConversionError.at(["transformers"], f"weight mapping for {name} incomplete: "
                                 f"missing {left}, unexpected {unexpected}")
    return spec, model


def spec_yaml(spec: ModelSpec, name: str = "imported") -> str:
    """``spec`` as the ``model:`` of a minimal experiment YAML file (edit a slot, add
    ``variants``/``measure``, run it); the ``model`` mapping loads back to an equal spec."""
    import yaml

    doc = {"name": name, "seeds": [0], "model": spec.to_data()}
    return yaml.safe_dump(doc, sort_keys=False)
