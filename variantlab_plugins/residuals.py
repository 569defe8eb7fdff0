"""Residual wiring around one sublayer and its norm(s); ``parallel`` (in
:mod:`variantlab_plugins.residual_blocks`) wraps a whole block.

Every kind draws the branch through ``drop_shortcut`` (the residual dropout) before adding it.
``shortcut: false`` keeps the wiring and leaves out the added input (an ablation); kinds where
that is meaningless (``rezero``, ``parallel``) have no such option.
"""

from typing import ClassVar, Literal

import torch
from pydantic import Field, PositiveFloat
from torch import nn

from variantlab import ComponentSpec, ModelSpec, hookimpl
from variantlab_plugins.residual_blocks import Parallel, ParallelSpec


class ResidualSpec(ComponentSpec):
    """Options shared by the residual kinds."""

    shortcut: bool = Field(True, description="add the sublayer's input back to its output")


class PreNormSpec(ResidualSpec):
    """Pre-LN residual (GPT-2; Xiong et al. 2020): x + drop(f(norm(x))), the branch times
    ``branch_scale`` (Granite's residual_multiplier)."""

    kind: Literal["pre_norm"] = "pre_norm"
    branch_scale: PositiveFloat = Field(
        1.0, description="multiplies the branch before it is added: x + m * drop(f(norm(x))) "
        "(Granite's residual_multiplier, IBM 2024)")
    added_options: ClassVar[tuple[str, ...]] = ("branch_scale",)


class PreNorm(nn.Module):
    """Pre-LN residual (GPT-2; Xiong et al. 2020): x + drop(f(norm(x))), the branch times
    ``branch_scale`` when it is not 1 (Granite).

        x ──┬── norm ── f ── drop ── (×m) ──(+)── out
            └────────── shortcut ────────────┘
    """

    def __init__(self, sublayer, norm, drop_rate, shortcut, branch_scale: float = 1.0):
        super().__init__()
        self.norm, self.sublayer = norm, sublayer
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.shortcut = shortcut
        self.branch_scale = branch_scale

    def forward(self, x, *args, **kwargs):
        shortcut = x
        x = self.norm(x)
        x = self.sublayer(x, *args, **kwargs)
        x = self.drop_shortcut(x)
        if self.branch_scale != 1.0:
            x = x * self.branch_scale
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


class SandwichSpec(ResidualSpec):
    """Peri-LN / sandwich residual (Kim et al. 2025; Ding et al. 2021 "CogView"):
    x + drop(norm_out(f(norm_in(x))))."""

    kind: Literal["sandwich"] = "sandwich"


class Sandwich(nn.Module):
    """Peri-LN (Kim et al. 2025, "Peri-LN: Revisiting Layer Normalization in the Transformer
    Architecture"): a norm before and a norm after the sublayer, x + drop(norm_out(f(norm_in(x)))).

        x ──┬── norm_in ── f ── norm_out ── drop ──(+)── out
            └─────────────── shortcut ──────────────┘
    """

    def __init__(self, sublayer, norm_in, norm_out, drop_rate, shortcut):
        super().__init__()
        self.norm_in, self.sublayer, self.norm_out = norm_in, sublayer, norm_out
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.shortcut = shortcut

    def forward(self, x, *args, **kwargs):  # (B, T, in_dim)
        shortcut = x
        x = self.norm_in(x)
        x = self.sublayer(x, *args, **kwargs)  # (B, T, out_dim)
        x = self.norm_out(x)
        x = self.drop_shortcut(x)
        if self.shortcut:
            x = x + shortcut
        return x


class PostSublayerSpec(ResidualSpec):
    """Norm on the sublayer's output inside the branch (OLMo 2, OLMo et al. 2024):
    x + drop(norm(f(x)))."""

    kind: Literal["post_sublayer"] = "post_sublayer"


