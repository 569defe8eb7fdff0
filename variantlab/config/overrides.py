"""Dotted-path overrides of a model mapping (``norm.kind``, ``n_layers``): the paths a model
has, applying a variant's overrides, labelling values, and where each override came from in
the experiment YAML (grid axes and named variants)."""

from __future__ import annotations

import copy
import difflib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import SpecError
from ..model.specs import DEFAULT_COMPONENTS
from ..plugin.registry import SLOTS, Registry


def component_of(model: Mapping[str, Any], slot: str) -> dict[str, Any]:
    """The slot's component as a mapping, with the default when the model omits it."""
    value = model.get(slot, DEFAULT_COMPONENTS[slot])
    if isinstance(value, str):
        return {"kind": value}
    return dict(value) if isinstance(value, Mapping) else {}


def valid_paths(model: Mapping[str, Any], registry: Registry) -> list[str] | None:
    """Every dotted path an override may name for this model (None: unknown family)."""
    try:
        fam = registry.get("family", model.get("family", "gpt"))
    except SpecError:
        return None
    paths = []
    for name in fam.spec_cls.model_fields:
        paths.append(name)
        if name in SLOTS:
            kind = component_of(model, name).get("kind")
            try:
                fields = list(registry.get(name, str(kind)).spec_cls.model_fields)
            except SpecError:
                fields = ["kind"]
            paths += [f"{name}.{f}" for f in fields]
    return paths


