"""A norm that builds but raises in forward: its units must fail alone."""
from typing import Literal

from torch import nn

from variantlab import ComponentSpec, hookimpl


class ExplodesSpec(ComponentSpec):
    kind: Literal["explodes"] = "explodes"


class Explodes(nn.Module):
    def forward(self, x):
        raise RuntimeError("explodes: forward fails on purpose")


@hookimpl
def register_norms(register):
    register("explodes", ExplodesSpec, lambda spec, dim: Explodes())
