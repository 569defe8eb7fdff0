"""Position schemes that act inside attention: rotary (RoPE) and ALiBi.

Both are :class:`variantlab.model.positions.Positions`: the token embeddings pass unchanged, and
the model's self-attentions call :meth:`rotate` or :meth:`score_bias`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field, PositiveFloat

from variantlab import ComponentSpec
from variantlab.model.positions import Positions


class RotarySpec(ComponentSpec):
    """Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer"): queries and keys
    rotated by position-dependent angles, so scores depend on relative positions."""

    kind: Literal["rotary"] = "rotary"
    acts_in_attention: ClassVar[bool] = True
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "rotary", "theta": 500.0, "fraction": 0.5},
        {"kind": "rotary", "fraction": 0.375, "odd_rounding": "up"},)
    theta: PositiveFloat = Field(
        10000.0, description="base of the angle frequencies theta^(-2i/d) (Llama 3: 500000)")
    fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="fraction of each head's dims rotated, r = "
        "int(head_dim * fraction), made even by odd_rounding (GPT-NeoX's rotary_pct; the rest "
        "pass unrotated)")
    odd_rounding: Literal["down", "up"] = Field(
        "down", description="an odd r: down rotates r - 1 dims; up rotates r + 1 dims with "
        "the r/2 rounded up frequencies theta^(-2i/r) of the odd r, as Hugging Face's rotary "
        "code does (GPT-NeoX with head_dim 12, rotary_pct 0.25)")

    def errors(self, model) -> list[tuple[str, str]]:
        head_dim = getattr(model.attention, "head_dim", None) or model.emb_dim // model.n_heads
        rot = int(head_dim * self.fraction)
        if self.odd_rounding == "up" and rot % 2 and rot + 1 > head_dim:
            return [("odd_rounding", f"rounding int({head_dim} * {self.fraction}) = {rot} up "
                     f"rotates {rot + 1} dims, more than the head has ({head_dim}); use "
                     "odd_rounding: down")]
        return []


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim (the GPT-NeoX/HF Llama
    pairing: dim i rotates with dim i + d/2)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat((-x2, x1), dim=-1)  # (..., d)


class RotaryPositions(Positions):
    """RoPE (Su et al. 2021) in the rotate_half layout of GPT-NeoX and Hugging Face Llama:
    ``x * cos + rotate_half(x) * sin`` over the first ``rot`` dims of each head, with angle
    ``pos * theta^(-2i/rot)`` shared by dims i and i + rot/2. Angles are computed in float32
    and cast to the input's dtype, as Hugging Face does. With ``odd_rounding="up"`` and an
    odd ``r = int(head_dim * fraction)``, the angles are ``pos * theta^(-2i/r)`` for
    i < (r + 1)/2, so r + 1 dims rotate (Hugging Face's ``inv_freq`` over the odd r)."""

    rotates = True

    def __init__(self, theta: float = 10000.0, fraction: float = 1.0,
                 odd_rounding: str = "down"):
        super().__init__()
        self.theta, self.fraction, self.odd_rounding = theta, fraction, odd_rounding
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rotary_dims(self, head_dim: int) -> int:
        """The ``r`` whose frequencies theta^(-2i/r) rotate r dims (r even) or, rounded up,
        r + 1 (r odd)."""
        rot = int(head_dim * self.fraction)
        return rot if self.odd_rounding == "up" else rot - rot % 2

    def cos_sin(self, rot: int, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, (B or 1, 1, T, rot rounded up to even) in float32, for positions
        (B or 1, T)."""
        device = position_ids.device
        inv_freq = 1.0 / (self.theta ** (
            torch.arange(0, rot, 2, dtype=torch.int64, device=device).float() / rot))  # (ceil(rot/2),)
        freqs = position_ids[..., None].float() * inv_freq  # (B, T, ceil(rot/2))
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, 2 ceil(rot/2))
        return emb.cos()[:, None], emb.sin()[:, None]  # (B, 1, T, 2 ceil(rot/2)) each

    def _default_cos_sin(self, rot: int, t: int, device: torch.device):
        key = (rot, t, str(device))
        if key not in self._cache:
            if len(self._cache) > 8:
                self._cache.clear()
            self._cache[key] = self.cos_sin(rot, torch.arange(t, device=device)[None])
        return self._cache[key]

    def rotate(self, q, k, position_ids=None):  # q (B, H, T, hd), k (B, H_kv, T, hd)
        rot = self.rotary_dims(q.shape[-1])
        if rot == 0:
            return q, k
        if position_ids is None:
            cos, sin = self._default_cos_sin(rot, q.shape[2], q.device)
        else:
            cos, sin = self.cos_sin(rot, position_ids)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # (B, 1, T, width)
        width = cos.shape[-1]  # rot, or rot + 1 for an odd rot rounded up
        return self._rotate_one(q, cos, sin, width), self._rotate_one(k, cos, sin, width)

    @staticmethod
    def _rotate_one(x, cos, sin, rot):  # x (B, H, T, hd)
        x_rot, x_pass = x[..., :rot], x[..., rot:]  # (B, H, T, rot), (B, H, T, hd - rot)
        x_rot = x_rot * cos + rotate_half(x_rot) * sin  # (B, H, T, rot)
        return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot

    def extra_repr(self) -> str:
        odd = ", odd_rounding=up" if self.odd_rounding == "up" else ""
        return f"theta={self.theta}, fraction={self.fraction}{odd}"


class ALiBiSpec(ComponentSpec):
    """Attention with Linear Biases (ALiBi, Press et al. 2022, "Train Short, Test Long"): no
    position embeddings; each head's scores get -slope * distance to the key."""

    kind: Literal["alibi"] = "alibi"
    acts_in_attention: ClassVar[bool] = True
    biases_scores: ClassVar[bool] = True  # a sequence mixer without scores cannot take it


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Per-head slopes (Press et al. 2022, sec. 3): for n a power of 2, the geometric sequence
    2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise the slopes of the closest smaller power of 2,
    m, followed by every other slope of 2m, until n are taken (the paper's code)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_2(n_heads))
    m = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(power_of_2(m) + power_of_2(2 * m)[0::2][: n_heads - m])


class ALiBiPositions(Positions):
    """ALiBi (Press et al. 2022): score bias -slope_h * |i - j| for query i and key j (for
    causal attention the paper's -slope_h * (i - j) on every visible key; bidirectional
    attention uses the symmetric distance). Distances count sequence indices: with left
    padding, the distances between real tokens are unchanged."""

    biases = True

    def score_bias(self, n_heads, t, s, device, dtype):
        slopes = alibi_slopes(n_heads).to(device=device, dtype=torch.float32)  # (H,)
        i = torch.arange(t, device=device)[:, None] + (s - t)  # (T, 1): queries end with keys
        j = torch.arange(s, device=device)[None, :]  # (1, S)
        distance = (i - j).abs().float()  # (T, S)
        return (-slopes[:, None, None] * distance).to(dtype)  # (H, T, S)
