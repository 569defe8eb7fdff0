"""Hugging Face ``transformers`` causal LMs, both ways, one module per model family (each
holding its import and its export around one table of weight names; see
docs/transformers.md).

Import (:func:`from_transformers`): ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
``MistralForCausalLM``, ``GPTNeoXForCausalLM``, ``Qwen3ForCausalLM``, ``Olmo2ForCausalLM``,
``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``, ``MixtralForCausalLM``, ``Qwen3MoeForCausalLM``,
``OlmoeForCausalLM``, ``Mamba2ForCausalLM``, ``JambaForCausalLM``, ``Qwen3NextForCausalLM``,
``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``, ``GptOssForCausalLM``,
``SmolLM3ForCausalLM``, ``Llama4ForCausalLM`` (text), ``Lfm2ForCausalLM``,
``FalconH1ForCausalLM``, ``Qwen2ForCausalLM``, ``Phi3ForCausalLM``, the GPT-2-era and
state-space ``FalconForCausalLM``, ``GPTJForCausalLM``, ``OPTForCausalLM``,
``BloomForCausalLM``, ``MptForCausalLM``, ``GPTBigCodeForCausalLM``, ``MambaForCausalLM`` and
``BambaForCausalLM``, and the Llama-like families around :mod:`variantlab.hf.decoder` (Gemma
1, OLMo 1, OLMo 3, EXAONE 4, StarCoder 2, GLM-4, GLM-4-MoE, Granite, Granite-MoE, Cohere,
StableLM, Phi, Nemotron, Arcee, Seed-OSS, ERNIE 4.5, ERNIE 4.5 MoE, Qwen2-MoE, Persimmon,
Apertus) (the registry: :data:`CONVERTERS`) become ``(spec, model)``, their rope scaling
included. Other classes and config options that variantlab cannot express raise
:class:`ConversionError` naming them (a class with its reason from
:mod:`variantlab.hf.families`).

Export (:func:`to_transformers`): the transformers class is chosen from the spec's
components (multi-head latent attention: DeepSeek-V3 with sigmoid routing, else V2; a parallel
hybrid: Falcon-H1; gated short convolutions: LFM2; attention sinks: gpt-oss; chunked attention,
an L2 QK-norm, input-scaled experts or a query temperature: Llama 4; pre-norm NoPE layers:
SmolLM3; Mamba 1 or Mamba-2 mixers alone: Mamba, Mamba-2; Mamba-2 and attention layers: Bamba;
ALiBi: BLOOM with an embedding norm, else MPT; learned positions: OPT at an offset, GPTBigCode
with one key/value head, else GPT-2; rotary LayerNorm with a plain MLP: GPT-J (an output head
bias, no attention biases) or Falcon (grouped heads or a shared parallel norm over whole
heads); the options of a Llama-like family (:func:`_decoder_class`: Phi, Persimmon, Apertus,
GLM-4(-MoE), EXAONE 4, OLMo 1/3, Granite(-MoE), Gemma 1, Qwen2-MoE, Cohere, StableLM, Arcee,
Seed-OSS, Nemotron, StarCoder 2); rotary with a parallel residual or LayerNorm: GPT-NeoX;
rotary with RMSNorm: Llama, Mistral (a sliding window), Qwen3 (per-head QK-norm), Phi-3
(partial rotary or LongRoPE), Qwen2 (query, key and value biases only), OLMo 2 (post-sublayer
norms) or Gemma 2/3 (sandwich norms)); its config is built from the spec and its weights from
the model's (the 2025, GPT-2-era, state-space and Llama-like families through the same weight
table as their import, :data:`TABLED`). A component or option no supported class has raises
:class:`ConversionError` naming its spec path; one the class has in another form (a bias the
variant lacks, exported as zeros) gives an :class:`ExportWarning`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..model.build import build_model
from ..model.specs import ModelSpec, parse_model_spec
from ..plugin.registry import Registry, get_registry
from .apertus import APERTUS
from .arcee import ARCEE
from .bamba import bamba_config, bamba_spec, bamba_state, bamba_table
from .bigcode import bigcode_config, bigcode_spec, bigcode_state, bigcode_table
from .bloom import bloom_config, bloom_spec, bloom_state, bloom_table
from .cohere import COHERE
from .common import (
    TESTED_TRANSFORMERS,
    ConversionError,
    ExportWarning,
    Spec,
    check_transformers,
    refuse,
    reject,
)
from .deepseek import (
    deepseek_class,
    deepseek_config,
    deepseek_state,
    deepseek_table,
    deepseek_v2_spec,
    deepseek_v3_spec,
)
from .ernie4_5 import ERNIE4_5
from .ernie4_5moe import ERNIE4_5MOE
from .exaone4 import EXAONE4
from .falcon import falcon_config, falcon_spec, falcon_state, falcon_table
from .falconh1 import falconh1_config, falconh1_spec, falconh1_state, falconh1_table
from .gemma import gemma_config, gemma_hf_state, gemma_spec, gemma_state
from .gemma1 import GEMMA1
from .glm4 import GLM4
from .glm4moe import GLM4MOE
from .gpt2 import gpt2_config, gpt2_hf_state, gpt2_spec, gpt2_state
from .gptj import gptj_config, gptj_spec, gptj_state, gptj_table
from .gptoss import gptoss_config, gptoss_spec, gptoss_state, gptoss_table
from .granite import GRANITE
from .granitemoe import GRANITEMOE
from .lfm2 import lfm2_config, lfm2_spec, lfm2_state, lfm2_table
from .llama import CLASSES as LLAMA_LIKE
from .llama import (
    llama_config,
    llama_hf_state,
    llama_spec,
    llama_state,
    mistral_spec,
    olmo2_spec,
    olmo2_state,
    qwen3_spec,
    qwen3_state,
)
from .llama4 import llama4_config, llama4_spec, llama4_state, llama4_table
from .mamba import (
    jamba_spec,
    jamba_state,
    mamba2_config,
    mamba2_spec,
    mamba2_state,
    mamba2_table,
    mamba_config,
    mamba_spec,
    mamba_state,
    mamba_table,
)
from .moe import mixtral_spec, mixtral_state, olmoe_spec, olmoe_state, qwen3moe_spec, qwen3moe_state
from .mpt import mpt_config, mpt_spec, mpt_state, mpt_table
from .nemotron import NEMOTRON
from .neox import neox_config, neox_hf_state, neox_spec, neox_state
from .olmo import OLMO
from .olmo3 import OLMO3
from .opt import opt_config, opt_spec, opt_state, opt_table
from .persimmon import PERSIMMON
from .phi import PHI
from .phi3 import phi3_config, phi3_spec, phi3_state, phi3_table
from .qwen2 import qwen2_config, qwen2_spec, qwen2_state, qwen2_table
from .qwen2moe import QWEN2MOE
from .qwen3next import qwen3next_spec, qwen3next_state
from .seed_oss import SEED_OSS
from .smollm3 import smollm3_config, smollm3_spec, smollm3_state, smollm3_table
from .stablelm import STABLELM
from .starcoder2 import STARCODER2
from .table import Pair, save_state, tied

__all__ = ["CONVERTERS", "ConversionError", "ExportWarning", "SUPPORTED", "TESTED_TRANSFORMERS",
           "choose_class", "from_transformers", "to_transformers"]

Converter = tuple[Callable[[Any], dict[str, Any]], Callable[[Any], dict[str, torch.Tensor]]]

#: class name -> (config -> spec data, HF model -> our state dict)
CONVERTERS: dict[str, Converter] = {
    "BambaForCausalLM": (bamba_spec, bamba_state),
    "BloomForCausalLM": (bloom_spec, bloom_state),
    "DeepseekV2ForCausalLM": (deepseek_v2_spec, deepseek_state),
    "DeepseekV3ForCausalLM": (deepseek_v3_spec, deepseek_state),
    "GPT2LMHeadModel": (gpt2_spec, gpt2_state),
    "GPTBigCodeForCausalLM": (bigcode_spec, bigcode_state),
    "Gemma2ForCausalLM": (gemma_spec, gemma_state),
    "Gemma3ForCausalLM": (gemma_spec, gemma_state),
    "FalconForCausalLM": (falcon_spec, falcon_state),
    "FalconH1ForCausalLM": (falconh1_spec, falconh1_state),
    "GPTJForCausalLM": (gptj_spec, gptj_state),
    "GptOssForCausalLM": (gptoss_spec, gptoss_state),
    "GPTNeoXForCausalLM": (neox_spec, neox_state),
    "JambaForCausalLM": (jamba_spec, jamba_state),
    "LlamaForCausalLM": (llama_spec, llama_state),
    "Lfm2ForCausalLM": (lfm2_spec, lfm2_state),
    "Llama4ForCausalLM": (llama4_spec, llama4_state),
    "MambaForCausalLM": (mamba_spec, mamba_state),
    "Mamba2ForCausalLM": (mamba2_spec, mamba2_state),
    "MistralForCausalLM": (mistral_spec, llama_state),
    "MixtralForCausalLM": (mixtral_spec, mixtral_state),
    "MptForCausalLM": (mpt_spec, mpt_state),
    "OlmoeForCausalLM": (olmoe_spec, olmoe_state),
    "OPTForCausalLM": (opt_spec, opt_state),
    "Olmo2ForCausalLM": (olmo2_spec, olmo2_state),
    "Phi3ForCausalLM": (phi3_spec, phi3_state),
    "Qwen2ForCausalLM": (qwen2_spec, qwen2_state),
    "Qwen3ForCausalLM": (qwen3_spec, qwen3_state),
    "Qwen3MoeForCausalLM": (qwen3moe_spec, qwen3moe_state),
    "Qwen3NextForCausalLM": (qwen3next_spec, qwen3next_state),
    "SmolLM3ForCausalLM": (smollm3_spec, smollm3_state),
    "GemmaForCausalLM": (GEMMA1.spec, GEMMA1.state),
    "Starcoder2ForCausalLM": (STARCODER2.spec, STARCODER2.state),
    "Glm4ForCausalLM": (GLM4.spec, GLM4.state),
    "ArceeForCausalLM": (ARCEE.spec, ARCEE.state),
    "SeedOssForCausalLM": (SEED_OSS.spec, SEED_OSS.state),
    "Ernie4_5ForCausalLM": (ERNIE4_5.spec, ERNIE4_5.state),
    "OlmoForCausalLM": (OLMO.spec, OLMO.state),
    "GraniteForCausalLM": (GRANITE.spec, GRANITE.state),
    "CohereForCausalLM": (COHERE.spec, COHERE.state),
    "PhiForCausalLM": (PHI.spec, PHI.state),
    "StableLmForCausalLM": (STABLELM.spec, STABLELM.state),
    "NemotronForCausalLM": (NEMOTRON.spec, NEMOTRON.state),
    "Olmo3ForCausalLM": (OLMO3.spec, OLMO3.state),
    "Exaone4ForCausalLM": (EXAONE4.spec, EXAONE4.state),
    "Qwen2MoeForCausalLM": (QWEN2MOE.spec, QWEN2MOE.state),
    "PersimmonForCausalLM": (PERSIMMON.spec, PERSIMMON.state),
    "GraniteMoeForCausalLM": (GRANITEMOE.spec, GRANITEMOE.state),
    "ApertusForCausalLM": (APERTUS.spec, APERTUS.state),
    "Glm4MoeForCausalLM": (GLM4MOE.spec, GLM4MOE.state),
    "Ernie4_5_MoeForCausalLM": (ERNIE4_5MOE.spec, ERNIE4_5MOE.state),
}


def from_transformers(hf_model: Any, registry: Registry, impl: str = "naive",
                      ) -> tuple[ModelSpec, torch.nn.Module]:
    """The variantlab spec equal to ``hf_model`` and a variantlab model holding copies of its
    weights (logits equal in float32), built with the built-in components of ``registry``.
    ``impl`` picks the implementation of the mha and mla attentions. The model is in the HF
    model's mode (``eval()`` when it is, so dropout is off as there)."""
    check_transformers()
    name = type(hf_model).__name__
    if name not in CONVERTERS:
        from .families import family

        raise ConversionError.at(["transformers"], f"class {name} is not supported: "
                                 f"{family(name).reason} (`variantlab families` lists what "
                                 f"converts; supported: {', '.join(sorted(CONVERTERS))})")
    make_spec, make_state = CONVERTERS[name]
    check_per_layer(hf_model.config)
    data = make_spec(hf_model.config)
    for slots in [data, *(data.get("layout") or {}).get("kinds", {}).values()]:
        if "attention" in slots and slots["attention"].get("kind", "mha") in ("mha", "mla"):
            slots["attention"]["impl"] = impl  # the sequence mixers keep their chunked form
        if "attention" in slots and slots["attention"].get("kind") == "parallel_hybrid":
            slots["attention"]["attention"]["impl"] = impl
    spec = parse_model_spec(data, registry)
    model = build_model(spec, registry)
    try:
        state = {k: v.detach().clone() for k, v in make_state(hf_model).items()}
        if spec.tie_weights:
            state.pop("out_head.weight")
        missing, unexpected = model.load_state_dict(state, strict=False)
    except KeyError as exc:
        raise ConversionError.at(["transformers"], f"{name} has no weight {exc.args[0]!r} "
                                 "that its config implies: the config does not describe "
                                 "these weights; load the two from one checkpoint") from None
    except RuntimeError as exc:  # a fused tensor that does not split, a size mismatch
        first = str(exc).strip().splitlines()[-1].strip()
        raise ConversionError.at(["transformers"], f"{name}'s weights do not have the shapes "
                                 f"its config implies ({first}); load the two from one "
                                 "checkpoint") from None
    left = [k for k in missing if not (spec.tie_weights and k == "out_head.weight")]
    if left or unexpected:
        raise ConversionError.at(["transformers"], f"weight mapping for {name} incomplete: "
                                 f"missing {left}, unexpected {unexpected}")
    model.train(bool(getattr(hf_model, "training", True)))
    return spec, model


