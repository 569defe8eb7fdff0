"""Elementwise activations."""

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from variantlab import ComponentSpec, hookimpl


class GELUSpec(ComponentSpec):
    """GELU (Hendrycks & Gimpel 2016): x * Phi(x), exact or with the tanh approximation."""

    kind: Literal["gelu"] = "gelu"
    approximate: Literal["tanh", "none"] = Field(
        "tanh", description="tanh: the approximation the seeds (and GPT-2) use; none: exact erf")
    impl: Literal["naive", "fused"] = Field(
        "naive", description="naive: the explicit formula; fused: F.gelu")


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
    """ReLU (Nair & Hinton 2010): max(0, x)."""

    kind: Literal["relu"] = "relu"


class SiLUSpec(ComponentSpec):
    """SiLU (Elfwing et al. 2017), a.k.a. Swish (Ramachandran et al. 2017): x * sigmoid(x)."""

    kind: Literal["silu"] = "silu"


class ReLU2Spec(ComponentSpec):
    """Squared ReLU (So et al. 2021, "Primer"): max(0, x)^2."""

    kind: Literal["relu2"] = "relu2"


class ReLU2(nn.Module):
    """Squared ReLU (So et al. 2021, "Primer: Searching for Efficient Transformers"):
    max(0, x)^2, elementwise."""

    def forward(self, x):
        return torch.relu(x).square()


@hookimpl
def register_activations(register):
    register("gelu", GELUSpec, lambda spec: GELU(spec))
    register("relu", ReLUSpec, lambda spec: nn.ReLU())
    register("silu", SiLUSpec, lambda spec: nn.SiLU())
    register("relu2", ReLU2Spec, lambda spec: ReLU2())
