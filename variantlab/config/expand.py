"""An experiment's variants: its grid and named variants expanded into validated models.

Every combination of the grid's values (and each named variant's ``set:``) is applied to
the base model; each problem is a located message gathered by a :class:`Collector`, so that
one pass reports them all (:func:`variantlab.config.experiment.experiment_from_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..errors import SpecError, pydantic_issues
from ..model.kernels import with_kernels
from ..model.specs import ModelSpec, parse_model_spec
from ..plugin.registry import SLOTS, Registry
from .axes import base_settings_of, setting_problems
from .axes import split as split_axes
from .dataover import data_fit, split_data, variant_data
from .named import key_of
from .overrides import (
    apply_overrides,
    component_of,
    expansions,
    fit_tuned,
    lookup,
    override_source,
    show,
)
from .yamlio import YamlDoc


@dataclass(frozen=True)
class Variant:
    """One fully validated model of the experiment."""

    name: str
    label: str
    overrides: dict[str, Any]
    spec: ModelSpec
    warnings: list[str] = field(default_factory=list)
    #: probe -> {setting: value}: the variant's setting axes (``measure.<probe>.<key>``)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    data: Any = None  # its own data spec when the grid or its set: has data.* paths

    def data_or(self, default: Any) -> Any:
        """The variant's data spec, else the experiment's ``default``."""
        return default if self.data is None else self.data



class Collector:
    """Messages gathered from every part of the file before one InputError is raised."""

    def __init__(self, doc: YamlDoc):
        self.doc = doc
        self.messages: list[str] = []

    def add(self, loc: Sequence[object], message: str, at: str = "auto") -> None:
        self.messages.append(self.doc.message(tuple(loc), message, at))

    def add_pydantic(self, exc: ValidationError, prefix: Sequence[object], known: Sequence[str]) -> None:
        for issue in pydantic_issues(exc, prefix, known):
            at = "key" if issue.message.startswith("unknown key") else "auto"
            self.add(self.doc.clean(issue.loc), issue.message, at)


def expand_variants(
    spec: Any, registry: Registry, out: Collector, root: tuple,
    value_name: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[list[Variant], dict[str, int]]:
    """The variants of ``spec`` (an :class:`variantlab.config.experiment.ExperimentSpec`,
    which imports this module), and each name's context length; ``value_name``: the names of named
    axis values (:func:`variantlab.config.named.value_names`), which label a grid variant
    in place of the value."""
    value_name = value_name or {}
    base = spec.model
    try:
        base_data = parse_model_spec(base, registry).to_data()
    except SpecError:
        base_data = {**base, **{slot: component_of(base, slot) for slot in SLOTS}}
    variants: list[Variant] = []
    seen: dict[str, int] = {}  # name -> context_length
    model_issues: dict[tuple, list[str]] = {}  # (loc, message) -> variants where it arises
    base_settings = base_settings_of(spec.measure, registry)
    combos, _ = fit_tuned(expansions(spec.grid, [v.set for v in spec.variants]), spec.tune,
                          base, registry)
    for named, all_overrides, where in combos:
        overrides, data_over = split_data(all_overrides)
        data = variant_data(spec.data, data_over, where, named is None,
                            lambda loc, msg, at: out.add(loc, msg, at=at)) if data_over else None
        model_over, changes = split_axes(overrides)
        model, bad = apply_overrides(base, model_over, registry)
        bad_settings, at_values = setting_problems(spec.measure, registry, overrides, changes)
        bad.update(bad_settings)
        for path, msg in at_values:
            out.add(where[path], msg)
        for path, msg in bad.items():
            if msg:
                out.add(where[path][:-1] if named is None else where[path], msg, at="key")
        if bad:  # validate the rest of the variant all the same
            good = {p: v for p, v in model_over.items() if p not in bad}
            model, _ = apply_overrides(base, good, registry)
        differing = [f"{p}={value_name.get(p, {}).get(key_of(v)) or show(v)}"
                     for p, v in overrides.items()
                     if lookup({**base_data, "measure": base_settings}, p) != v]
        base_plain = spec.data.model_dump(mode="json")
        differing += [f"{p}={show(v)}" for p, v in data_over.items()
                      if lookup(base_plain, p[5:]) != v]
        label = ",".join(differing) or "base"
        name = label if named is None else spec.variants[named].name
        if name in seen:
            loc = ("variants", named, "name") if named is not None else next(iter(where.values()))
            out.add(loc, f"variant name {name!r} is used twice; names must be unique"
                    + ("" if named is not None else " (repeated grid value?)"))
        ctx = model.get("context_length")
        seen[name] = ctx if isinstance(ctx, int) else ModelSpec.model_fields["context_length"].default
        try:
            model_spec = with_kernels(parse_model_spec(model, registry), spec.kernels, registry)
        except SpecError as exc:
            for issue in exc.issues:
                src = override_source(issue.loc, where)
                if src is not None:
                    out.add(src, issue.message)
                else:
                    names = model_issues.setdefault((issue.loc, issue.message), [])
                    names += [] if name in names else [name]
            continue
        data_fit(data or spec.data, model_spec.context_length, model_spec.vocab_size, where,
                 name, lambda loc, msg, at: out.add(loc, msg, at=at))
        if bad or (data_over and data is None):
            continue
        variants.append(Variant(name, label if named is None else name, dict(all_overrides),
                                model_spec, model_spec.warnings(), changes, data))
    for (loc, msg), names in model_issues.items():
        if len(names) < len(seen):  # the base is fine; some variants' overrides break it
            msg += f" (in variant{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))})"
        out.add(root + loc, msg, at="key" if msg.startswith("unknown key") else "auto")
    return variants, seen


__all__ = ["Collector", "Variant", "expand_variants"]
