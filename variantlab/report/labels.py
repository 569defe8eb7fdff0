"""Variant labels a person can read: every compared axis's value, defaults included.

A grid variant's stored name lists only the values that differ from the base model
(``measure.training.lr=0.01`` for attention at its default kind), which hides what it is.
The report labels each variant of a run's grid by the value of every axis with more than
one value, in grid order, each axis by its shortest unambiguous name
(``attention=mha, lr=0.01``; :func:`short_axes`) and each value by its name on a named axis,
else a short automatic label (:mod:`variantlab.config.named`; never JSON). Named variants
(``variants:``) keep their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..config.named import axis_labels, key_of, named_axes, value_names
from ..config.roles import axis_mappings
from ..store.contract import RunMeta


def run_grid(meta: RunMeta) -> dict[str, list[Any]]:
    """A stored run's ``grid:``: from its meta (``grid``), else (a store older than the grid
    in the meta) from its stored YAML."""
    grid: Any = meta.grid
    if grid is None:
        grid = axis_mappings(named_axes(_yaml_of(meta))).get("grid")
    if not isinstance(grid, Mapping):
        return {}
    return {str(k): list(v) for k, v in grid.items() if isinstance(v, list) and v}


def _yaml_of(meta: RunMeta) -> Any:
    try:
        doc = yaml.safe_load(meta.yaml or "") or {}
    except yaml.YAMLError:
        doc = {}
    return doc if isinstance(doc, Mapping) else {}


def _words(axis: str) -> list[str]:
    parts = axis.split(".")
    if parts[0] == "measure" and len(parts) == 3:  # measure.training.lr -> lr
        parts = parts[2:]
    elif parts[0] == "data" and len(parts) > 1:  # data.n_pairs -> n_pairs
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] == "kind":  # attention.kind -> attention
        parts = parts[:-1]
    return parts


def short_axes(axes: Sequence[str]) -> dict[str, str]:
    """Axis -> its shortest name among ``axes``: the last words of its path (``measure.``
    and ``data.`` prefixes and a final ``.kind`` left out), as many as keep it apart from the
    others'."""
    words = {a: _words(a) for a in axes}
    take = {a: 1 for a in axes}
    while True:
        names = {a: ".".join(w[-take[a]:]) for a, w in words.items()}
        clash = [a for a in axes if list(names.values()).count(names[a]) > 1]
        grow = [a for a in clash if take[a] < len(words[a])]
        if not grow:
            break
        for a in grow:
            take[a] += 1
    return {a: (axis if names[a] in [names[b] for b in axes if b != a] else names[a])
            for a, axis in zip(axes, axes)}


@dataclass
class GridLabels:
    """A run's grid with a label for every axis and value."""

    axes: dict[str, list[Any]]
    values: dict[str, dict[str, str]] = field(default_factory=dict)  # axis -> key -> label
    short: dict[str, str] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)  # the axes whose values have names

    @classmethod
    def of(cls, meta: RunMeta) -> GridLabels:
        axes = run_grid(meta)
        names = value_names(_yaml_of(meta))
        labels = {a: dict(zip(map(key_of, vals), axis_labels(vals, names.get(a))))
                  for a, vals in axes.items()}
        return cls(axes, labels, short_axes(list(axes)), set(names))

    def value(self, axis: str, value: Any) -> str:
        """A value's label on ``axis`` (one the grid does not list: its short text)."""
        known = self.values.get(axis, {}).get(key_of(value))
        return known if known is not None else axis_labels([value])[0]

    def labels_value(self, axis: str, value: Any) -> bool:
        """Whether ``value`` is shown by a label rather than as written: a value of a named
        axis (its name), a dict or list value (its short label)."""
        return axis in self.named or isinstance(value, (Mapping, list))

    def text(self, axis: str, value: Any) -> str:
        """A value in a list of an axis's values: its label where :meth:`labels_value`,
        else as written (``1.0``, not rounded)."""
        return self.value(axis, value) if self.labels_value(axis, value) else value_text(value)

    def labelled(self) -> list[str]:
        """The axes a label names: those with more than one value."""
        return [a for a, vals in self.axes.items() if len(vals) > 1]

    def label(self, overrides: Mapping[str, Any], axes: Sequence[str] | None = None) -> str:
        """``attention=mha, lr=0.01``: the value of each of ``axes`` (default
        :meth:`labelled`) in ``overrides``."""
        axes = self.labelled() if axes is None else axes
        return ", ".join(f"{self.short[a]}={self.value(a, overrides[a])}" for a in axes
                         if a in overrides)

    def is_beyond(self, overrides: Any) -> bool:
        """Whether ``overrides`` sets every grid axis, all but one to a value the grid lists
        (an edge extension's variant: the grid's variant with one value moved beyond it)."""
        if not (isinstance(overrides, Mapping) and self.axes
                and set(overrides) == set(self.axes)):
            return False
        off = [a for a in self.axes if key_of(overrides[a]) not in self.values[a]]
        return len(off) == 1

    def is_cell(self, overrides: Any) -> bool:
        """Whether ``overrides`` is one combination of the grid's values."""
        return (isinstance(overrides, Mapping) and bool(self.axes)
                and set(overrides) == set(self.axes)
                and all(key_of(overrides[a]) in self.values[a] for a in self.axes))


def display_names(meta: RunMeta, stored: Sequence[str], overrides: Sequence[Any]) -> list[str]:
    """The display name of each of a run's variants: a grid variant's :meth:`GridLabels.label`
    (the grid's variants come first, one per combination; a variant edge extension added
    sets every grid axis too, one of them to a value beyond the grid), else its stored
    name; stored names wherever two labels would be the same."""
    grid = GridLabels.of(meta)
    n_cells = 1
    for vals in grid.axes.values():
        n_cells *= len(vals)
    out = []
    for i, (name, over) in enumerate(zip(stored, overrides)):
        label = grid.label(over) if ((i < n_cells and grid.is_cell(over))
                                     or (i >= n_cells and grid.is_beyond(over))) else ""
        out.append(label or name)
    if len(set(out)) < len(out):
        return list(stored)
    return out


def value_text(value: Any) -> str:
    """A value as text outside any grid (``true``, ``0.1``, ``sdpa``; dicts and lists
    short, never JSON)."""
    if isinstance(value, (list, dict)):
        return axis_labels([value])[0]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


__all__ = ["GridLabels", "display_names", "run_grid", "short_axes", "value_text"]
