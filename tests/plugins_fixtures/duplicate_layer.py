"""A plugin that registers norm `layer`, which the built-ins already own."""
from typing import Literal

from torch import nn

from variantlab import ComponentSpec, hookimpl


class LayerAgainSpec(ComponentSpec):
    kind: Literal["layer"] = "layer"


@hookimpl
def register_norms(register):
    register("layer", LayerAgainSpec, lambda spec, dim: nn.LayerNorm(dim))
