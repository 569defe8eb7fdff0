"""ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears"): g * x / ||x||.

One learned scalar g per norm, initialised to sqrt(dim), replaces LayerNorm's per-channel
scale and shift; the L2 norm is taken over the last dimension.
"""

import math
from typing import Literal

import torch
from pydantic import Field, PositiveFloat
from torch import nn

from variantlab import ComponentSpec, hookimpl


class ScaleNormSpec(ComponentSpec):
    """ScaleNorm: g * x / max(||x||, eps), one learned scalar g."""

    kind: Literal["scale"] = "scale"
    eps: PositiveFloat = Field(1e-5, description="lower bound on ||x|| (avoids dividing by 0)")
    init: PositiveFloat | None = Field(None, description="initial g; default sqrt(dim)")


class ScaleNorm(nn.Module):
    def __init__(self, dim: int, eps: float, init: float | None):
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.tensor(init if init is not None else math.sqrt(dim)))

    def forward(self, x):  # (..., dim)
        norm = x.norm(dim=-1, keepdim=True).clamp_min(self.eps)  # (..., 1)
        return self.g * x / norm


@hookimpl
def register_norms(register):
    register("scale", ScaleNormSpec, lambda spec, dim: ScaleNorm(dim, spec.eps, spec.init))
