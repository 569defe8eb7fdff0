"""Assemble a model from its spec: the family's build gets a :class:`Parts` factory."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..plugin.registry import Registry, get_registry
from .positions import accepts
from .roles import mark
from .specs import ComponentSpec, ModelSpec, parse_model_spec


class VariantWarning(UserWarning):
    """A combination that runs but misleads (e.g. BatchNorm in a causal model)."""


def tag(module: nn.Module, slot: str, kind: str) -> nn.Module:
    """Mark a module with the slot it fills; probes attribute parameters by these tags."""
    return mark(module, slot=slot, kind=kind)


def block_scope(spec: ComponentSpec) -> bool:
    """Whether a residual spec wraps a whole block (``scope = "block"``) rather than one
    sublayer (the default, and every residual written before scopes existed)."""
    return getattr(type(spec), "scope", "sublayer") == "block"


class Parts:
    """Builds each slot's component with explicit sizes; what a family's build receives."""

    def __init__(self, spec: ModelSpec, registry: Registry) -> None:
        self.spec = spec
        self.registry = registry
        self.positions: nn.Module | None = None  # the latest positional built

    def component(
        self,
        slot: str,
        spec: ComponentSpec | None = None,
        optional: Mapping[str, Any] | None = None,
        **sizes: Any,
    ) -> nn.Module:
        """Build ``slot``'s component with ``sizes``; each ``optional`` keyword is passed only
        to builds that accept it, so plugins written before it existed keep working."""
        spec = spec if spec is not None else getattr(self.spec, slot)
        comp = self.registry.get(slot, spec.kind, (slot, "kind"))
        extra = {k: v for k, v in (optional or {}).items() if accepts(comp.build, k)}
        return tag(comp.build(spec, **sizes, **extra), slot, spec.kind)

    def norm(self, dim: int | None = None) -> nn.Module:
        return self.component(
            "norm", dim=dim or self.spec.emb_dim, optional={"bias": self.spec.norm_bias}
        )

    def activation(self) -> nn.Module:
        return self.component("activation")

    def feedforward(self) -> nn.Module:
        return self.component(
            "feedforward", emb_dim=self.spec.emb_dim, make_activation=self.activation,
            optional={"bias": self.spec.ffn_bias},
        )

    def attention(self, causal: bool, positions: nn.Module | None = None) -> nn.Module:
        """The attention slot. Its build also gets, where its signature takes them,
        ``positions`` (default: the positional this Parts built last, i.e. the one of the
        stack being assembled), ``make_norm(dim, spec=None)`` and ``out_bias``."""
        s = self.spec
        optional = {
            "positions": positions if positions is not None else self.positions,
            "make_norm": self.make_norm,
            "out_bias": s.attn_out_bias,
        }
        return self.component(
            "attention", emb_dim=s.emb_dim, n_heads=s.n_heads, context_length=s.context_length,
            drop_rate=s.drop("attn"), qkv_bias=s.qkv_bias, causal=causal, optional=optional,
        )

    def make_norm(self, dim: int, spec: ComponentSpec | None = None) -> nn.Module:
        """A norm of width ``dim``: the model's norm slot, or the given norm spec."""
        return self.component("norm", spec=spec, dim=dim, optional={"bias": self.spec.norm_bias})

    def residual(
        self,
        sublayer: nn.Module,
        in_dim: int | None = None,
        out_dim: int | None = None,
        spec: ComponentSpec | None = None,
        make_norm: Callable[[int], nn.Module] | None = None,
    ) -> nn.Module:
        """The residual slot around one sublayer (a per-sublayer residual kind)."""
        chosen = spec if spec is not None else self.spec.residual
        if block_scope(chosen):
            raise ValueError(f"residual {chosen.kind!r} wraps a whole block (scope 'block'); "
                             "build it with Parts.block(attention, feedforward)")
        return self.component(
            "residual", spec=spec, sublayer=sublayer, make_norm=make_norm or self.norm,
            in_dim=in_dim or self.spec.emb_dim, out_dim=out_dim or self.spec.emb_dim,
            drop_rate=self.spec.drop("resid"), optional={"n_layers": self.spec.n_layers},
        )

    @property
    def block_residual(self) -> bool:
        """Whether the model's residual kind wraps a whole block (see :meth:`block`)."""
        return block_scope(self.spec.residual)

    def block(self, attention: nn.Module, feedforward: nn.Module) -> nn.Module:
        """A block-scope residual (``scope = "block"``) around attention and feed-forward."""
        return self.component(
            "residual", attention=attention, feedforward=feedforward, make_norm=self.norm,
            dim=self.spec.emb_dim, drop_rate=self.spec.drop("resid"),
            optional={"n_layers": self.spec.n_layers},
        )

    def layer(self, index: int) -> Parts:
        """The parts of layer ``index`` of a stack: these parts for a model without a layout
        or a layer of the model's own components; otherwise parts built from the layer's
        spec (:meth:`ModelSpec.layer_spec`). A layer kind with its own positional (a rotary
        base of its own) gets that positional for its attention; the others share the
        stack's."""
        spec = self.spec.layer_spec(index)
        if spec is self.spec:
            return self
        parts = Parts(spec, self.registry)
        parts.positions = self.positions
        if spec.positional != self.spec.positional:
            parts.positions = parts.component(
                "positional", emb_dim=spec.emb_dim, context_length=spec.context_length)
        return parts

    def positional(self) -> nn.Module:
        """The positional slot; self-attentions built after it share it (see
        :mod:`variantlab.model.positions`)."""
        s = self.spec
        self.positions = self.component(
            "positional", emb_dim=s.emb_dim, context_length=s.context_length)
        return self.positions


def resolve_spec(spec: ModelSpec | Mapping[str, Any], registry: Registry) -> ModelSpec:
    """The family's own spec class for ``spec`` (validating a mapping on the way)."""
    if isinstance(spec, ModelSpec):
        fam = registry.get("family", spec.family, ("family",))
        if isinstance(spec, fam.spec_cls):
            return spec
    return parse_model_spec(spec, registry)


def build_model(spec: ModelSpec | Mapping[str, Any], registry: Registry | None = None,
                ) -> nn.Module:
    """Build the model a spec (a ModelSpec or a mapping such as ``{"family": "gpt", ...}``)
    describes with the components of ``registry``; ``None`` means
    :func:`variantlab.get_registry` (built-ins plus installed plugins). Same seed before it,
    same parameters."""
    registry = get_registry() if registry is None else registry
    spec = resolve_spec(spec, registry)
    fam = registry.get("family", spec.family, ("family",))
    model = fam.build(spec, Parts(spec, registry))
    init = registry.get("init", spec.init.kind, ("init", "kind"))
    init.build(spec.init)(model)
    model.variantlab_spec = spec
    model.variantlab_warnings = spec.warnings()
    for message in model.variantlab_warnings:
        warnings.warn(message, VariantWarning, stacklevel=2)
    return model


def make_model(
    spec: ModelSpec, seed: int, registry: Registry, device: torch.device | None = None
) -> nn.Module:
    """``torch.manual_seed(seed)`` then ``build_model``: the seeds' initialisation."""
    torch.manual_seed(seed)
    model = build_model(spec, registry)
    return model.to(device) if device is not None else model
