"""Residual wiring around one sublayer and its norm."""

from typing import Literal

from pydantic import Field
from torch import nn

from variantlab import ComponentSpec, hookimpl


class ResidualSpec(ComponentSpec):
    """Options shared by the residual kinds."""

    shortcut: bool = Field(True, description="add the sublayer's input back to its output")


class PreNormSpec(ResidualSpec):
    """Pre-LN residual (GPT-2; Xiong et al. 2020): x + drop(f(norm(x)))."""

    kind: Literal["pre_norm"] = "pre_norm"


class PreNorm(nn.Module):
    """Pre-LN residual (GPT-2; Xiong et al. 2020): x + drop(f(norm(x))).

        x ──┬── norm ── f ── drop ──(+)── out
            └────────── shortcut ────┘
    """

    def __init__(self, sublayer, norm, drop_rate, shortcut):
        super().__init__()
        self.norm, self.sublayer = norm, sublayer
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.shortcut = shortcut

    def forward(self, x, *args, **kwargs):
        shortcut = x
        x = self.norm(x)
        x = self.sublayer(x, *args, **kwargs)
        x = self.drop_shortcut(x)
        if self.shortcut:
            x = x + shortcut
        return x


class PostNormSpec(ResidualSpec):
    """Post-LN residual (Vaswani et al. 2017): norm(x + drop(f(x)))."""

    kind: Literal["post_norm"] = "post_norm"


class PostNorm(nn.Module):
    """Post-LN residual (Vaswani et al. 2017): norm(x + drop(f(x))).

        x ──┬── f ── drop ──(+)── norm ── out
            └─── shortcut ───┘
    """

    def __init__(self, sublayer, norm, drop_rate, shortcut):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.shortcut = shortcut

    def forward(self, x, *args, **kwargs):
        shortcut = x
        x = self.sublayer(x, *args, **kwargs)
        x = self.drop_shortcut(x)
        if self.shortcut:
            x = x + shortcut
        return self.norm(x)


@hookimpl
def register_residuals(register):
    def pre(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        return PreNorm(sublayer, make_norm(in_dim), drop_rate, spec.shortcut)

    def post(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        return PostNorm(sublayer, make_norm(out_dim), drop_rate, spec.shortcut)

    register("pre_norm", PreNormSpec, pre)
    register("post_norm", PostNormSpec, post)
