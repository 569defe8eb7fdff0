"""Weight initialisation schemes, applied once to the assembled model.

``default`` keeps each module's own PyTorch initialisation (what the seeds use, so their
numbers hold). The others re-initialise the weights in place, after the family built them.
"""

import math
from collections.abc import Callable
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.roles import OUTPUT_ROLES, role_of


def stacked(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """``(module, parameter name, role)`` of the stacked per-expert projections that modules
    list in ``variantlab_stacked`` (the ``moe`` feed-forward's ``W_up`` (n_experts, out, in)
    ...): each slice along the first dim is one Linear's weight; its bias, if any, is the
    parameter named with ``b_`` for ``W_``."""
    return [(m, name, role) for m in model.modules()
            for name, role in getattr(m, "variantlab_stacked", ())]


def stacked_bias(module: nn.Module, name: str):
    return getattr(module, "b_" + name[2:], None) if name.startswith("W_") else None


class DefaultInitSpec(ComponentSpec):
    """PyTorch's own per-module initialisation, untouched (what the seeds use)."""

    kind: Literal["default"] = "default"


class XavierInitSpec(ComponentSpec):
    """Xavier/Glorot init (Glorot & Bengio 2010) of every Linear weight, biases zero."""

    kind: Literal["xavier"] = "xavier"
    distribution: Literal["uniform", "normal"] = Field(
        "uniform", description="xavier_uniform_ or xavier_normal_")
    gain: PositiveFloat = Field(1.0, description="scales the Glorot bound / std")


class NormalInitSpec(ComponentSpec):
    """GPT-2's init (Radford et al. 2019): N(0, std) weights, zero biases, scaled projections."""

    kind: Literal["normal"] = "normal"
    std: PositiveFloat = Field(0.02, description="std of every Linear and Embedding weight")
    scale_residual: bool = Field(
        True, description="divide the std of each sublayer's output projection by sqrt(N), "
        "N = number of residual additions (2 per layer; 1 with parallel; 0 without shortcut)")


def keep_default(model: nn.Module) -> None:
    """PyTorch's per-module initialisation, untouched."""


def xavier(spec: XavierInitSpec) -> Callable[[nn.Module], None]:
    """Glorot & Bengio 2010 on every Linear weight, biases zero: the Transformer init of
    Vaswani et al. 2017 as Xiong et al. 2020 use it. Embeddings and norms keep theirs."""
    fill = nn.init.xavier_uniform_ if spec.distribution == "uniform" else nn.init.xavier_normal_

    def apply(model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                fill(module.weight, gain=spec.gain)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module, name, _ in stacked(model):
            for w in getattr(module, name):  # one expert's (out, in) weight at a time
                fill(w, gain=spec.gain)
            if stacked_bias(module, name) is not None:
                nn.init.zeros_(stacked_bias(module, name))

    return apply


def output_projections(model: nn.Module) -> set[nn.Module]:
    """The Linears that write a sublayer's output to the residual stream, as their components
    declare them (``variantlab_role`` ``attn_out`` / ``ffn_out``, see
    :mod:`variantlab.model.roles`). An attention or feed-forward holding Linears but declaring no
    output projection is an error: guessing (say, its last Linear) would scale the wrong one."""
    found = {m for m in model.modules() if role_of(m) in OUTPUT_ROLES}
    for module in model.modules():
        slot = getattr(module, "variantlab_slot", None)
        if slot in ("attention", "feedforward") and not any(
                role_of(m) in OUTPUT_ROLES for m in module.modules()) and not any(
                role in OUTPUT_ROLES for _, _, role in stacked(module)) and any(
                isinstance(m, nn.Linear) for m in module.modules()):
            raise ValueError(
                f"init 'normal' scales each sublayer's output projection, but the "
                f"{slot} '{getattr(module, 'variantlab_kind', '?')}' declares none; mark it "
                f"with variantlab.model.roles.declare_role(linear, 'attn_out' or 'ffn_out'), or set "
                f"init: {{kind: normal, scale_residual: false}}")
    return found


def residual_additions(model: nn.Module) -> int:
    """How many times a sublayer's output is added to the residual stream: one per module in
    the residual slot, whatever its kind wraps. A per-sublayer kind (pre/post-norm, sandwich,
    post_sublayer, deepnorm, rezero) adds once per sublayer, 2N in an N-layer decoder; a
    block-scope kind (``parallel``) once per block, N. A residual built with
    ``shortcut: false`` adds nothing (its module's ``shortcut`` is false) and counts 0."""
    return sum(
        bool(getattr(m, "shortcut", True)) for m in model.modules()
        if getattr(m, "variantlab_slot", None) == "residual")


def normal(spec: NormalInitSpec) -> Callable[[nn.Module], None]:
    """GPT-2's init (Radford et al. 2019): N(0, std) weights, zero biases, and output
    projections scaled by 1/sqrt(N) for N residual additions (see :func:`residual_additions`;
    nanoGPT's 2 * n_layer for its pre-norm GPT)."""

    def apply(model: nn.Module) -> None:
        n_res = residual_additions(model)
        scaled = output_projections(model) if spec.scale_residual and n_res else set()
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = spec.std / math.sqrt(n_res) if module in scaled else spec.std
                nn.init.normal_(module.weight, mean=0.0, std=std)
                pad = getattr(module, "padding_idx", None)
                if isinstance(pad, int):
                    nn.init.zeros_(module.weight[pad])
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for module, name, role in stacked(model):
            std = spec.std / math.sqrt(n_res) if scaled and role in OUTPUT_ROLES else spec.std
            nn.init.normal_(getattr(module, name), mean=0.0, std=std)
            if stacked_bias(module, name) is not None:
                nn.init.zeros_(stacked_bias(module, name))

    return apply


class DeepNormInitSpec(ComponentSpec):
    """DeepNet's init (Wang et al. 2022): Xavier-normal weights, gain beta = (8N)^(-1/4) on the
    feed-forward, value and attention output projections, gain 1 on query and key."""

    kind: Literal["deepnorm"] = "deepnorm"
    n_layers: PositiveInt | None = Field(
        None, description="N in beta = (8N)^(-1/4); unset: the number of blocks in the model")


#: Linear roles (``variantlab_role``, set by the component that creates the Linear) that
#: DeepNet initialises with gain beta, and those it initialises with gain 1
DEEPNORM_SCALED = frozenset({"value", "attn_out", "ffn_in", "ffn_gate", "ffn_out"})
DEEPNORM_UNSCALED = frozenset({"query", "key"})


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet's init gain for an N-layer decoder-only (or encoder-only) model:
    beta = (8N)^(-1/4) (Wang et al. 2022, table 1)."""
    return (8 * n_layers) ** -0.25


def deepnorm(spec: DeepNormInitSpec) -> Callable[[nn.Module], None]:
    """DeepNet (Wang et al. 2022, fig. 2): xavier_normal_(w, gain=beta) for the FFN, value and
    output projections, xavier_normal_(w, gain=1) for query and key, biases zero. The roles come
    from each Linear's ``variantlab_role``; Linears without one (head, embeddings) keep theirs."""

    def apply(model: nn.Module) -> None:
        n_layers = spec.n_layers or max(1, sum(
            hasattr(m, "variantlab_layer") for m in model.modules()))
        beta = deepnorm_beta(n_layers)
        roles = [(m, role_of(m)) for m in model.modules()
                 if isinstance(m, nn.Linear)]
        experts = stacked(model)
        if not any(role in DEEPNORM_SCALED for _, role in roles) and not experts:
            raise ValueError(
                "init 'deepnorm' found no Linear marked as a value, output or feed-forward "
                "projection (variantlab_role); use it with components that declare roles")
        for module, role in roles:
            gain = beta if role in DEEPNORM_SCALED else 1.0 if role in DEEPNORM_UNSCALED else None
            if gain is None:
                continue
            nn.init.xavier_normal_(module.weight, gain=gain)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        for holder, name, role in experts:
            gain = beta if role in DEEPNORM_SCALED else 1.0
            for w in getattr(holder, name):  # one expert's (out, in) weight at a time
                nn.init.xavier_normal_(w, gain=gain)
            if stacked_bias(holder, name) is not None:
                nn.init.zeros_(stacked_bias(holder, name))

    return apply


@hookimpl
def register_inits(register):
    register("default", DefaultInitSpec, lambda spec: keep_default)
    register("xavier", XavierInitSpec, xavier)
    register("normal", NormalInitSpec, normal)
    register("deepnorm", DeepNormInitSpec, deepnorm)
