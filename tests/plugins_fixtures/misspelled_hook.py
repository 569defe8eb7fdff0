"""A plugin whose hook name is misspelled: register_norm instead of register_norms."""
from typing import Literal

from torch import nn

from variantlab import ComponentSpec, hookimpl


class TypoSpec(ComponentSpec):
    kind: Literal["typo"] = "typo"


@hookimpl
def register_norm(register):
    register("typo", TypoSpec, lambda spec, dim: nn.Identity())
