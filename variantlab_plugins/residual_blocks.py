"""Residual kinds that wrap a whole transformer block (``scope = "block"``).

Their build is ``build(spec, attention, feedforward, make_norm, dim, drop_rate)`` and their
``forward(x, *args, **kw)`` passes the extras (e.g. ``key_padding_mask``) to the attention.
"""

from typing import ClassVar, Literal

from pydantic import Field
from torch import nn

from variantlab import ComponentSpec


class ParallelSpec(ComponentSpec):
    """Parallel block (GPT-J, Wang & Komatsuzaki 2021; GPT-NeoX, Black et al. 2022; PaLM,
    Chowdhery et al. 2022): one residual around both sublayers,
    x + drop(attn(norm1(x))) + drop(ffn(norm2(x)))."""

    kind: Literal["parallel"] = "parallel"
    #: wraps attention and feed-forward together (see ``Parts.block``)
    scope: ClassVar[str] = "block"
    shared_norm: bool = Field(
        True, description="true: one norm feeds both sublayers (GPT-J, PaLM); false: each has "
        "its own (GPT-NeoX use_parallel_residual)")


class Parallel(nn.Module):
    """Attention and feed-forward read the same input and both add to the stream
    (GPT-J / GPT-NeoX / PaLM): x + drop(attn(norm1(x))) + drop(ffn(norm2(x))), with
    norm2 = norm1 when the norm is shared.

        x ──┬── norm1 ── attn ── drop ──┐
            ├── norm2 ── ffn ─── drop ──(+)── out
            └────────── shortcut ───────┘
    """

    def __init__(self, attention, feedforward, norm1, norm2, drop_rate):
        super().__init__()
        self.norm1, self.attention = norm1, attention
        self.norm2, self.feedforward = norm2, feedforward  # norm2 None: norm1 is shared
        self.drop_shortcut = nn.Dropout(drop_rate)

    def forward(self, x, *args, **kwargs):  # (B, T, D)
        shortcut = x
        h_att = self.norm1(x)  # (B, T, D)
        h_ff = h_att if self.norm2 is None else self.norm2(x)  # (B, T, D)
        att = self.drop_shortcut(self.attention(h_att, *args, **kwargs))  # (B, T, D)
        ff = self.drop_shortcut(self.feedforward(h_ff))  # (B, T, D)
        return shortcut + att + ff