#: config options holding one entry per layer
PER_LAYER = ("layer_types", "no_rope_layers")


def check_per_layer(cfg: Any) -> None:
    """Refuse a per-layer list option (:data:`PER_LAYER`) whose length is not the config's
    ``num_hidden_layers``, naming the option, before any layer is read."""
    n = getattr(cfg, "num_hidden_layers", None)
    for option in PER_LAYER:
        values = getattr(cfg, option, None)
        if n is not None and isinstance(values, (list, tuple)) and len(values) != n:
            reject(option, list(values), f"{len(values)} entries for num_hidden_layers={n}; "
                   "give one per layer")


Exporter = tuple[Callable[[Spec, str], Any], Callable[[Any], list[Pair]]]

#: the classes with a weight table (the 2025 ones, the GPT-2-era and state-space ones):
#: class -> (spec -> config, config -> the family's weight table)
TABLED: dict[str, Exporter] = {
    "DeepseekV2ForCausalLM": (deepseek_config, deepseek_table),
    "DeepseekV3ForCausalLM": (deepseek_config, deepseek_table),
    "GptOssForCausalLM": (gptoss_config, gptoss_table),
    "Llama4ForCausalLM": (llama4_config, llama4_table),
    "SmolLM3ForCausalLM": (smollm3_config, smollm3_table),
    "FalconH1ForCausalLM": (falconh1_config, falconh1_table),
    "Lfm2ForCausalLM": (lfm2_config, lfm2_table),
    "Phi3ForCausalLM": (phi3_config, phi3_table),
    "Qwen2ForCausalLM": (qwen2_config, qwen2_table),
    "FalconForCausalLM": (falcon_config, falcon_table),
    "GPTJForCausalLM": (gptj_config, gptj_table),
    "OPTForCausalLM": (opt_config, opt_table),
    "BloomForCausalLM": (bloom_config, bloom_table),
    "MptForCausalLM": (mpt_config, mpt_table),
    "GPTBigCodeForCausalLM": (bigcode_config, bigcode_table),
    "MambaForCausalLM": (mamba_config, mamba_table),
    "Mamba2ForCausalLM": (mamba2_config, mamba2_table),
    "BambaForCausalLM": (bamba_config, bamba_table),
    "GemmaForCausalLM": (GEMMA1.config, GEMMA1.table),
    "Starcoder2ForCausalLM": (STARCODER2.config, STARCODER2.table),
    "Glm4ForCausalLM": (GLM4.config, GLM4.table),
    "ArceeForCausalLM": (ARCEE.config, ARCEE.table),
    "SeedOssForCausalLM": (SEED_OSS.config, SEED_OSS.table),
    "OlmoForCausalLM": (OLMO.config, OLMO.table),
    "GraniteForCausalLM": (GRANITE.config, GRANITE.table),
    "CohereForCausalLM": (COHERE.config, COHERE.table),
    "PhiForCausalLM": (PHI.config, PHI.table),
    "StableLmForCausalLM": (STABLELM.config, STABLELM.table),
    "NemotronForCausalLM": (NEMOTRON.config, NEMOTRON.table),
    "Olmo3ForCausalLM": (OLMO3.config, OLMO3.table),
    "Exaone4ForCausalLM": (EXAONE4.config, EXAONE4.table),
    "Qwen2MoeForCausalLM": (QWEN2MOE.config, QWEN2MOE.table),
    "PersimmonForCausalLM": (PERSIMMON.config, PERSIMMON.table),
    "GraniteMoeForCausalLM": (GRANITEMOE.config, GRANITEMOE.table),
    "ApertusForCausalLM": (APERTUS.config, APERTUS.table),
    "Glm4MoeForCausalLM": (GLM4MOE.config, GLM4MOE.table),
}

