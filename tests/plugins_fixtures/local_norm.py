"""A working plugin file: norm `centre` subtracts the mean over channels, then scales."""
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from variantlab import ComponentSpec, hookimpl


class CentreSpec(ComponentSpec):
    kind: Literal["centre"] = "centre"
    init_scale: float = Field(1.0, gt=0, description="initial value of the per-channel scale")


class Centre(nn.Module):
    def __init__(self, dim: int, init_scale: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init_scale))

    def forward(self, x):  # (..., dim)
        return self.scale * (x - x.mean(dim=-1, keepdim=True))


@hookimpl
def register_norms(register):
    register("centre", CentreSpec, lambda spec, dim: Centre(dim, spec.init_scale))
