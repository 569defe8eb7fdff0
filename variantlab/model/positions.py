"""The contract through which a position scheme and an attention cooperate.

A positional component may do any of three things, each a method with a no-op default:

- ``forward(tok_embeds, position_ids=None)``: add position information to the token
  embeddings (learned, sinusoidal);
- ``rotate(q, k, position_ids=None)``: rotate queries and keys inside self-attention
  (rotary);
- ``score_bias(n_heads, t, s, device, dtype)``: an additive ``(n_heads, T, S)`` bias on the
  attention scores, or ``None`` (ALiBi).

The model builds its one positional module once (it lives in the token embedding's module
tree) and :class:`variantlab.Parts` hands it to every attention whose build accepts a
``positions`` keyword, as a plain reference: its parameters and buffers appear once in
``state_dict``. Cross-attention applies neither ``rotate`` nor ``score_bias``: queries and
keys come from different sequences, whose positions are not comparable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn


class Positions(nn.Module):
    """Base of position schemes: every method is a no-op until a subclass overrides it.

    ``rotates`` / ``biases`` say whether :meth:`rotate` / :meth:`score_bias` do something,
    so that a model can tell whether its attention must cooperate.
    """

    rotates: bool = False
    biases: bool = False

    def forward(self, tok_embeds: torch.Tensor, position_ids: torch.Tensor | None = None
                ) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        return tok_embeds

    def rotate(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries (B, H, T, hd) and keys (B, H_kv, T, hd) at positions ``position_ids``
        (B, T) (``None``: 0..T-1), returned in the same shapes."""
        return q, k

    def score_bias(self, n_heads: int, t: int, s: int, device: torch.device,
                   dtype: torch.dtype) -> torch.Tensor | None:
        """An additive bias (n_heads, T, S) on the scaled attention scores, or ``None``."""
        return None

    @property
    def acts_in_attention(self) -> bool:
        return self.rotates or self.biases


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only: (B, T) mask of 1 = token, 0 = padding in,
    (B, T) positions out, 0 at the first real token of each row (and at pads before it).

    This is what Hugging Face ``generate`` derives for left-padded rows
    (``attention_mask.cumsum(-1) - 1``, pads clamped), so a padded row's real tokens see the
    same positions as the unpadded sequence."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)  # (B, T)


def accepts(build: Callable, name: str) -> bool:
    """Whether ``build`` takes a keyword argument ``name`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(build).parameters
    except (TypeError, ValueError):  # builtins without a signature: pass nothing new
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
