"""The component inside a tiny model of every family it fits, and spec round-trips."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from ..errors import SpecError
from ..model.build import build_model
from ..model.specs import ModelSpec, parse_model_spec
from ..model.tasks import task_for
from ..plugin.registry import Registry
from .checker import TINY_MODEL, B, Case, Checker, T, gen


def _model_case(spec: ModelSpec, registry: Registry) -> Case:
    task = task_for(spec, registry)
    batch = task.batch(spec, B, T, generator=gen())
    return Case(
        f"in family {spec.family!r}", lambda: build_model(spec, registry), (), dict(batch.inputs),
        expect=task.output_shape(spec, batch),
        loss=lambda out: task.loss(spec, out, batch.to(out.device)),
        zero_grad_is_bug=False)


def _uses(model: nn.Module, slot: str, kind: str) -> bool:
    if slot == "init":  # build_model applies the init scheme to every family
        return True
    return any(getattr(m, "variantlab_slot", None) == slot and getattr(m, "variantlab_kind", None)
               == kind for m in model.modules())


def round_trip(data: Any, parse: Callable[[Any], Any], original: Any, what: str) -> list[str]:
    try:
        plain = json.loads(json.dumps(data))
    except (TypeError, ValueError) as exc:
        return [f"spec round-trip: {what} is not plain JSON data: {exc}"]
    try:
        again = parse(plain)
    except SpecError as exc:
        return [f"spec round-trip: {what} does not validate again: {exc}"]
    return [] if again == original else [f"spec round-trip: {what} validates to a different spec"]


def family_problems(slot: str, spec: Any, registry: Registry,
                     families: Sequence[str] | None) -> list[str]:
    problems, fitted = [], []
    names = list(families) if families is not None else registry.kinds("family")
    for family in names:
        data = {**TINY_MODEL, "family": family}
        if slot == "family":
            data.update({k: v for k, v in spec.items() if k != "family"})
        else:
            data[slot] = spec.model_dump(mode="json")
        try:
            model_spec = parse_model_spec(data, registry)
            if slot != "family" and not _uses(build_model(model_spec, registry), slot, spec.kind):
                raise SpecError.at((slot,), f"family {family!r} has no {slot} slot")
        except Exception as exc:
            if families is not None:  # named explicitly: it must fit
                problems.append(f"in family {family!r}: build: {type(exc).__name__}: {exc}")
            continue
        fitted.append(family)
        problems += Checker(_model_case(model_spec, registry)).run()
        problems += [f"in family {family!r}: {p}" for p in round_trip(
            model_spec.to_data(), lambda d: parse_model_spec(d, registry), model_spec,
            "the model spec")]
    if not fitted and families is None:
        problems.append(f"fits no registered family ({', '.join(names)})")
    return problems