def apply_overrides(
    base: Mapping[str, Any], overrides: Mapping[str, Any], registry: Registry
) -> tuple[dict[str, Any], dict[str, str]]:
    """The model mapping of a variant, and a message for each path that names no field.

    Setting ``slot.kind`` to a new kind replaces the component with ``{kind: NEW}`` plus the
    variant's other ``slot.*`` overrides (the old kind's parameters do not carry over).
    """
    bad: dict[str, str] = unknown_kinds(base, overrides)
    model = copy.deepcopy(dict(base))
    for path, value in overrides.items():  # whole-field overrides first: family, sizes
        if "." not in path:
            model[path] = copy.deepcopy(value)
    for path, value in overrides.items():  # then into the layout: its pattern, a kind's slot
        if path.startswith("layout."):
            set_path(model, path, copy.deepcopy(value))
    for slot in SLOTS:
        sub = {p.split(".", 1)[1]: v for p, v in overrides.items() if p.startswith(slot + ".")}
        if not sub:
            continue
        comp = component_of(model, slot)
        if "kind" in sub and sub["kind"] != comp.get("kind"):
            comp = {"kind": sub["kind"]}
        comp.update(copy.deepcopy(sub))
        model[slot] = comp
    paths = valid_paths(model, registry)
    if paths is not None:
        paths += [f"layout.{key}" for key in LAYOUT_KEYS]
        for path in overrides:
            if path in bad or path.split(".")[:2] in [["layout", key] for key in LAYOUT_KEYS]:
                continue  # deeper layout paths: the spec's validation names what is wrong
            if path not in paths:
                close = difflib.get_close_matches(path, paths, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else "check the spelling."
                head = path.split(".", 1)[0]
                if head in SLOTS and path.count(".") == 1:
                    kind = component_of(model, head).get("kind")
                    fields = [p for p in paths if p.startswith(head + ".")]
                    hint += f" {head} {kind!r} has: {', '.join(fields)}"
                bad[path] = f"{path!r} names no field of the model; {hint}"
    return model, bad


LAYOUT_KEYS = ("kinds", "pattern", "layers")


def unknown_kinds(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, str]:
    """A message for each ``layout.kinds.NAME.SLOT...`` path whose NAME is no layer kind of
    the model (a misspelt kind would otherwise add an unused kind: a variant equal to the
    base) and that no other path of the variant defines."""
    layout = base.get("layout")
    kinds = layout.get("kinds") if isinstance(layout, Mapping) else None
    known = list(kinds) if isinstance(kinds, Mapping) else []
    out = {}
    for path in overrides:
        parts = path.split(".")
        if parts[:2] != ["layout", "kinds"] or len(parts) < 4 or parts[2] in known:
            continue
        if "layout" in overrides or "layout.kinds" in overrides \
                or f"layout.kinds.{parts[2]}" in overrides:
            continue
        close = difflib.get_close_matches(parts[2], known, n=1, cutoff=0.5)
        hint = f"did you mean {'.'.join(parts[:2] + close + parts[3:])!r}? " if close else ""
        where = (f"kinds: {', '.join(known)}" if known
                 else "the model has no layout.kinds; define the kind under model.layout")
        out[path] = f"{path!r} names no layer kind: {parts[2]!r} is not one; {hint}{where}"
    return out


def set_path(model: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted ``path`` in nested mappings, creating them on the way; a component
    written as its kind name (``attention: mha``) becomes ``{kind: mha}`` to take a key."""
    node = model
    parts = path.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str):
            child = {"kind": child}
        node[part] = child = dict(child) if isinstance(child, Mapping) else {}
        node = child
    node[parts[-1]] = value


def lookup(model: Mapping[str, Any], path: str) -> Any:
    node: Any = model
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), default=str)


def expansions(
    grid: Mapping[str, Sequence[Any]], sets: Sequence[Mapping[str, Any]]
) -> list[tuple[int | None, dict[str, Any], dict[str, tuple]]]:
    """(index in ``variants:`` or None for grid combos, overrides, path -> YAML key path of
    its value), in variant order: grid combos (or the base alone), then named variants
    (``sets``: the ``set:`` mapping of each entry of ``variants:``)."""
    out: list[tuple[int | None, dict[str, Any], dict[str, tuple]]] = []
    axes = list(grid.items())
    for combo in itertools.product(*(range(len(vals)) for _, vals in axes)):
        overrides = {path: vals[i] for (path, vals), i in zip(axes, combo)}
        where = {path: ("grid", path, i) for (path, _), i in zip(axes, combo)}
        out.append((None, overrides, where))
    for n, named in enumerate(sets):
        out.append((n, dict(named), {p: ("variants", n, "set", p) for p in named}))
    return out


def override_source(loc: tuple, where: Mapping[str, tuple]) -> tuple | None:
    """The YAML key path of the override that an issue at model ``loc`` comes from (a layer
    index in ``loc`` matches its digits in the path: ``layout.layers.5``)."""
    loc = tuple(str(part) for part in loc)
    for path, yaml_loc in where.items():
        parts = tuple(path.split("."))
        if loc[: len(parts)] == parts:
            return yaml_loc
    for path, yaml_loc in where.items():
        parts = tuple(path.split("."))
        if loc and parts[: len(loc)] == loc:
            return yaml_loc
    return None



#: the start of a message :func:`apply_overrides` gives for a path the model lacks
NO_FIELD = "names no field of the model"


def fit_tuned(combos: Sequence[tuple[int | None, dict[str, Any], dict[str, tuple]]],
              tuned: Sequence[str], base: Mapping[str, Any], registry: Registry,
              ) -> tuple[list[tuple[int | None, dict[str, Any], dict[str, tuple]]],
                         dict[str, int]]:
    """``combos`` (:func:`expansions`) with each tuned model axis (``tune:``) left out of the
    grid combinations whose model has no such field, when some other combination has it:
    DyT's ``norm.alpha0`` beside LayerNorm runs LayerNorm once, not once per alpha0.
    Combinations that become equal are kept once. Also returns, per axis left out, how
    many combinations lost it. An axis no combination has is kept (its error stands)."""
    model_tuned = [p for p in tuned if not p.startswith(("measure.", "data."))]
    if not model_tuned:
        return list(combos), {}
    lacking: list[set[str]] = []
    for named, overrides, _ in combos:
        mine = [p for p in model_tuned if p in overrides and named is None]
        if not mine:
            lacking.append(set())
            continue
        model = {p: v for p, v in overrides.items()
                 if not p.startswith(("measure.", "data."))}
        _, bad = apply_overrides(base, model, registry)
        lacking.append({p for p in mine if NO_FIELD in bad.get(p, "")})
    somewhere = {p for p in model_tuned
                 if any(p in o and p not in miss and n is None
                        for (n, o, _), miss in zip(combos, lacking))}
    out, seen, dropped = [], set(), dict.fromkeys(model_tuned, 0)
    for (named, overrides, where), miss in zip(combos, lacking):
        drop = miss & somewhere
        if drop:
            overrides = {p: v for p, v in overrides.items() if p not in drop}
            where = {p: w for p, w in where.items() if p not in drop}
            for p in drop:
                dropped[p] += 1
            key = json.dumps(overrides, sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
        out.append((named, overrides, where))
    return out, {p: n for p, n in dropped.items() if n}
