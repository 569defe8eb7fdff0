"""The probes' pieces of the report's shared parts, from the registry: the summary metrics,
the section tables, the plots, the reading, the warnings and the fair comparisons
(:mod:`.fair`) are each the concatenation of
every registered probe's piece (:class:`variantlab.plugin.probe.ProbeView`), so the report
names no probe. Built-in and plugin probes go through the same path. A piece that raises
while the report is written gives its neutral value and a notice (:mod:`.guard`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

from ..plugin.probe import ProbeView
from ..plugin.registry import Registry, get_registry
from .guard import Failure, guarded, run_part

PIECES = ("metrics", "section", "plots", "reading", "aside", "warnings", "fair", "claims")


_REGISTRY: ContextVar[Registry | None] = ContextVar("variantlab_report_registry", default=None)


def registry_or_default(registry: Registry | None) -> Registry:
    """``registry``, or the one the report is being built with (:func:`using`), or the
    default one (built-ins and installed plugins)."""
    if registry is not None:
        return registry
    return _REGISTRY.get() or get_registry()


@contextmanager
def using(registry: Registry) -> Iterator[None]:
    """While inside, :func:`registry_or_default` of None is ``registry`` (a piece that
    needs the registry, e.g. to count a stored spec's parameters, asks for it so)."""
    token = _REGISTRY.set(registry)
    try:
        yield
    finally:
        _REGISTRY.reset(token)


def pieces(registry: Registry | None, piece: str,
           on_error: Callable[[str, Failure], Any] | None = None) -> list[Callable[..., Any]]:
    """Every registered probe's ``piece`` (one of :data:`PIECES`), ordered by its view's
    rank, ties in registration order. While the report is written (:mod:`.guard`), a piece
    that raises gives ``on_error(probe, failure)``, by default nothing (None for
    ``metrics`` and ``section``, an empty list for the others)."""
    if piece not in PIECES:
        raise ValueError(f"unknown report piece {piece!r}; one of {', '.join(PIECES)}")
    found: list[tuple[int, int, Callable[..., Any]]] = []
    for probe in registry_or_default(registry).probes():
        for view in views_of(probe):
            fn = view.pieces()[piece] if isinstance(view, ProbeView) else None
            if isinstance(view, ProbeView) and fn is not None:
                neutral = partial(on_error or _nothing(piece), probe.name)
                found.append((view.rank, len(found),
                              guarded(f"probe {probe.name}: {piece}", fn, neutral)))
    return [fn for _, _, fn in sorted(found, key=lambda t: (t[0], t[1]))]


def _nothing(piece: str) -> Callable[[str, Failure], Any]:
    if piece in ("metrics", "section"):
        return lambda probe, failure: None
    return lambda probe, failure: []


def views_of(probe: Any) -> tuple[Any, ...]:
    """``probe.views``; while the report is written, views that cannot be imported (a
    plugin's ``"module:attr"``) are a notice and none."""
    return run_part(f"probe {probe.name}: views", lambda: probe.views, default=lambda f: ())


__all__ = ["PIECES", "pieces", "registry_or_default", "using", "views_of"]
