"""A broken norm: its initial gain comes from Python's `random`, which torch.manual_seed
does not seed, so two builds under the same seed differ."""
import random
from typing import Literal

import torch
from torch import nn

from variantlab import ComponentSpec, hookimpl


class RandomInitSpec(ComponentSpec):
    kind: Literal["random_init"] = "random_init"


class RandomInit(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(1.0 + random.random()))

    def forward(self, x):
        return self.gain * x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


@hookimpl
def register_norms(register):
    register("random_init", RandomInitSpec, lambda spec, dim: RandomInit(dim))
