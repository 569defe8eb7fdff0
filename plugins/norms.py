"""Normalisation layers: (..., dim) -> (..., dim)."""

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat
from torch import nn

from variantlab import ComponentSpec, ModelSpec, hookimpl


class LayerNormSpec(ComponentSpec):
    """LayerNorm (Ba et al. 2016): centre and scale over the last dim, learned scale and shift."""

    kind: Literal["layer"] = "layer"
    eps: PositiveFloat = Field(1e-5, description="added to the variance before the square root")
    impl: Literal["naive", "fused"] = Field(
        "naive", description="naive: the seeds' explicit formula; fused: F.layer_norm, same "
        "parameters")


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016): biased variance over the last dim, scale, shift."""

    def __init__(self, dim: int, spec: LayerNormSpec):
        super().__init__()
        self.eps, self.fused = spec.eps, spec.impl == "fused"
        self.scale = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, x):  # (..., dim)
        if self.fused:
            return F.layer_norm(x, x.shape[-1:], self.scale, self.shift, self.eps)
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # (..., 1)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class BatchNormSpec(ComponentSpec):
    """BatchNorm (Ioffe & Szegedy 2015): per-channel statistics over batch and positions."""

    kind: Literal["batch"] = "batch"
    eps: PositiveFloat = Field(1e-5, description="added to the variance before the square root")
    momentum: float = Field(
        0.1, gt=0.0, le=1.0, description="weight of each batch in the running mean and variance "
        "used in eval mode")

    def warnings(self, model: ModelSpec) -> list[str]:
        if not model.causal:
            return []
        return [
            f"norm 'batch' in causal family {model.family!r}: its batch statistics pool over "
            "future positions, so in training each token's output depends on later tokens"
        ]


class BatchNorm(nn.Module):
    """Batch normalisation (Ioffe & Szegedy 2015): per-channel statistics over batch and
    positions; running statistics in eval mode."""

    def __init__(self, dim: int, spec: BatchNormSpec):
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, eps=spec.eps, momentum=spec.momentum)

    def forward(self, x):  # (..., dim)
        flat = x.reshape(-1, x.shape[-1])  # (B*T, dim): positions pooled with the batch
        return self.bn(flat).view(x.shape)


class RMSNormSpec(ComponentSpec):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * scale, no centring."""

    kind: Literal["rms"] = "rms"
    eps: PositiveFloat = Field(1e-5, description="added to mean(x^2) before the square root")


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * scale, no centring."""

    def __init__(self, dim: int, spec: RMSNormSpec):
        super().__init__()
        self.eps = spec.eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # (..., dim)
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return self.scale * (x / rms)


class NoNormSpec(ComponentSpec):
    """No normalisation: the identity, for ablations."""

    kind: Literal["none"] = "none"


@hookimpl
def register_norms(register):
    register("layer", LayerNormSpec, lambda spec, dim: LayerNorm(dim, spec))
    register("batch", BatchNormSpec, lambda spec, dim: BatchNorm(dim, spec))
    register("rms", RMSNormSpec, lambda spec, dim: RMSNorm(dim, spec))
    register("none", NoNormSpec, lambda spec, dim: nn.Identity())
