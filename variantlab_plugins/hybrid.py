"""A parallel hybrid for the attention slot: attention and a Mamba-2 mixer read the same
normalised input side by side and their outputs are added (Falcon-H1, TII 2025, "Falcon-H1:
A Family of Hybrid-Head Language Models"; Hymba, Dong et al. 2024), each with Falcon-H1's
multipliers on its input and output::

    x ──┬── * attention_in ── attention ── * attention_out ──┐
        └── * mixer_in ───── mamba2 ──── * mixer_out ──────(+)── out

``attention: {kind: parallel_hybrid, attention: {kind: mha, ...}, mixer: {kind: mamba2, ...}}``;
the parameters are the attention's under ``attention.`` and the mixer's under ``mixer.``.
Causal only (the mixer is); its state is the attention's KV cache plus the mixer's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, PositiveFloat, SerializeAsAny, ValidationInfo, field_validator
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.positions import Positions
from variantlab.model.specs import context_registry, resolve_component
from variantlab_plugins.attentions import MultiHeadAttention
from variantlab_plugins.mixers import no_memory, refuse_bidirectional
from variantlab_plugins.ssm import Mamba2Mixer

_PARTS = {"attention": "mha", "mixer": "mamba2"}


class ParallelHybridSpec(ComponentSpec):
    """Attention and a Mamba-2 mixer on the same input, outputs added (Falcon-H1)."""

    kind: Literal["parallel_hybrid"] = "parallel_hybrid"
    causal_only: ClassVar[bool] = True  # the mixer is causal
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "parallel_hybrid", "attention": {"kind": "mha", "n_kv_heads": 2},
         "mixer": {"kind": "mamba2", "d_state": 4, "gate_norm": "gate_only"},
         "attention_in": 0.5, "attention_out": 2.0, "mixer_in": 1.5, "mixer_out": 0.25},
    )
    attention: SerializeAsAny[ComponentSpec] = Field(  # type: ignore[assignment]
        None, validate_default=True, description="the attention part: an mha spec (unset: "
        "{kind: mha})", json_schema_extra={"variantlab_slot": "attention"})
    mixer: SerializeAsAny[ComponentSpec] = Field(  # type: ignore[assignment]
        None, validate_default=True, description="the mixer part: a mamba2 spec (unset: "
        "{kind: mamba2})", json_schema_extra={"variantlab_slot": "attention"})
    attention_in: PositiveFloat = Field(1.0, description="multiplies the attention's input "
                                        "(Falcon-H1 attention_in_multiplier)")
    attention_out: PositiveFloat = Field(1.0, description="multiplies the attention's output "
                                         "(attention_out_multiplier)")
    mixer_in: PositiveFloat = Field(1.0, description="multiplies the mixer's input "
                                    "(ssm_in_multiplier)")
    mixer_out: PositiveFloat = Field(1.0, description="multiplies the mixer's output "
                                     "(ssm_out_multiplier)")

    @field_validator("attention", "mixer", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        want = _PARTS[info.field_name or "attention"]
        if value is None:
            value = {"kind": want}
        if not isinstance(value, ComponentSpec):
            value = resolve_component("attention", value, context_registry(
                info, f"attention.{info.field_name}"))
        if value.kind != want:
            raise ValueError(f"the {info.field_name} part of parallel_hybrid is a {want}, "
                             f"got kind {value.kind!r}")
        return value

    def errors(self, model) -> list[tuple[str, str]]:
        return ([(f"attention.{f}", m) for f, m in self.attention.errors(model)]
                + [(f"mixer.{f}", m) for f, m in self.mixer.errors(model)])


class ParallelHybrid(nn.Module):
    """mixer(x * mixer_in) * mixer_out + attention(x * attention_in) * attention_out."""

    causal = True

    def __init__(self, emb_dim: int, n_heads: int, drop_rate: float, qkv_bias: bool,
                 spec: ParallelHybridSpec, positions: Positions | None,
                 make_norm: Callable[..., nn.Module] | None, out_bias: bool):
        super().__init__()
        self.kind, self.spec = spec.kind, spec
        self.attention = MultiHeadAttention(emb_dim, n_heads, drop_rate, qkv_bias, True,
                                            spec.attention, positions=positions,  # type: ignore[arg-type]
                                            make_norm=make_norm, out_bias=out_bias)
        self.mixer = Mamba2Mixer(emb_dim, n_heads, spec.mixer)  # type: ignore[arg-type]

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        s = self.spec
        mixed = self.mixer(x * s.mixer_in, key_padding_mask=key_padding_mask)  # (B, T, D)
        attended = self.attention(x * s.attention_in, key_padding_mask=key_padding_mask,
                                  position_ids=position_ids)  # (B, T, D)
        return mixed * s.mixer_out + attended * s.attention_out

    def state_size(self, t: int) -> int:
        """The attention's KV cache plus the mixer's state and convolution window."""
        return self.attention.state_size(t) + self.mixer.state_size(t)


@hookimpl
def register_attentions(register):
    def build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal,
              positions=None, make_norm=None, out_bias=True):
        refuse_bidirectional(spec.kind, causal)
        return ParallelHybrid(emb_dim, n_heads, drop_rate, qkv_bias, spec, positions,
                              make_norm, out_bias)

    register("parallel_hybrid", ParallelHybridSpec, build)


__all__ = ["ParallelHybrid", "ParallelHybridSpec"]
