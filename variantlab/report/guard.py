"""A report part that raises costs only itself (issue 26.3).

While :func:`collecting` is active (``write_report`` and ``build_context`` turn it on), every
part of the report (a core table, a probe's piece or plain view, a plot's drawing or its SVG)
runs through :func:`run_part`: one that raises is recorded as a :class:`Failure` naming the
part and the error, and gives its neutral value instead (no table, no sentences, a skipped
plot whose reason is the failure). The report lists the failures at its top ("Parts that
failed") and is written with everything else; ``variantlab run`` and ``variantlab report``
then exit 1 with one line naming them. Outside :func:`collecting`, a part's error propagates
as before (tests and library callers see it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

T = TypeVar("T")
MAX_ERROR = 300  # characters of an error message kept in a notice


@dataclass(frozen=True)
class Failure:
    """One part that raised: which (``part``) and why (``error``, one line)."""

    part: str
    error: str

    def notice(self) -> str:
        return f"{self.part} failed: {self.error}"


_FAILURES: ContextVar[list[Failure] | None] = ContextVar("variantlab_report_failures",
                                                         default=None)


def error_text(exc: BaseException) -> str:
    """``Type: message`` on one line, at most :data:`MAX_ERROR` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR - 1] + "…"


@contextmanager
def collecting() -> Iterator[list[Failure]]:
    """Record failing parts in the yielded list instead of raising (nested: the outer list)."""
    current = _FAILURES.get()
    if current is not None:
        yield current
        return
    failures: list[Failure] = []
    token = _FAILURES.set(failures)
    try:
        yield failures
    finally:
        _FAILURES.reset(token)


def failures() -> list[Failure]:
    """The list being collected into (empty and unused when not collecting)."""
    current = _FAILURES.get()
    return current if current is not None else []


def attempt(part: str, fn: Callable[..., T], *args: Any,
            **kwargs: Any) -> tuple[T | None, Failure | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, failure)`` for an ``Exception`` it
    raised, recorded nowhere: :func:`run_part` records it, a caller that runs parts out of
    order (the report's figures, drawn by two processes) records them in its own order."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:
        return None, Failure(part, error_text(exc))


def run_part(part: str, fn: Callable[..., T], *args: Any,
             default: Callable[[Failure], T], **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``; while collecting, an ``Exception`` it raises is recorded
    and ``default(failure)`` returned instead."""
    failures = _FAILURES.get()
    if failures is None:
        return fn(*args, **kwargs)
    value, failure = attempt(part, fn, *args, **kwargs)
    if failure is None:
        return cast("T", value)
    failures.append(failure)
    return default(failure)


def guarded(part: str, fn: Callable[..., T], default: Callable[[Failure], T]
            ) -> Callable[..., T]:
    """``fn`` wrapped by :func:`run_part` under the name ``part``."""

    def call(*args: Any, **kwargs: Any) -> T:
        return run_part(part, fn, *args, default=default, **kwargs)

    return call


__all__ = ["Failure", "attempt", "collecting", "error_text", "failures", "guarded", "run_part"]
