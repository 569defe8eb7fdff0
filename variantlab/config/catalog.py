"""What the registry holds, as plain rows for ``variantlab plugins`` (table or ``--json``)."""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from ..model.specs import DEFAULT_COMPONENTS
from ..plugin.registry import LISTED, Registry

__all__ = ["failure_rows", "param_rows", "plugin_rows", "type_name"]

_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "len >=",
           "max_length": "len <=", "multiple_of": "multiple of"}


def type_name(annotation: Any) -> str:
    """A short readable type: ``'naive' | 'sdpa'``, ``float``, ``list[int] | None``."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{inner}]" if inner else name
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return " | ".join(repr(m.value) for m in annotation)
        if issubclass(annotation, BaseModel):
            return "component" if "kind" in annotation.model_fields else annotation.__name__
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def _default(name: str, info: FieldInfo) -> Any:
    if info.default is not PydanticUndefined:
        return to_jsonable_python(info.default, fallback=repr)
    if info.default_factory is not None:
        try:
            return to_jsonable_python(info.default_factory(), fallback=repr)  # type: ignore[call-arg]  # pydantic types it as maybe taking the data; TypeError below if so
        except TypeError:  # a factory that wants the validated data
            return None
    if name in DEFAULT_COMPONENTS:  # a model's slot: filled from the defaults
        return DEFAULT_COMPONENTS[name]
    return "required"


def param_rows(spec_cls: type[BaseModel], skip: tuple[str, ...] = ("kind", "family")) -> list[dict]:
    """One row per pydantic field: name, type (with bounds), default, description."""
    rows = []
    for name, info in spec_cls.model_fields.items():
        if name in skip:
            continue
        type_text = type_name(info.annotation)
        bounds = _constraints(info)
        rows.append({
            "name": name,
            "type": f"{type_text} ({bounds})" if bounds else type_text,
            "default": _default(name, info),
            "description": info.description or "",
        })
    return rows


def _summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s own docstring on one line ('' without one).

    Classes: only a docstring written on the class itself (not a base class's); other
    objects: only functions and methods (a ``functools.partial`` would give partial's doc).
    """
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
    elif inspect.isroutine(obj):
        doc = getattr(obj, "__doc__", None)
    else:
        doc = None
    if not isinstance(doc, str) or not doc.strip():
        return ""
    first = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return " ".join(first.split())


def _doc(spec_cls: type, build: Any = None) -> str:
    """What the kind is: the spec's docstring summary, else the build's (a class or function)."""
    return _summary(spec_cls) or _summary(build)



def plugin_rows(registry: Registry, slot: str | None = None) -> list[dict]:
    """Every registered kind (of ``slot``, or all of :data:`LISTED` in order) with its
    parameters: a probe's are its ``measure:`` settings, an executor's its options.

    Each row: ``slot``, ``kind``, ``plugin`` (where it came from), ``source`` (builtin,
    entry point or module), ``doc`` (the first paragraph of the spec's docstring, on one line;
    else the build's) and ``params``: ``[{name, type, default, description}]`` from the spec's
    pydantic fields and their ``Field(description=...)``.
    """
    if slot is not None and slot not in LISTED:
        raise ValueError(f"unknown slot {slot!r}; choose one of {', '.join(LISTED)}")
    sources = dict(registry.plugins)
    rows = []
    found: list[tuple[str, str, type, Callable[..., Any]]]
    for s in ([slot] if slot else LISTED):
        if s == "probe":
            found = [(p.name, p.plugin, p.settings_cls, p.run) for p in registry.probes()]
        elif s == "executor":
            found = [(n, e.plugin, e.options_cls, e.factory) for n in registry.executor_names()
                     for e in [registry.executor(n)]]
        else:
            found = [(c.kind, c.plugin, c.spec_cls, c.build) for c in registry.components(s)]
        rows += [{"slot": s, "kind": kind, "plugin": plugin, "source": sources.get(plugin, ""),
                  "doc": _doc(spec_cls, build), "params": param_rows(spec_cls)}
                 for kind, plugin, spec_cls, build in found]
    return rows


def failure_rows(registry: Registry) -> list[dict]:
    """Plugins that failed to load and were skipped: ``plugin``, ``source``, ``error``
    (plus the ``traceback`` for ``--json``)."""
    return [
        {"plugin": f.plugin, "source": f.source, "error": f.error, "traceback": f.traceback}
        for f in registry.failures
    ]