class PostSublayer(nn.Module):
    """OLMo 2's reordered norm (OLMo et al. 2024, "2 OLMo 2 Furious"): the sublayer sees the
    raw stream and its output is normalised before it is added, x + drop(norm(f(x))).

        x ──┬── f ── norm ── drop ──(+)── out
            └───────── shortcut ─────┘
    """

    def __init__(self, sublayer, norm, drop_rate, shortcut):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.shortcut = shortcut

    def forward(self, x, *args, **kwargs):  # (B, T, in_dim)
        shortcut = x
        x = self.sublayer(x, *args, **kwargs)  # (B, T, out_dim)
        x = self.norm(x)
        x = self.drop_shortcut(x)
        if self.shortcut:
            x = x + shortcut
        return x


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet's residual scale for an N-layer decoder-only (or encoder-only) model:
    alpha = (2N)^(1/4) (Wang et al. 2022, table 1)."""
    return (2 * n_layers) ** 0.25


class DeepNormSpec(ResidualSpec):
    """DeepNorm (Wang et al. 2022, "DeepNet"): norm(alpha * x + drop(f(x))), alpha = (2N)^(1/4);
    pair it with init: deepnorm."""

    kind: Literal["deepnorm"] = "deepnorm"
    alpha: PositiveFloat | None = Field(
        None, description="the shortcut's scale; unset: (2N)^(1/4) for N = n_layers "
        "(decoder-only / encoder-only constants)")

    def warnings(self, model: ModelSpec) -> list[str]:
        found = []
        if model.init.kind != "deepnorm":
            found.append(f"residual 'deepnorm' with init {model.init.kind!r}: DeepNet's "
                         "alpha is meant for its down-scaled init; set init: deepnorm")
        if model.family in ("decoder", "encoder_decoder") and self.alpha is None:
            found.append(f"residual 'deepnorm' in family {model.family!r}: alpha uses the "
                         "decoder-only constant (2N)^(1/4), not DeepNet's encoder-decoder ones")
        return found


class DeepNorm(nn.Module):
    """DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"): a post-LN
    residual whose shortcut is up-weighted by a constant alpha, norm(alpha * x + drop(f(x))).

        x ──┬── f ── drop ──(+)── norm ── out
            └──── × alpha ───┘
    """

    def __init__(self, sublayer, norm, drop_rate, shortcut, alpha: float):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.shortcut, self.alpha = shortcut, alpha

    def forward(self, x, *args, **kwargs):  # (B, T, in_dim)
        shortcut = x
        x = self.sublayer(x, *args, **kwargs)  # (B, T, out_dim)
        x = self.drop_shortcut(x)
        if self.shortcut:
            x = x + self.alpha * shortcut
        return self.norm(x)


class ReZeroSpec(ComponentSpec):
    """ReZero (Bachlechner et al. 2020): x + a * drop(f(x)), a learned scalar starting at 0,
    no norm. No shortcut option: without it the output would start at zero."""

    kind: Literal["rezero"] = "rezero"
    #: the branch is gated by a zero at initialisation, so the sublayer's own parameters get
    #: an all-zero gradient on the first step (by design); the conformance kit allows it
    zero_init_branch: ClassVar[bool] = True


class ReZero(nn.Module):
    """ReZero (Bachlechner et al. 2020, "ReZero is All You Need"): x + a * drop(f(x)) with one
    learned scalar a per residual, initialised to 0 so every layer starts as the identity.

        x ──┬── f ── drop ── × a ──(+)── out
            └────── shortcut ───────┘
    """

    def __init__(self, sublayer, drop_rate):
        super().__init__()
        self.sublayer = sublayer
        self.drop_shortcut = nn.Dropout(drop_rate)
        self.resweight = nn.Parameter(torch.zeros(()))  # the scalar a

    def forward(self, x, *args, **kwargs):  # (B, T, D)
        shortcut = x
        x = self.sublayer(x, *args, **kwargs)  # (B, T, D)
        x = self.drop_shortcut(x)
        return shortcut + self.resweight * x


@hookimpl
def register_residuals(register):
    def pre(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        return PreNorm(sublayer, make_norm(in_dim), drop_rate, spec.shortcut, spec.branch_scale)

    def post(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        return PostNorm(sublayer, make_norm(out_dim), drop_rate, spec.shortcut)

    def sandwich(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        return Sandwich(sublayer, make_norm(in_dim), make_norm(out_dim), drop_rate, spec.shortcut)

    def post_sublayer(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        return PostSublayer(sublayer, make_norm(out_dim), drop_rate, spec.shortcut)

    def deepnorm(spec, sublayer, make_norm, in_dim, out_dim, drop_rate, n_layers):
        alpha = spec.alpha if spec.alpha is not None else deepnorm_alpha(n_layers)
        return DeepNorm(sublayer, make_norm(out_dim), drop_rate, spec.shortcut, alpha)

    def rezero(spec, sublayer, make_norm, in_dim, out_dim, drop_rate):
        if in_dim != out_dim:
            raise ValueError(f"residual 'rezero' needs in_dim == out_dim, got {in_dim}, {out_dim}")
        return ReZero(sublayer, drop_rate)

    def parallel(spec, attention, feedforward, make_norm, dim, drop_rate):
        norm2 = None if spec.shared_norm else make_norm(dim)
        return Parallel(attention, feedforward, make_norm(dim), norm2, drop_rate)

    register("pre_norm", PreNormSpec, pre)
    register("post_norm", PostNormSpec, post)
    register("sandwich", SandwichSpec, sandwich)
    register("post_sublayer", PostSublayerSpec, post_sublayer)
    register("deepnorm", DeepNormSpec, deepnorm)
    register("rezero", ReZeroSpec, rezero)
    register("parallel", ParallelSpec, parallel)
