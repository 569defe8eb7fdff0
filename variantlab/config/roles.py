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
#: the most extensions per edge ``extend: N`` may ask for
MAX_EXTENSIONS = 20
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


def role_checks(spec: Any, doc: Any) -> list[tuple[tuple, str, str]]:
    """``(YAML location, message, at)`` for an experiment's ``tune:``/``conditions:``
    entries that name no axis (:func:`role_problems`) and each ``extend`` on an axis that is
    not a tuned grid axis on a log or linear grid."""
    axes = spec_axes(spec.grid, [v.set for v in spec.variants])
    out = [(loc, msg, "auto") for loc, msg in role_problems(axes, spec.tune, spec.conditions)]
    roles = axis_roles(axes, spec.tune, spec.conditions)
    for axis, given in (doc.get(("grid",)) or {}).items():
        n = given.get("extend", False) if isinstance(given, Mapping) else False
        if not (isinstance(n, bool) or _count(n)):
            out.append((("grid", axis, "extend"), f"extend is true, false or a whole number "
                        f"of extensions per edge (1 to {MAX_EXTENSIONS}), got {n!r}", "auto"))
    for axis in spec.extend:
        loc: tuple = ("grid", axis, "extend")
        if doc.get(loc) is None:
            loc = ("extend", axis)
        if axis not in spec.grid:
            msg = f"{axis!r} is not a grid axis; only a grid axis can be extended"
        elif roles[axis] != TUNED:
            msg = (f"{axis!r} is a {roles[axis]} axis; only a tuned axis is extended "
                   "(measure.* paths, or list it under tune:)")
        elif spacing(spec.grid[axis]) is None:
            msg = (f"{axis!r} has values {spec.grid[axis]}, on neither a log grid (equal "
                   "ratios), the half-decade ladder (1, 3, 10, 30, ...) nor a linear one "
                   "(equal steps), so there is no spacing to extend it by; space the values "
                   "evenly")
        else:
            continue
        out.append((loc, msg, "key"))
    return out


def numeric(values: Sequence[Any]) -> list[float] | None:
    """The values as floats, sorted (None when one is not a real number)."""
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float))
                         or not math.isfinite(v) for v in values):
        return None
    return sorted(float(v) for v in values)


def _mantissa(x: float) -> float:
    return x / 10 ** math.floor(math.log10(x) + 1e-9)


def _half_decades(vals: Sequence[float]) -> bool:
    """Whether sorted positive ``vals`` are consecutive steps of the ladder 1, 3, 10, 30, ...
    (times a power of ten): the usual learning-rate grid ``[1e-3, 3e-3, 1e-2, ...]``, whose
    ratios alternate 3 and 10/3."""
    if len(vals) < 3 or vals[0] <= 0:  # two values are a plain log grid
        return False
    marks = [_mantissa(v) for v in vals]
    if not all(math.isclose(m, 1) or math.isclose(m, 3) for m in marks):
        return False
    return all(math.isclose(b / a, 3 if math.isclose(m, 1) else 10 / 3)
               for a, b, m in zip(vals, vals[1:], marks))


def spacing(values: Sequence[Any]) -> tuple[str, float] | None:
    """``("half-decade", sqrt 10)`` when the sorted values step through 1, 3, 10, 30, ...
    (times a power of ten), ``("log", ratio)`` when they are positive with equal ratios,
    ``("linear", step)`` when they have equal steps, None otherwise (or with fewer than
    two distinct values). Two positive values are a log grid."""
    vals = numeric(values)
    if vals is None or len(set(vals)) < 2 or len(set(vals)) != len(vals):
        return None
    if _half_decades(vals):
        return "half-decade", math.sqrt(10)
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
    if how == "half-decade":  # the next rung: 3e-2 -> 1e-1, 1e-3 -> 3e-4
        one = math.isclose(_mantissa(end), 1)
        new = end * (3 if one else 10 / 3) if side == "high" else end / (10 / 3 if one else 3)
    elif how == "log":
        new = end / by if side == "low" else end * by
    else:
        new = end - by if side == "low" else end + by
    if all(isinstance(v, int) for v in grid):
        new = round(new)
        if new == end:
            new = end - 1 if side == "low" else end + 1
        return int(new)
    return float(f"{new:.6g}")  # 0.030000000000000002 -> 0.03, as a person writes it


def axis_mappings(data: Any) -> Any:
    """An experiment mapping with each grid axis written ``{values: [...], extend: true |
    N}`` replaced by its values, its extensions (true: :data:`DEFAULT_EXTENSIONS`) under
    ``extend``; anything else as given (the schema reports what is wrong)."""
    grid = data.get("grid") if isinstance(data, Mapping) else None
    if not isinstance(grid, Mapping):
        return data
    plain, extend = {}, dict(data.get("extend") or {})
    for axis, given in grid.items():
        if isinstance(given, Mapping) and "values" in given and set(given) <= {"values", "extend"}:
            plain[axis] = given["values"]
            n = given.get("extend", False)
            if n is True or _count(n):  # anything else is reported by role_checks
                extend[axis] = DEFAULT_EXTENSIONS if n is True else n
        else:
            plain[axis] = given
    return {**data, "grid": plain, **({"extend": extend} if extend else {})}


def _count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_EXTENSIONS


def extensions(extend: Mapping[str, int], roles: Mapping[str, str],
               grid: Mapping[str, Sequence[Any]], edges: bool = False) -> dict[str, int]:
    """Tuned axis -> extensions per edge: ``extend``, and with ``edges`` (``--extend-edges``)
    :data:`DEFAULT_EXTENSIONS` for every other tuned grid axis on a log or linear grid."""
    out = dict(extend)
    if edges:
        for axis, role in roles.items():
            if role == TUNED and axis in grid and spacing(grid[axis]):
                out.setdefault(axis, DEFAULT_EXTENSIONS)
    return out


def role_lines(roles: Mapping[str, str], extend: Mapping[str, int] | None = None,
               partial: Mapping[str, int] | None = None) -> list[str]:
    """One line per axis, ``axis: role`` (``, extended up to N per edge`` for an axis
    that is; ``, left out of N grid combinations ...`` for a tuned axis that some compared
    variants do not have), for ``validate`` and the report."""
    extend, partial = extend or {}, partial or {}
    return [f"{axis}: {role}" + (f", extended up to {extend[axis]} per edge"
                                 if axis in extend else "")
            + (f", left out of {partial[axis]} grid combinations whose model has no such "
               "field (they run once)" if partial.get(axis) else "")
            for axis, role in roles.items()]


def stored_roles(meta: Any, overrides: Iterable[Mapping[str, Any]]) -> dict[str, Role]:
    """A stored run's roles: what it stored (``meta.roles``), else the default role of
    every path its variants override (a store written before roles)."""
    roles = dict(getattr(meta, "roles", None) or {})
    axes = spec_axes(getattr(meta, "grid", None) or {}, overrides)
    return {a: roles.get(a) or default_role(a) for a in axes}  # type: ignore[misc]


__all__ = ["COMPARED", "CONDITION", "DEFAULT_EXTENSIONS", "MAX_EXTENSIONS", "SIZE_KEYS", "TUNED", "Role",
           "axis_mappings", "axis_roles", "default_role", "extensions", "next_value", "numeric",
           "role_checks", "role_lines", "role_problems", "spacing", "spec_axes", "stored_roles"]
