"""Named axis values: a grid axis written as a mapping from a name to its value.

    grid:
      feedforward:
        dense: {kind: glu}
        moe: {kind: moe, n_experts: 8, top_k: 2}

is the axis ``feedforward: [{kind: glu}, {kind: moe, n_experts: 8, top_k: 2}]`` whose values
are called ``dense`` and ``moe`` in variant names, reports, CSV files and plots. A mapping
with a key ``values`` or ``extend`` is the extended-axis form instead
(:func:`variantlab.config.roles.axis_mappings`), so those two words do not name values.
Unnamed dict or list values get short automatic labels (:func:`auto_labels`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

#: the keys of the extended-axis form ``{values: [...], extend: ...}``
EXTENDED = frozenset({"values", "extend"})
LABEL_DIGITS = 3  # significant digits of a number in an automatic label


def is_named(given: Any) -> bool:
    """Whether a grid axis is written as ``{name: value, ...}``."""
    return isinstance(given, Mapping) and bool(given) and not set(given) & EXTENDED


def named_axes(data: Any) -> Any:
    """An experiment mapping with each named grid axis replaced by its values, in order;
    anything else as given."""
    grid = data.get("grid") if isinstance(data, Mapping) else None
    if not isinstance(grid, Mapping) or not any(map(is_named, grid.values())):
        return data
    plain = {axis: list(given.values()) if is_named(given) else given
             for axis, given in grid.items()}
    return {**data, "grid": plain}


def key_of(value: Any) -> str:
    """A value as comparable text (equal values, equal text)."""
    return json.dumps(value, sort_keys=True, default=str)


def value_names(raw: Any) -> dict[str, dict[str, str]]:
    """Axis -> {:func:`key_of` value -> its name} of the named axes of a raw experiment
    mapping (its YAML as read)."""
    grid = raw.get("grid") if isinstance(raw, Mapping) else None
    if not isinstance(grid, Mapping):
        return {}
    return {str(axis): {key_of(v): str(name) for name, v in given.items()}
            for axis, given in grid.items() if is_named(given)}


def _number(x: float) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{LABEL_DIGITS}g}" if math.isfinite(x) else str(x)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, int, float)):
        return _number(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_scalar(v) for v in value) + "]"
    return str(value)


def auto_labels(values: Sequence[Any]) -> list[str]:
    """Short labels of an axis's values: a plain value as itself (numbers to
    LABEL_DIGITS significant digits); dict values by the keys that differ between them
    only (``kind=moe n_experts=8``; just the value when the one differing key is ``kind``),
    never as JSON. Labels that would clash fall back to every key."""
    if not any(isinstance(v, Mapping) for v in values):
        labels = [_scalar(v) for v in values]
        return labels if len(set(labels)) == len(labels) else [key_of(v) for v in values]
    flats = [_flat(v) if isinstance(v, Mapping) else {"": v} for v in values]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    differ = [k for k in keys if len({key_of(f.get(k, "—")) for f in flats}) > 1]
    for shown in (differ or keys, keys):  # one value alone: every key
        labels = []
        for f in flats:
            if shown == ["kind"] or shown == [""]:
                labels.append(_scalar(f.get(shown[0], "—")))
            else:
                labels.append(" ".join(f"{k}={_scalar(f[k])}" if k else _scalar(f[k])
                                       for k in shown if k in f) or "default")
        if len(set(labels)) == len(labels):
            return labels
    return [key_of(v) for v in values]


def axis_labels(values: Sequence[Any], names: Mapping[str, str] | None = None) -> list[str]:
    """Each value's label: its name where the axis names it, else :func:`auto_labels`."""
    auto = auto_labels(values)
    names = names or {}
    return [names.get(key_of(v), a) for v, a in zip(values, auto)]


__all__ = ["auto_labels", "axis_labels", "is_named", "key_of", "named_axes", "value_names"]
