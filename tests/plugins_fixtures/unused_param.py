"""A broken norm: one parameter never takes part in the forward pass."""
from typing import Literal

import torch
from torch import nn

from variantlab import ComponentSpec, hookimpl


class UnusedParamSpec(ComponentSpec):
    kind: Literal["unused_param"] = "unused_param"


class UnusedParam(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.forgotten_shift = nn.Parameter(torch.zeros(dim))  # never used

    def forward(self, x):
        return self.scale * x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


@hookimpl
def register_norms(register):
    register("unused_param", UnusedParamSpec, lambda spec, dim: UnusedParam(dim))
