"""Elementwise activations."""

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from variantlab import ComponentSpec, hookimpl


class GELUSpec(ComponentSpec):
    kind: Literal["gelu"] = "gelu"
    approximate: Literal["tanh", "none"] = Field("tanh", description="tanh: the seeds' form")
    impl: Literal["naive", "fused"] = Field("naive", description="naive: the explicit formula")


class GELU(nn.Module):
    """GELU (Hendrycks & Gimpel 2016). ``tanh``: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)));
    ``none``: 0.5x(1 + erf(x / sqrt(2)))."""

    def __init__(self, spec: GELUSpec):
        super().__init__()
        self.approximate, self.fused = spec.approximate, spec.impl == "fused"

    def forward(self, x):
        if self.fused:
            return F.gelu(x, approximate=self.approximate)
        if self.approximate == "none":
            return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))
        c = torch.sqrt(torch.tensor(2.0 / torch.pi))
        return 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3))))


class ReLUSpec(ComponentSpec):
    kind: Literal["relu"] = "relu"


class SiLUSpec(ComponentSpec):
    kind: Literal["silu"] = "silu"


@hookimpl
def register_activations(register):
    register("gelu", GELUSpec, lambda spec: GELU(spec))
    register("relu", ReLUSpec, lambda spec: nn.ReLU())
    register("silu", SiLUSpec, lambda spec: nn.SiLU())
