"""A role for every axis of an experiment: compared, tuned or condition.

- **compared** (model keys, by default): the architecture variants the question is about;
- **tuned** (``measure.*`` by default, plus every model key listed under ``tune:``, e.g.
  DyT's ``norm.alpha0``): each compared variant is measured at its own best value, chosen
  on the headline metric's validation value (:mod:`variantlab.config.metrics`);
- **condition** (``data.*`` keys, the size keys ``emb_dim``/``n_layers``, and every key
  listed under ``conditions:``): the task or scale the comparison is made at. Variants are
  compared only within one condition; the report gives a verdict per condition and says
  whether it holds across them.

A tuned axis may be *extended* (``extend: true`` on the axis, ``{values: [...], extend:
true}``, or ``variantlab run --extend-edges``): while a compared variant's best value sits
at an edge, one more value beyond it is run, with the grid's own spacing
(:func:`next_value`), at most :data:`DEFAULT_EXTENSIONS` times per edge
(``extend: N`` for another number). docs/fair-comparisons.md says how.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

Role = Literal["compared", "tuned", "condition"]
COMPARED: Role = "compared"
TUNED: Role = "tuned"
CONDITION: Role = "condition"
#: model keys that set a model's size: a condition, never an architecture
SIZE_KEYS = ("emb_dim", "n_layers")
#: extensions per edge of an axis with ``extend: true`` (or under ``--extend-edges``)
DEFAULT_EXTENSIONS = 3
#: relative tolerance when deciding that a grid's ratios (log) or steps (linear) are equal
SPACING_TOL = 0.02


def default_role(axis: str) -> Role:
    """The role of ``axis`` without ``tune:`` or ``conditions:``."""
    if axis.startswith("measure."):
        return TUNED
    if axis.startswith("data.") or axis in SIZE_KEYS:
        return CONDITION
    return COMPARED


def axis_roles(axes: Iterable[str], tune: Sequence[str] = (),
               conditions: Sequence[str] = ()) -> dict[str, Role]:
    """Axis -> its role, in the order given (``conditions:`` wins over ``tune:``; a key
    listed in both is refused by :func:`role_problems`)."""
    out: dict[str, Role] = {}
    for axis in axes:
        out[axis] = CONDITION if axis in conditions else TUNED if axis in tune \
            else default_role(axis)
    return out


def spec_axes(grid: Mapping[str, Any], sets: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every axis of an experiment: its grid's, then the paths its named variants set."""
    return list(dict.fromkeys([*grid, *(p for s in sets for p in s)]))


def role_problems(axes: Sequence[str], tune: Sequence[str], conditions: Sequence[str]
                  ) -> list[tuple[tuple, str]]:
    """``(YAML location, message)`` for each ``tune:``/``conditions:`` entry that names no
    axis, is listed twice, or is in both lists."""
    out = []
    shown = ", ".join(axes) or "none"
    for key, listed in (("tune", tune), ("conditions", conditions)):
        for i, path in enumerate(listed):
            if path not in axes:
                out.append(((key, i), f"{path!r} is not an axis of this experiment (axes: "
                                      f"{shown}); list a path the grid or a variant's set: varies"))
            elif listed.index(path) != i:
                out.append(((key, i), f"{path!r} is listed twice"))
            elif key == "conditions" and path in tune:
                out.append(((key, i), f"{path!r} is listed under both tune: and conditions:; "
                                      "an axis has one role"))
            elif key == "tune" and path.startswith("data."):
                out.append(((key, i), f"{path!r} is a data key, a condition (the task the "
                                      "variants are compared on), never tuned"))
    return out


def numeric(values: Sequence[Any]) -> list[float] | None:
    """The values as floats, sorted (None when one is not a real number)."""
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float))
                         or not math.isfinite(v) for v in values):
        return None
    return sorted(float(v) for v in values)


def spacing(values: Sequence[Any]) -> tuple[str, float] | None:
    """``("log", ratio)`` when the sorted values are positive with equal ratios,
    ``("linear", step)`` when they have equal steps, None otherwise (or with fewer than
    two distinct values). Two positive values are a log grid."""
    vals = numeric(values)
    if vals is None or len(set(vals)) < 2 or len(set(vals)) != len(vals):
        return None
    if vals[0] > 0:
        ratios = [b / a for a, b in zip(vals, vals[1:])]
        if max(ratios) <= min(ratios) * (1 + SPACING_TOL):
            return "log", math.exp(sum(map(math.log, ratios)) / len(ratios))
    steps = [b - a for a, b in zip(vals, vals[1:])]
    if max(steps) - min(steps) <= SPACING_TOL * (vals[-1] - vals[0]):
        return "linear", sum(steps) / len(steps)
    return None


def next_value(values: Sequence[Any], grid: Sequence[Any], side: str) -> Any:
    """The value beyond the ``side`` (``low`` or ``high``) end of ``values`` (what one
    compared variant tried) with the spacing of ``grid`` (the axis as written): the end
    divided or multiplied by the grid's ratio (log), or minus or plus its step (linear);
    an integer axis stays integer. None when ``grid`` is on neither kind of grid."""
    kind = spacing(grid)
    vals = numeric(values)
    if kind is None or vals is None:
        return None
    how, by = kind
    end = vals[0] if side == "low" else vals[-1]
    if how == "log":
        new = end / by if side == "low" else end * by
    else:
        new = end - by if side == "low" else end + by
    if all(isinstance(v, int) for v in grid):
        new = round(new)
        if new == end:
            new = end - 1 if side == "low" else end + 1
        return int(new)
    return float(f"{new:.6g}")  # 0.030000000000000002 -> 0.03, as a person writes it


def role_lines(roles: Mapping[str, str], extend: Mapping[str, int] | None = None
               ) -> list[str]:
    """One line per axis, ``axis: role`` (``, extended up to N per edge`` for an axis
    that is), for ``validate`` and the report."""
    extend = extend or {}
    return [f"{axis}: {role}" + (f", extended up to {extend[axis]} per edge"
                                 if axis in extend else "")
            for axis, role in roles.items()]


def stored_roles(meta: Any, overrides: Iterable[Mapping[str, Any]]) -> dict[str, Role]:
    """A stored run's roles: what it stored (``meta.roles``), else the default role of
    every path its variants override (a store written before roles)."""
    roles = dict(getattr(meta, "roles", None) or {})
    axes = spec_axes(getattr(meta, "grid", None) or {}, overrides)
    return {a: roles.get(a) or default_role(a) for a in axes}  # type: ignore[misc]


__all__ = ["COMPARED", "CONDITION", "DEFAULT_EXTENSIONS", "SIZE_KEYS", "TUNED", "Role",
           "axis_roles", "default_role", "next_value", "numeric", "role_lines", "role_problems",
           "spacing", "spec_axes", "stored_roles"]
