"""A broken norm: drops half of the channels."""
from typing import Literal

import torch
from torch import nn

from variantlab import ComponentSpec, hookimpl


class WrongShapeSpec(ComponentSpec):
    kind: Literal["wrong_shape"] = "wrong_shape"


class WrongShape(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim // 2))

    def forward(self, x):
        return self.scale * x[..., : x.shape[-1] // 2]


@hookimpl
def register_norms(register):
    register("wrong_shape", WrongShapeSpec, lambda spec, dim: WrongShape(dim))