#: the classes a spec exports to (:func:`choose_class`)
SUPPORTED = ("GPT2LMHeadModel", "GPTNeoXForCausalLM", *LLAMA_LIKE, "Gemma2ForCausalLM",
             "Gemma3ForCausalLM", *TABLED)


def _frontier_class(spec: Spec) -> str | None:
    """The 2025 class a spec's components name, if any: multi-head latent attention
    (DeepSeek), attention sinks (gpt-oss), a parallel hybrid (Falcon-H1), gated short
    convolutions (LFM2), chunked attention, an L2 QK-norm, input-scaled experts or NoPE
    layers with a query temperature (Llama 4),
    NoPE layers among rotary ones (SmolLM3)."""
    specs = [spec.layer_spec(i) for i in range(spec.n_layers)]
    atts = [layer.attention for layer in specs]
    kinds = {att.kind for att in atts}
    if "mla" in kinds:
        return deepseek_class(spec)
    if "parallel_hybrid" in kinds:
        return "FalconH1ForCausalLM"
    if "gated_short_conv" in kinds:
        return "Lfm2ForCausalLM"
    if any(getattr(att, "sinks", False) for att in atts):
        return "GptOssForCausalLM"
    ffs = [layer.feedforward for layer in specs]
    qk_kinds = {att.qk_norm.kind for att in atts if getattr(att, "qk_norm", None) is not None}
    positions = {layer.positional.kind for layer in specs}
    if (any(getattr(att, "chunk", None) for att in atts) or "l2" in qk_kinds
            or any(getattr(ff, "scale_input", False) for ff in ffs)
            or "query_temperature" in positions):
        return "Llama4ForCausalLM"
    if "none" in positions and positions <= {"none", "rotary"} and kinds == {"mha"} \
            and spec.residual.kind == "pre_norm":  # post_sublayer: EXAONE 4
        return "SmolLM3ForCausalLM"
    return None


