"""Position schemes (:class:`variantlab.model.positions.Positions`): added to the token embeddings
(learned, sinusoidal), or acting inside attention (rotary, alibi; see ``rotary.py``)."""

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field

from variantlab import ComponentSpec, hookimpl
from variantlab.model.positions import Positions
from variantlab_plugins.rotary import (
    ALiBiPositions,
    ALiBiSpec,
    QueryTemperaturePositions,
    QueryTemperatureSpec,
    RotaryPositions,
    RotarySpec,
)


def _positions(tok_embeds, position_ids):  # (B, T, D), (B, T) or None
    if position_ids is None:
        return torch.arange(tok_embeds.shape[1], device=tok_embeds.device)  # (T,)
    return position_ids


class LearnedSpec(ComponentSpec):
    """Learned absolute position embeddings, one per position (GPT-2, Radford et al. 2019)."""

    kind: Literal["learned"] = "learned"
    added_options: ClassVar[tuple[str, ...]] = ("offset",)
    offset: int = Field(
        0, ge=0, description="rows before the first position's: position p reads row p + "
        "offset of a table of context_length + offset rows (OPT: 2)")


class LearnedPositions(Positions):
    """A trained embedding per position (GPT-2, Radford et al. 2019); with an ``offset``,
    position p reads row p + offset, the first ``offset`` rows unused (OPT's table)."""

    def __init__(self, emb_dim: int, context_length: int, offset: int = 0):
        super().__init__()
        self.offset = offset
        self.pos_emb = torch.nn.Embedding(context_length + offset, emb_dim)

    def forward(self, tok_embeds, position_ids=None):  # (B, T, D)
        rows = _positions(tok_embeds, position_ids) + self.offset  # (T,) or (B, T)
        return tok_embeds + self.pos_emb(rows)  # (T, D) or (B, T, D) added


class SinusoidalSpec(ComponentSpec):
    """Fixed sinusoidal position encodings (Vaswani et al. 2017, sec. 3.5)."""

    kind: Literal["sinusoidal"] = "sinusoidal"
    scale_embeddings: bool = Field(True, description="multiply token embeddings by sqrt(emb_dim)")


class SinusoidalPositions(Positions):
    """Fixed encodings (Vaswani et al. 2017, sec. 3.5): PE(pos, 2i) = sin(pos / 10000^(2i/D)),
    PE(pos, 2i+1) = cos(...); token embeddings scaled by sqrt(D) first."""

    def __init__(self, emb_dim: int, context_length: int, scale_embeddings: bool):
        super().__init__()
        self.scale = math.sqrt(emb_dim) if scale_embeddings else 1.0
        position = torch.arange(context_length, dtype=torch.float).unsqueeze(1)  # (L, 1)
        div_term = torch.exp(torch.arange(0, emb_dim, 2).float() * (-math.log(10000.0) / emb_dim))
        pe = torch.zeros(context_length, emb_dim)  # (L, D)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term[: emb_dim // 2])
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, tok_embeds, position_ids=None):  # (B, T, D)
        if position_ids is None:
            return tok_embeds * self.scale + self.pe[: tok_embeds.shape[1]]
        return tok_embeds * self.scale + self.pe[position_ids]  # pe rows (B, T, D)


class NoPositionsSpec(ComponentSpec):
    """No position information (NoPE, Kazemnejad et al. 2023): embeddings pass unchanged.
    In a layout, a layer kind with it drops the model's rotary (or ALiBi) in that layer only
    (SmolLM3's NoPE every 4th layer, Llama 4's NoPE layers)."""

    kind: Literal["none"] = "none"
    #: adds nothing to the embeddings and does nothing in attention: a layer may take it
    #: in place of the model's rotary (read by ModelSpec's layout checks)
    adds_nothing: ClassVar[bool] = True


@hookimpl
def register_positionals(register):
    register("learned", LearnedSpec, lambda spec, emb_dim, context_length: LearnedPositions(
        emb_dim, context_length, spec.offset))
    register("sinusoidal", SinusoidalSpec, lambda spec, emb_dim, context_length:
             SinusoidalPositions(emb_dim, context_length, spec.scale_embeddings))
    register("none", NoPositionsSpec, lambda spec, emb_dim, context_length: Positions())
    register("rotary", RotarySpec, lambda spec, emb_dim, context_length: RotaryPositions(
        spec.theta, spec.fraction, spec.odd_rounding, spec))
    register("alibi", ALiBiSpec, lambda spec, emb_dim, context_length: ALiBiPositions())
    register("query_temperature", QueryTemperatureSpec, lambda spec, emb_dim, context_length:
             QueryTemperaturePositions(spec.floor_scale, spec.scale))
