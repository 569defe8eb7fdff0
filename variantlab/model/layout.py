"""Per-layer layouts: which components each layer of a stack uses.

A model spec's ``layout`` names layer kinds (each a set of slot overrides of the model's own
components), a ``pattern`` of kind names that repeats over the layers, and explicit
``layers`` (index -> kind name) that win over the pattern::

    layout:
      kinds:
        local:  {attention: {kind: mha, window: 512}, positional: {kind: rotary, base: 10000}}
        global: {}                       # the model's own components
      pattern: [local, local, local, local, local, global]   # Gemma 3's 5:1
      layers: {0: global}                # this layer, whatever the pattern says

A layer no kind covers (no pattern, no ``layers`` entry) uses the model's components. The
uniform model has no layout at all (``layout: null``), so its spec data, unit keys and numbers
are those of a model written before layouts existed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator

from ..errors import SpecIssue

#: the slots a layer kind may override; ``init`` and ``family`` are the model's alone
LAYER_SLOTS = ("norm", "activation", "feedforward", "attention", "residual", "positional")


class LayoutSpec(BaseModel):
    """Named layer kinds, a repeating pattern of them, and explicit per-layer choices."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kinds: dict[str, dict[str, SerializeAsAny[Any]]] = Field(
        default_factory=dict, description="layer kind name -> {slot: component} overrides of "
        f"the model's components (slots: {', '.join(LAYER_SLOTS)}); {{}}: the model's own")
    pattern: list[str] | None = Field(
        None, min_length=1, description="kind names repeated over the layers from layer 0 "
        "(at most n_layers long; n_layers need not be a multiple of its length)")
    layers: dict[int, str] = Field(
        default_factory=dict, description="layer index -> kind name; wins over the pattern")

    @field_validator("layers", mode="before")
    @classmethod
    def _index_keys(cls, value: Any) -> Any:
        """Indices written as strings (JSON has no integer keys) become ints."""
        if isinstance(value, Mapping):
            return {int(k) if isinstance(k, str) and k.isdigit() else k: v
                    for k, v in value.items()}
        return value

    def kind_at(self, index: int) -> str | None:
        """The kind name of layer ``index`` (None: the model's own components)."""
        if index in self.layers:
            return self.layers[index]
        if self.pattern:
            return self.pattern[index % len(self.pattern)]
        return None

    def overrides(self, kind: str | None) -> dict[str, Any]:
        """Slot -> component spec of layer kind ``kind`` (empty for None)."""
        return dict(self.kinds.get(kind, {})) if kind is not None else {}

    def problems(self, n_layers: int) -> list[SpecIssue]:
        """Names that are not kinds, a pattern longer than the stack, indices outside it."""
        issues = []
        known = list(self.kinds)

        def unknown(loc: tuple, name: str) -> SpecIssue:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            return SpecIssue(loc, f"{name!r} is not a layer kind; {hint}kinds: "
                                  f"{', '.join(known) or 'none (define them under layout.kinds)'}")

        for i, name in enumerate(self.pattern or []):
            if name not in self.kinds:
                issues.append(unknown(("layout", "pattern", i), name))
        if self.pattern and len(self.pattern) > n_layers:
            issues.append(SpecIssue(("layout", "pattern"), (
                f"the pattern has {len(self.pattern)} entries but the model has n_layers="
                f"{n_layers}; shorten the pattern or add layers")))
        for index, name in self.layers.items():
            if not 0 <= index < n_layers:
                issues.append(SpecIssue(("layout", "layers", index), (
                    f"layer {index} is outside the stack (0 .. {n_layers - 1})")))
            elif name not in self.kinds:
                issues.append(unknown(("layout", "layers", index), name))
        return issues


def layer_rows(spec: Any) -> list[dict[str, Any]]:
    """One row per layer of a model spec with a layout: its index, kind name (``-`` for the
    model's own components) and each layer slot's component kind; none without a layout."""
    if spec.layout is None:
        return []
    rows = []
    for index in range(spec.n_layers):
        kind = spec.layout.kind_at(index)
        layer = spec.layer_spec(index)
        rows.append({"layer": index, "kind": kind or "-",
                     **{slot: getattr(layer, slot).kind for slot in LAYER_SLOTS}})
    return rows