def _classic_class(spec: Spec) -> str | None:
    """The GPT-2-era or state-space class a spec's components name, if any: Mamba 1's mixer
    alone (Mamba), Mamba-2's alone (Mamba-2), Mamba-2 and attention layers (Bamba), ALiBi
    (BLOOM with an embedding norm, else MPT), learned positions with an offset (OPT) or one
    key/value head (GPTBigCode); rotary LayerNorm with a plain MLP and no QK-norm: an output
    head bias without attention biases (GPT-J; with them: Phi, :func:`_decoder_class`), a
    parallel block over whole heads with grouped heads or a shared norm, or a sequential one
    with one key/value head or one per head (Falcon; other groupings and windows: StarCoder 2
    or Nemotron)."""
    kinds = {spec.layer_spec(i).attention.kind for i in range(spec.n_layers)}
    if kinds == {"mamba"}:
        return "MambaForCausalLM"
    if kinds == {"mamba2"}:
        return "Mamba2ForCausalLM"
    if kinds == {"mamba2", "mha"}:
        return "BambaForCausalLM"
    positional, kv = spec.positional, getattr(spec.attention, "n_kv_heads", None)
    if positional.kind == "alibi":
        return "BloomForCausalLM" if spec.embedding_norm else "MptForCausalLM"
    if positional.kind == "learned":
        if positional.offset:
            return "OPTForCausalLM"
        return "GPTBigCodeForCausalLM" if kv == 1 else None
    if (positional.kind != "rotary" or spec.norm.kind != "layer"
            or spec.feedforward.kind != "mlp"
            or getattr(spec.attention, "qk_norm", None) is not None):
        return None
    if spec.head_bias:
        return None if spec.qkv_bias or spec.attn_out_bias else "GPTJForCausalLM"
    res, whole = spec.residual, positional.fraction == 1.0
    if res.kind == "parallel" and whole and (kv or res.shared_norm):
        return "FalconForCausalLM"
    sequential = res.kind == "pre_norm" and kv in (1, spec.n_heads) and whole
    return ("FalconForCausalLM" if sequential and getattr(spec.attention, "window", None) is None
            else None)


