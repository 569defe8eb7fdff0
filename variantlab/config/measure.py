"""The experiment's ``measure:`` mapping (which probes run, with their validated settings)
and ``resources:`` (what each probe's units ask of an executor)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, PositiveFloat

from ..plugin.settings import Strict

if TYPE_CHECKING:
    from ..plugin.registry import Registry


class ProbeResources(Strict):
    """What each unit of a probe asks of an executor that places units on machines
    (``--executor ray``); the in-process and pool executors ignore it. Not part of unit
    keys: it decides where a number is computed, never the number."""

    num_cpus: PositiveFloat = Field(
        1.0, description="CPUs each unit reserves; its torch threads (at least 1)")
    num_gpus: Annotated[float, Field(ge=0)] | None = Field(
        None, description="GPUs each unit reserves (default: 1 when the unit's device is "
                          "cuda, else 0)")


def _registered(registry: Registry | None) -> Registry:
    """``registry``, checked given (the caller refused mappings without one)."""
    assert registry is not None
    return registry


class MeasureSpec:
    """Which probes run, in the order the experiment file names them: probe name ->
    its validated settings (the experiment loader validates ``measure:`` against the
    registry's probes)."""

    def __init__(self, settings: Mapping[str, Any] | None = None, /, *, registry: Registry | None = None,
                 **probes: Any) -> None:
        """``settings`` or keywords: probe name -> settings object, mapping or None (the
        probe does not run); mappings are validated by the probe registered in ``registry``
        (required then)."""
        given = {**(settings or {}), **probes}
        if any(not isinstance(v, Strict | None) for v in given.values()) and registry is None:
            raise TypeError("MeasureSpec: pass registry= to validate probe settings given as "
                            "mappings (or pass the probes' settings objects)")
        self._settings: dict[str, Strict] = {
            n: v if isinstance(v, Strict) else _registered(registry).probe(n).settings(v)
            for n, v in given.items() if v is not None}

    def probes(self) -> dict[str, Strict]:
        """Probe name -> its settings, for the probes that run."""
        return dict(self._settings)

    def __getitem__(self, name: str) -> Strict:
        return self._settings[name]

    def __contains__(self, name: object) -> bool:
        return name in self._settings

    def get(self, name: str) -> Strict | None:
        """The settings of probe ``name``, or None when it does not run."""
        return self._settings.get(name)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {n: s.model_dump(mode=mode) for n, s in self._settings.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeasureSpec) and self.model_dump() == other.model_dump()

    def __hash__(self) -> int:  # immutable after construction, like the settings it holds
        return hash(tuple(self._settings.items()))

    def __repr__(self) -> str:
        return f"MeasureSpec({self._settings!r})"
