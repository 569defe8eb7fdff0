"""Setting axes: grid axes and named-variant overrides over a probe's settings.

A path ``measure.<probe>.<key>`` (``measure.training.lr``) in ``grid:`` or a named
variant's ``set:`` changes that probe's setting for the variant instead of its model: the
variant's units of that probe run with the setting changed (so their unit keys differ),
its other probes' units are the same as the base's. Model paths are *architecture* axes,
``measure.*`` paths are *setting* axes; the report compares architectures each at its
own best setting (:mod:`variantlab.report.fair.tuned`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ..errors import SpecError, pydantic_issues
from ..plugin.registry import Registry
from ..plugin.settings import Strict

PREFIX = "measure."


def is_setting(path: str) -> bool:
    """Whether an override path names a probe setting (``measure.<probe>.<key>``)."""
    return path.startswith(PREFIX)


def split(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(model overrides, probe -> {setting: value})`` of a variant's overrides."""
    model: dict[str, Any] = {}
    settings: dict[str, dict[str, Any]] = {}
    for path, value in overrides.items():
        if is_setting(path):
            parts = path.split(".")
            if len(parts) == 3 and all(parts):  # else path_problem says how to write it
                settings.setdefault(parts[1], {})[parts[2]] = value
        else:
            model[path] = value
    return model, settings


def path_problem(path: str, measure: Mapping[str, Any], registry: Registry) -> str | None:
    """Why a ``measure.*`` path names no setting of a probe that runs (None: it does)."""
    parts = path.split(".")
    running = [p for p, s in measure.items() if s is not None]
    if len(parts) != 3 or not all(parts):
        return (f"{path!r}: a setting axis is written measure.<probe>.<setting> "
                f"(e.g. measure.training.lr)")
    probe, key = parts[1], parts[2]
    if probe not in running:
        close = difflib.get_close_matches(probe, running, n=1, cutoff=0.6)
        hint = f"did you mean 'measure.{close[0]}.{key}'? " if close else ""
        return (f"{path!r}: probe {probe!r} does not run in this experiment; {hint}"
                f"add it under measure: or vary a probe that runs "
                f"({', '.join(running) or 'none'})")
    try:
        fields = list(registry.probe(probe).settings_cls.model_fields)
    except SpecError:
        return None  # the unknown probe is reported at measure: already
    if key not in fields:
        paths = [f"measure.{probe}.{f}" for f in fields]
        close = difflib.get_close_matches(path, paths, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "check the spelling."
        return (f"{path!r} names no setting of probe {probe!r}; {hint} "
                f"{probe} has: {', '.join(fields)}")
    return None


def value_issues(probe: str, raw: Mapping[str, Any] | None, changes: Mapping[str, Any],
                 registry: Registry) -> list[tuple[str, str]]:
    """``(setting, message)`` for each changed setting the probe's settings model refuses
    when the base settings ``raw`` (as written under ``measure:``) take ``changes``."""
    try:
        cls = registry.probe(probe).settings_cls
    except SpecError:
        return []
    try:
        cls.model_validate(with_changes(cls, dict(raw or {}), changes))
    except ValidationError as exc:
        out = []
        for issue in pydantic_issues(exc, (), list(cls.model_fields)):
            key = str(issue.loc[0]) if issue.loc else ""
            if key in changes:
                out.append((key, issue.message))
        return out
    return []


def effective(base: Mapping[str, Strict], changes: Mapping[str, Mapping[str, Any]]
              ) -> dict[str, Strict]:
    """Probe name -> settings of a variant: the experiment's (``base``) with the variant's
    setting overrides applied and validated (a probe without changes keeps its object)."""
    out = dict(base)
    for probe, change in changes.items():
        if probe in out and change:
            settings = out[probe]
            from ..probes.recipe import BUDGET_KEYS

            data = settings.model_dump()
            unset = set(type(settings).model_fields) - settings.model_fields_set
            for key in BUDGET_KEYS if BUDGET_KEYS[0] in data else ():
                if key in unset:  # a default, refilled by validation
                    data.pop(key, None)
            out[probe] = type(settings).model_validate(with_changes(type(settings), data, change))
    return out


def with_changes(cls: type, data: Mapping[str, Any], change: Mapping[str, Any]) -> dict:
    """Settings ``data`` of class ``cls`` with a variant's ``change`` applied. A training
    budget in the change (one of ``steps``, ``tokens``, ``tokens_per_param``) replaces the
    base's budget rather than adding a second one."""
    from ..probes.recipe import BUDGET_KEYS

    out = dict(data)
    fields = getattr(cls, "model_fields", {})
    if all(k in fields for k in BUDGET_KEYS) and any(k in change for k in BUDGET_KEYS):
        for key in BUDGET_KEYS:
            out.pop(key, None)
    return {**out, **dict(change)}


def base_settings_of(measure: Mapping[str, Any], registry: Registry) -> dict[str, Any]:
    """Probe -> its settings under ``measure:`` with defaults filled in (plain data), for
    labels: a setting axis's value equal to it is left out of a variant's label."""
    out: dict[str, Any] = {}
    for probe, raw in measure.items():
        try:
            out[probe] = registry.probe(probe).settings_cls.model_validate(raw or {}).model_dump()
        except (SpecError, ValidationError):
            continue
    return out


def setting_problems(measure: Mapping[str, Any], registry: Registry,
                     overrides: Mapping[str, Any], changes: Mapping[str, Mapping[str, Any]],
                     ) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``(path -> message, [(path, message)])``: setting axes that name no setting of a
    running probe (reported at the key), and values the probe's settings model refuses
    (reported at the value; their path maps to '' in the first)."""
    bad = {}
    for path in overrides:
        if is_setting(path) and (msg := path_problem(path, measure, registry)):
            bad[path] = msg
    at_values = []
    for probe, change in changes.items():
        good = {k: v for k, v in change.items() if f"{PREFIX}{probe}.{k}" not in bad}
        for key, msg in value_issues(probe, measure.get(probe), good, registry):
            at_values.append((f"{PREFIX}{probe}.{key}", msg))
            bad[f"{PREFIX}{probe}.{key}"] = ""
    return bad, at_values


def setting_loc(spec: Any, name: str, path: str, value: Any) -> tuple:
    """Where a variant's setting axis ``path`` is given: its grid value or its ``set:``."""
    if path in spec.grid and value in spec.grid[path]:
        return ("grid", path, spec.grid[path].index(value))
    i = next((i for i, n in enumerate(spec.variants) if n.name == name), None)
    return ("variants", i, "set", path) if i is not None else ("grid", path)


def seq_len_problems(spec: Any, variants: Any) -> list[tuple[tuple, str]]:
    """``(YAML location, message)`` for each variant whose ``seq_len`` setting axis is
    above its model's ``context_length``."""
    out = []
    for v in variants:
        for probe, change in v.settings.items():
            seq, ctx = change.get("seq_len"), v.spec.context_length
            if isinstance(seq, int) and seq > ctx:
                out.append((setting_loc(spec, v.name, f"measure.{probe}.seq_len", seq),
                            f"seq_len={seq} is above context_length={ctx} of variant "
                            f"{v.name!r}; use seq_len <= {ctx} or raise context_length"))
    return out