def _qwen2_holds(spec: Spec) -> bool:
    """Qwen2 holds a pre-norm RMSNorm spec whose query, key and value projections alone
    have biases, with heads of width emb_dim / n_heads, a bias-free feed-forward and no
    residual dropout (Seed-OSS holds it too, and its feed-forward biases, own head width and
    residual dropout besides)."""
    return (spec.qkv_bias and not spec.attn_out_bias
            and not getattr(spec.feedforward, "bias", False)
            and getattr(spec.attention, "head_dim", None) in (None, spec.emb_dim // spec.n_heads)
            and not spec.drop("resid"))


def _decoder_class(spec: Spec) -> str | None:
    """The Llama-like class (:mod:`variantlab.hf.decoder`) a rotary spec's options name, if
    any, in this order: an output head bias (Phi); post-sublayer norms with a per-head
    QK-norm (EXAONE 4) or a projection QK-norm and windows (OLMo 3); a per-head LayerNorm
    QK-norm with a pre-norm MLP (Persimmon); experts routed by sigmoid_topk (GLM-4-MoE); a
    per-head RMS QK-norm with an MLP (Apertus); a QK-norm per head with its own weights in a
    parallel block (Cohere); experts with a gated shared expert (Qwen2-MoE) or routed by
    their top-k logits alone (Granite-MoE); a LayerNorm without parameters (OLMo);
    Granite's multipliers; scaled embeddings with pre-norm (Gemma); sandwich norms without
    them (GLM-4); a parallel block with one LayerNorm and a glu (StableLM with a norm shift,
    Cohere without); LayerNorm pre-norm with a glu (StableLM); a plain MLP with RMSNorm
    (Arcee); q/k/v biases without an output bias (Seed-OSS, unless Qwen2 holds the
    spec: :func:`_qwen2_holds`); LayerNorm pre-norm with
    grouped-query heads and partial rotary (Nemotron), or with grouped-query heads or a
    window (StarCoder 2)."""
    if spec.positional.kind != "rotary":
        return None
    residual, norm, ff = spec.residual.kind, spec.norm.kind, spec.feedforward.kind
    att = spec.attention
    if getattr(spec, "head_bias", False):
        return "PhiForCausalLM"
    if residual == "post_sublayer" and getattr(att, "qk_norm", None) is not None:
        if att.qk_norm_scope == "head":
            return "Exaone4ForCausalLM"
        if any(getattr(spec.layer_spec(i).attention, "window", None)
               for i in range(spec.n_layers)):
            return "Olmo3ForCausalLM"
    qk = getattr(att, "qk_norm", None)
    if qk is not None and qk.kind == "layer" and residual == "pre_norm" and \
            att.qk_norm_scope == "head" and spec.feedforward.kind == "mlp":
        return "PersimmonForCausalLM"
    ffs = [spec.layer_spec(i).feedforward for i in range(spec.n_layers)]
    if residual == "pre_norm" and any(f.kind == "moe" and f.router == "sigmoid_topk"
                                      for f in ffs):
        return "Glm4MoeForCausalLM"  # DeepSeek-V3's experts under grouped-query mha
    if qk is not None and qk.kind == "rms" and residual == "pre_norm" and \
            att.qk_norm_scope == "head" and spec.feedforward.kind == "mlp":
        return "ApertusForCausalLM"
    if qk is not None and att.qk_norm_scope == "each_head" and residual == "parallel":
        return "CohereForCausalLM"
    if getattr(att, "qk_norm", None) is not None:
        return None  # Qwen3, OLMo 2 and Gemma 3 have QK-norms; these classes have none
    if any(f.kind == "moe" for f in ffs) and residual == "pre_norm":
        moes = [f for f in ffs if f.kind == "moe"]
        if all(f.n_shared_experts == 1 and f.shared_gate for f in moes):
            return "Qwen2MoeForCausalLM"  # experts with a gated shared expert
        if all(f.router == "topk_softmax" and not f.n_shared_experts for f in moes):
            return "GraniteMoeForCausalLM"
        return None
    if any(f.kind == "moe" for f in ffs):
        return None
    if not getattr(spec.norm, "affine", True):
        return "OlmoForCausalLM"
    if residual == "pre_norm" and (
            getattr(spec, "emb_multiplier", None) is not None
            or getattr(spec, "logit_scale", None) is not None
            or getattr(spec.residual, "branch_scale", 1.0) != 1.0
            or getattr(att, "scale", None) is not None):
        return "GraniteForCausalLM"
    scaled = getattr(spec, "scale_embeddings", False)
    if residual == "pre_norm" and norm == "rms" and scaled:
        return "GemmaForCausalLM"
    if residual == "sandwich" and not scaled:
        return "Glm4ForCausalLM"
    if residual == "parallel" and spec.residual.shared_norm and ff == "glu" and norm == "layer":
        return "StableLmForCausalLM" if spec.norm_bias else "CohereForCausalLM"
    if residual == "pre_norm" and norm == "layer" and ff == "glu":
        return "StableLmForCausalLM"
    if residual == "pre_norm" and norm == "rms" and ff == "mlp":
        return "ArceeForCausalLM"
    if residual == "pre_norm" and norm == "rms" and spec.qkv_bias and not spec.attn_out_bias \
            and not _qwen2_holds(spec):
        return "SeedOssForCausalLM"  # (the other way round Llama holds, with a zero bias)
    kv = getattr(att, "n_kv_heads", None) or spec.n_heads
    if residual == "pre_norm" and norm == "layer" and kv != spec.n_heads and \
            spec.positional.fraction != 1.0:
        return "NemotronForCausalLM"
    if residual == "pre_norm" and norm == "layer" and (
            kv != spec.n_heads or getattr(att, "window", None) is not None):
        return "Starcoder2ForCausalLM"
    return None


def choose_class(spec: Spec) -> str:
    """The transformers class whose architecture the spec's components name (its own checks
    then refuse what else the class lacks)."""
    if spec.family != "gpt":
        refuse("family", "transformers", f"family {spec.family!r}: only decoder-only 'gpt' "
               "models export to a transformers causal LM")
    frontier = _frontier_class(spec) or _classic_class(spec) or _decoder_class(spec)
    if frontier is not None:
        return frontier
    positional, residual = spec.positional.kind, spec.residual.kind
    if positional == "learned":
        return "GPT2LMHeadModel"
    if positional != "rotary":
        refuse("positional.kind", "transformers", f"positional {positional!r} has no "
               "equivalent in the supported classes; learned (GPT-2, OPT, GPTBigCode), "
               "alibi (BLOOM, MPT), rotary (GPT-NeoX, Llama, Falcon, GPT-J, ...), or none "
               "with Mamba or Mamba-2 mixers alone")
    if residual == "parallel" or (residual == "pre_norm" and spec.norm.kind == "layer"):
        return "GPTNeoXForCausalLM"
    if residual == "sandwich":
        return "Gemma3ForCausalLM" if spec.attention.qk_norm is not None else "Gemma2ForCausalLM"
    if residual == "post_sublayer":
        return "Olmo2ForCausalLM"
    if residual == "pre_norm":
        if spec.attention.qk_norm is not None:
            return "Qwen3ForCausalLM"
        if spec.positional.fraction != 1.0 or spec.positional.scaling == "longrope":
            return "Phi3ForCausalLM"
        if spec.qkv_bias and not spec.attn_out_bias:
            return "Qwen2ForCausalLM"
        window = getattr(spec.attention, "window", None) is not None
        return "MistralForCausalLM" if window else "LlamaForCausalLM"
    refuse("residual.kind", "transformers", f"residual {residual!r} has no equivalent in the "
           "supported classes; pre_norm, parallel (GPT-NeoX), post_sublayer (OLMo 2) or "
           "sandwich (Gemma 2/3)")


def hf_config(spec: Spec, cls: str) -> Any:
    """The transformers config of ``spec`` for class ``cls`` (refusing what it lacks)."""
    if cls in TABLED:
        return TABLED[cls][0](spec, cls)
    if cls == "GPT2LMHeadModel":
        return gpt2_config(spec)
    if cls == "GPTNeoXForCausalLM":
        return neox_config(spec)
    if cls in LLAMA_LIKE:
        return llama_config(spec, cls)
    return gemma_config(spec, cls)


def hf_state(spec: Spec, cls: str, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF state dict of an older family's class from ours (the :data:`TABLED` classes
    read their table in :func:`to_transformers`)."""
    if cls == "GPT2LMHeadModel":
        return gpt2_hf_state(spec, sd)
    if cls == "GPTNeoXForCausalLM":
        return neox_hf_state(spec, sd)
    if cls in LLAMA_LIKE:
        return llama_hf_state(spec, sd, cls)
    return gemma_hf_state(spec, sd, cls)


def to_transformers(spec: ModelSpec | Mapping[str, Any], model: torch.nn.Module,
                    registry: Registry | None = None) -> Any:
    """A transformers causal LM (in eval mode) computing the logits of ``model``, a
    variantlab model built from ``spec`` (a spec or its data; ``registry``: the one to
    parse data with, default the built-ins plus installed plugins)."""
    import transformers

    check_transformers()
    if not isinstance(spec, ModelSpec):
        spec = parse_model_spec(spec, registry or get_registry())
    cls = choose_class(spec)
    sd = {k.removeprefix("_orig_mod."): v.detach().clone()
          for k, v in model.state_dict().items()}
    try:
        config = hf_config(spec, cls)
    except ConversionError:
        raise
    except (ValueError, TypeError) as exc:  # transformers' own validation of the config
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1].strip()
        raise ConversionError.at(["transformers"], f"{cls} refuses the exported config: "
                                 f"{first}") from None
    hf = getattr(transformers, cls)(config)
    if cls in TABLED:  # the family's table, read from the exported config
        sizes = {k: v.shape for k, v in hf.state_dict().items()}
        state = save_state(TABLED[cls][1](config), tied(sd), cls, sizes)
    else:
        state = hf_state(spec, cls, sd)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    left = [k for k in missing if not (spec.tie_weights and k == "lm_head.weight")]
    if left or unexpected:
        raise ConversionError.at(["transformers"], f"weight mapping to {cls} incomplete: "
                                 f"missing {left}, unexpected {unexpected}")
    if spec.tie_weights:
        hf.tie_weights()
    return hf.eval()
