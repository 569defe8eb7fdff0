"""What converts: every causal-LM class of the installed transformers (its auto mapping,
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) as converting both ways, import only, or refused with
a one-line reason (``variantlab families``; the table in docs/transformers.md).

There is one registry: a class converts when its family module is registered in
:data:`variantlab.hf.CONVERTERS` (import) and exports when it is among
:data:`variantlab.hf.SUPPORTED` (the classes :func:`variantlab.hf.choose_class` picks); a
family added there shows up here with no other change. :data:`REASONS` says why a class
without a family module is refused; a class it does not name (a new transformers release's)
gets :data:`NO_FAMILY`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import CONVERTERS, SUPPORTED

BOTH, IMPORT, REFUSED = "both ways", "import only", "refused"

#: the reason of a refused class nothing below names
NO_FAMILY = ("no family module in variantlab/hf maps its config and weights; one would "
             "(docs/transformers.md, Adding a family)")

_DECODER_OF = ("the decoder of an encoder-decoder model (cross-attention to the encoder's "
               "states); only decoder-only causal LMs convert")
_ENCODER = ("an encoder (BERT-style post-norm LayerNorm blocks, token-type embeddings) run "
            "as a decoder; needs a family module for that layout")
_MULTIMODAL = ("multimodal: the language model converts from its text-only ForCausalLM "
               "class, where transformers has one")

#: class -> why it is refused (what it has that no variantlab component or family expresses)
REASONS: dict[str, str] = {
    **dict.fromkeys((
        "BartForCausalLM", "BigBirdPegasusForCausalLM", "BlenderbotForCausalLM",
        "BlenderbotSmallForCausalLM", "MBartForCausalLM", "MarianForCausalLM",
        "MvpForCausalLM", "PLBartForCausalLM", "PegasusForCausalLM", "ProphetNetForCausalLM",
        "TrOCRForCausalLM", "WhisperForCausalLM", "MusicgenForCausalLM",
        "MusicgenMelodyForCausalLM"), _DECODER_OF),
    **dict.fromkeys((
        "BertGenerationDecoder", "BertLMHeadModel", "BigBirdForCausalLM",
        "CamembertForCausalLM", "Data2VecTextForCausalLM", "ElectraForCausalLM",
        "ErnieForCausalLM", "MegatronBertForCausalLM", "RemBertForCausalLM",
        "RoCBertForCausalLM", "RoFormerForCausalLM", "RobertaForCausalLM",
        "RobertaPreLayerNormForCausalLM", "XLMRobertaForCausalLM", "XLMRobertaXLForCausalLM",
        "XmodForCausalLM"), _ENCODER),
    **dict.fromkeys((
        "Gemma3ForConditionalGeneration", "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration",
        "GotOcr2ForConditionalGeneration", "MossTranscribeDiarizeForConditionalGeneration",
        "FuyuForCausalLM", "GitForCausalLM", "MllamaForCausalLM", "Emu3ForCausalLM",
        "Phi4MultimodalForCausalLM", "MiniMaxM3VLForCausalLM"), _MULTIMODAL),
    "CTRLLMHeadModel": "CTRL's sinusoidal positions added after scaling the embeddings by "
                       "sqrt(d) and its control codes; needs a family module",
    "CpmAntForCausalLM": "CPM-Ant's segment and relative position buckets have no variantlab "
                         "positional",
    "DiffLlamaForCausalLM": "differential attention (two softmax maps subtracted, a learned "
                            "lambda) is not a variantlab attention",
    "ReformerModelWithLMHead": "LSH and chunked local attention with axial positions are not "
                               "variantlab attentions",
    "XLNetLMHeadModel": "XLNet's two-stream permutation attention with relative positions is "
                        "not a variantlab attention",
    "XLMWithLMHeadModel": "XLM's language embeddings and post-norm blocks; needs a family module",
    "OpenAIGPTLMHeadModel": "GPT-1's post-norm blocks with no final norm; needs a family module",
    "RwkvForCausalLM": "RWKV-4's time-mix and channel-mix recurrences are not a variantlab "
                       "mixer; needs one as a plugin with its reference",
    "xLSTMForCausalLM": "xLSTM's mLSTM/sLSTM cells are not a variantlab mixer; needs one as a "
                        "plugin with its reference",
    "RecurrentGemmaForCausalLM": "Griffin's RG-LRU recurrence is not a variantlab mixer",
    "Gemma3nForCausalLM": "Gemma 3n's per-layer embeddings, AltUp and laurel blocks have no "
                          "variantlab component",
    "KimiLinearForCausalLM": "Kimi delta attention is not a variantlab mixer",
    "MiniMaxForCausalLM": "MiniMax's lightning (linear) attention layers are not a variantlab "
                          "mixer",
    "BltForCausalLM": "the Byte Latent Transformer's patcher and local encoder/decoder have no "
                      "variantlab family",
    "MoshiForCausalLM": "Moshi's depth decoder over audio codebooks has no variantlab family",
    "BitNetForCausalLM": "BitNet's ternary-quantised linears (and sub-norms) are not variantlab "
                         "layers",
    "DbrxForCausalLM": "DBRX's clipped fused qkv and its expert layout need a family module",
}


@dataclass(frozen=True)
class Family:
    """One causal-LM class: ``status`` is :data:`BOTH`, :data:`IMPORT` or :data:`REFUSED`;
    ``reason`` says why a refused class is (empty otherwise)."""

    cls: str
    status: str
    reason: str = ""


def causal_lm_classes() -> list[str]:
    """Every causal-LM class name of the installed transformers, sorted, each once."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return sorted(names, key=str.lower)


def family(cls: str) -> Family:
    """What converts of the transformers class named ``cls``."""
    if cls in CONVERTERS:
        return Family(cls, BOTH if cls in SUPPORTED else IMPORT)
    return Family(cls, REFUSED, REASONS.get(cls, NO_FAMILY))


def families(classes: list[str] | None = None) -> list[Family]:
    """:func:`family` of each of ``classes`` (default: :func:`causal_lm_classes`), plus the
    converting classes the mapping does not list."""
    names = causal_lm_classes() if classes is None else list(classes)
    names += sorted(set(CONVERTERS) - set(names))
    return [family(name) for name in names]


def markdown(rows: list[Family]) -> str:
    """The table docs/transformers.md shows (``variantlab families --markdown``)."""
    counts = {s: sum(r.status == s for r in rows) for s in (BOTH, IMPORT, REFUSED)}
    lines = [f"{counts[BOTH]} classes convert both ways, {counts[IMPORT]} import only, "
             f"{counts[REFUSED]} are refused.", "", "| class | converts | why not |",
             "|---|---|---|"]
    lines += [f"| `{r.cls}` | {r.status} | {r.reason} |" for r in rows]
    return "\n".join(lines) + "\n"
