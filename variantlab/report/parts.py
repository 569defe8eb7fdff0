"""The probes' pieces of the report's shared parts, from the registry: the summary metrics,
the section tables, the plots, the reading, the warnings and the fair comparisons
(:mod:`.fair`) are each the concatenation of
every registered probe's piece (:class:`variantlab.plugin.probe.ProbeView`), so the report
names no probe. Built-in and plugin probes go through the same path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plugin.probe import ProbeView
from ..plugin.registry import Registry, get_registry

PIECES = ("metrics", "section", "plots", "reading", "aside", "warnings", "fair")


def registry_or_default(registry: Registry | None) -> Registry:
    """``registry``, or the default one (built-ins and installed plugins)."""
    return get_registry() if registry is None else registry


def pieces(registry: Registry | None, piece: str) -> list[Callable[..., Any]]:
    """Every registered probe's ``piece`` (one of :data:`PIECES`), ordered by its view's
    rank, ties in registration order."""
    if piece not in PIECES:
        raise ValueError(f"unknown report piece {piece!r}; one of {', '.join(PIECES)}")
    found: list[tuple[int, int, Callable[..., Any]]] = []
    for probe in registry_or_default(registry).probes():
        for view in probe.views:
            fn = view.pieces()[piece] if isinstance(view, ProbeView) else None
            if isinstance(view, ProbeView) and fn is not None:
                found.append((view.rank, len(found), fn))
    return [fn for _, _, fn in sorted(found, key=lambda t: (t[0], t[1]))]


__all__ = ["PIECES", "pieces", "registry_or_default"]
