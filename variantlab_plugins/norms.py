"""Normalisation layers: (..., dim) -> (..., dim)."""

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat
from torch import nn

from variantlab import ComponentSpec, hookimpl


class LayerNormSpec(ComponentSpec):
    """LayerNorm (Ba et al. 2016): centre and scale over the last dim, learned scale and shift."""

    kind: Literal["layer"] = "layer"
    eps: PositiveFloat = Field(1e-5, description="added to the variance before the square root")
    fast_impl: ClassVar[str | None] = "fused"  # kernels: fast, impl unset
    impl: Literal["naive", "fused"] = Field(
        "naive", description="naive: the seeds' explicit formula; fused: F.layer_norm, same "
        "parameters")
    affine: bool = Field(
        True, description="true: a learned scale (and shift, with the model's norm_bias); "
        "false: no parameters at all, OLMo 1's LayerNorm (Groeneveld et al. 2024)")
    added_options: ClassVar[tuple[str, ...]] = ("affine",)


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016): biased variance over the last dim, scale, shift
    (none without ``affine``: OLMo 1)."""

    def __init__(self, dim: int, spec: LayerNormSpec, bias: bool = True):
        super().__init__()
        self.eps, self.fused = spec.eps, spec.impl == "fused"
        self.scale = nn.Parameter(torch.ones(dim)) if spec.affine else None
        # norm_bias: false, or no affine parameters at all
        self.shift = nn.Parameter(torch.zeros(dim)) if bias and spec.affine else None

    def forward(self, x):  # (..., dim)
        if self.fused:
            return F.layer_norm(x, x.shape[-1:], self.scale, self.shift, self.eps)
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # (..., 1)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        if self.scale is None:
            return norm_x
        if self.shift is None:
            return self.scale * norm_x
        return self.scale * norm_x + self.shift


class BatchNormSpec(ComponentSpec):
    """BatchNorm (Ioffe & Szegedy 2015): per-channel statistics over batch and positions."""

    kind: Literal["batch"] = "batch"
    eps: PositiveFloat = Field(1e-5, description="added to the variance before the square root")
    momentum: float = Field(
        0.1, gt=0.0, le=1.0, description="weight of each batch in the running mean and variance "
        "used in eval mode")

    pools_positions: ClassVar[bool] = True  # warned in a causal model, wherever it sits


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
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * scale, no centring.

    ``float32``: normalise in float32 at least (a bfloat16 or float16 input is cast up, then
    the result back before the scale), as Jamba's inner norms do; the same numbers for a
    float32 input."""

    def __init__(self, dim: int, spec: RMSNormSpec, float32: bool = False):
        super().__init__()
        self.eps, self.float32 = spec.eps, float32
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # (..., dim)
        y = x.to(torch.promote_types(x.dtype, torch.float32)) if self.float32 else x
        rms = torch.sqrt(y.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return self.scale * (y / rms).to(x.dtype)


class L2NormSpec(ComponentSpec):
    """Llama 4's QK "L2 norm" (Meta 2025, Llama 4 model card): x / sqrt(mean(x^2) + eps) with
    no learned scale, an RMSNorm without parameters (as a ``qk_norm``, it commutes with
    rotary: a rotation keeps the norm)."""

    kind: Literal["l2"] = "l2"
    eps: PositiveFloat = Field(1e-6, description="added to mean(x^2) before the square root")


class L2Norm(nn.Module):
    """x / sqrt(mean(x^2) + eps), no parameters (Llama 4's Llama4TextL2Norm)."""

    def __init__(self, spec: L2NormSpec):
        super().__init__()
        self.eps = spec.eps

    def forward(self, x):  # (..., dim)
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


class DyTSpec(ComponentSpec):
    """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"):
    scale * tanh(alpha * x) + shift, a drop-in replacement for a norm layer."""

    kind: Literal["dyt"] = "dyt"
    alpha0: PositiveFloat = Field(
        0.5, description="initial value of the learned scalar alpha inside tanh (the paper's "
        "default 0.5)")


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al. 2025): scale * tanh(alpha * x) + shift.

    ``alpha`` is one learned scalar starting at ``alpha0``; ``scale`` (ones) and ``shift``
    (zeros) are per channel, as a LayerNorm's. No statistics are computed.
    """

    def __init__(self, dim: int, spec: DyTSpec, bias: bool = True):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(spec.alpha0)))  # scalar
        self.scale = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim)) if bias else None  # norm_bias: false

    def forward(self, x):  # (..., dim)
        x = self.scale * torch.tanh(self.alpha * x)
        return x if self.shift is None else x + self.shift


class NoNormSpec(ComponentSpec):
    """No normalisation: the identity, for ablations."""

    kind: Literal["none"] = "none"


@hookimpl
def register_norms(register):
    register("layer", LayerNormSpec, lambda spec, dim, bias=True: LayerNorm(dim, spec, bias))
    register("batch", BatchNormSpec, lambda spec, dim: BatchNorm(dim, spec))
    register("rms", RMSNormSpec, lambda spec, dim: RMSNorm(dim, spec))
    register("l2", L2NormSpec, lambda spec, dim: L2Norm(spec))
    register("dyt", DyTSpec, lambda spec, dim, bias=True: DyT(dim, spec, bias))
    register("none", NoNormSpec, lambda spec, dim: nn.Identity())
