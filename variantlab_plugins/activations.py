"""Elementwise activations."""

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, model_validator
from torch import nn

from variantlab import ComponentSpec, hookimpl


class GELUSpec(ComponentSpec):
    """GELU (Hendrycks & Gimpel 2016): x * Phi(x), exact or with the tanh approximation."""

    kind: Literal["gelu"] = "gelu"
    approximate: Literal["tanh", "none"] = Field(
        "tanh", description="tanh: the approximation the seeds (and GPT-2) use; none: exact erf")
    fast_impl: ClassVar[str | None] = "fused"  # kernels: fast, impl unset
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


class XIELUSpec(ComponentSpec):
    """xIELU (Huang & Schlag 2025, "Deriving activation functions using integration"), as in
    Apertus: a learned quadratic for x > 0 and a learned ELU-like branch below."""

    kind: Literal["xielu"] = "xielu"
    alpha_p_init: PositiveFloat = Field(0.8, description="the positive branch's initial "
                                        "curvature softplus(alpha_p)")
    alpha_n_init: float = Field(0.8, description="the negative branch's initial scale "
                                "beta + softplus(alpha_n); above beta")
    beta: float = Field(0.5, description="the linear term beta * x of both branches")
    eps: float = Field(-1e-6, description="the negative branch reads min(x, eps)")

    @model_validator(mode="after")
    def _alpha_n_above_beta(self):
        if self.alpha_n_init <= self.beta:
            raise ValueError(f"alpha_n_init={self.alpha_n_init} must exceed beta={self.beta} "
                             "(its softplus part starts at alpha_n_init - beta > 0)")
        return self


class XIELU(nn.Module):
    """xIELU (Huang & Schlag 2025): with a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n)
    (two learned scalars), a_p x^2 + beta x for x > 0, else (expm1(min(x, eps)) - x) a_n +
    beta x, elementwise."""

    def __init__(self, spec: XIELUSpec):
        super().__init__()
        def raw(value: float) -> nn.Parameter:  # softplus^-1, so softplus(raw) = value
            return nn.Parameter(torch.log(torch.expm1(torch.tensor(value))).unsqueeze(0))

        self.alpha_p = raw(spec.alpha_p_init)  # (1,)
        self.alpha_n = raw(spec.alpha_n_init - spec.beta)  # (1,)
        self.beta, self.eps = spec.beta, spec.eps

    def forward(self, x):
        alpha_p = F.softplus(self.alpha_p)  # (1,)
        alpha_n = self.beta + F.softplus(self.alpha_n)  # (1,)
        negative = (torch.expm1(torch.clamp(x, max=self.eps)) - x) * alpha_n + self.beta * x
        return torch.where(x > 0, alpha_p * x * x + self.beta * x, negative)


@hookimpl
def register_activations(register):
    register("gelu", GELUSpec, lambda spec: GELU(spec))
    register("relu", ReLUSpec, lambda spec: nn.ReLU())
    register("silu", SiLUSpec, lambda spec: nn.SiLU())
    register("relu2", ReLU2Spec, lambda spec: ReLU2())
    register("xielu", XIELUSpec, lambda spec: XIELU(spec))
