"""Conformance kit for plugin authors: ``check_component(slot, spec, plugins=[...])``.

It builds the component on its own with small explicit sizes, then inside a tiny model of
every family it fits, and runs the same battery on each: output shape, finite values, a
gradient for every parameter, train/eval, determinism under a seed, ``state_dict``
round-trip, float64 and device moves, plus the slot's own contract (causality, cross-
attention, padding masks, elementwise activations, argument pass-through in residuals).
Every broken point is collected; one :class:`AssertionError` lists them all.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..model.build import VariantWarning
from ..model.specs import ComponentSpec, resolve_component
from ..plugin.registry import SLOTS, Registry, build_registry
from .cases import standalone_case
from .checker import TINY_MODEL, Checker
from .families import family_problems, round_trip

__all__ = ["TINY_MODEL", "check_component", "component_problems"]


def component_problems(
    slot: str,
    spec: Mapping[str, Any] | ComponentSpec | str,
    plugins: Sequence[str] = (),
    *,
    families: Sequence[str] | None = None,
    registry: Registry | None = None,
) -> list[str]:
    """Every broken point of the component, as messages (empty when it conforms)."""
    registry = registry or build_registry(extra=plugins)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VariantWarning)
        if slot == "family":
            data = dict(spec if isinstance(spec, Mapping) else {"family": spec})
            registry.get("family", data.get("family", "gpt"), ("family",))
            return family_problems("family", data, registry, families)
        if slot not in SLOTS:
            raise ValueError(f"unknown slot {slot!r}; choose one of {', '.join(SLOTS)}, family")
        comp_spec = resolve_component(slot, spec, registry, (slot,))  # SpecError: bad spec
        problems = round_trip(comp_spec.model_dump(mode="json"),
                               lambda d: resolve_component(slot, d, registry), comp_spec,
                               f"{slot} spec")
        problems += Checker(standalone_case(slot, comp_spec, registry)).run()
        problems += family_problems(slot, comp_spec, registry, families)
    return problems


def check_component(
    slot: str,
    spec: Mapping[str, Any] | ComponentSpec | str,
    plugins: Sequence[str] = (),
    *,
    families: Sequence[str] | None = None,
    registry: Registry | None = None,
) -> None:
    """Check a component against its slot's contract; raise AssertionError listing every
    broken point. ``plugins`` are module names or ``.py`` paths loaded on top of the
    built-ins and installed entry points; ``families`` limits (and requires) the families
    tried, default every registered family that has the slot. ``slot="family"`` checks a
    model family: ``spec`` is then a model mapping such as ``{"family": "gpt"}``."""
    problems = component_problems(slot, spec, plugins, families=families, registry=registry)
    if problems:
        kind = spec.get("kind", spec.get("family")) if isinstance(spec, Mapping) else getattr(
            spec, "kind", spec)
        listing = "\n".join(f"  - {p}" for p in problems)
        raise AssertionError(f"{slot} {kind!r} breaks {len(problems)} point(s) of its contract:\n"
                             f"{listing}")
