"""``compile: true``: running a probe's model under ``torch.compile``.

``torch.compile`` is lazy: it traces and compiles at the model's first call (and again
for each new mode or shape). :func:`compile_model` wraps the model after a
``torch._dynamo.reset()`` (so a long run never hits dynamo's recompile limit, past which
it would silently fall back to eager, and each unit's compile time is its own);
:func:`compile_errors` turns a failure of dynamo or inductor during a call into a
:class:`CompileError` that says what to do. The runner stores it as the unit's error, and
the other units go on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

#: What the compiled model is compiled with (inductor: the default backend).
BACKEND = "inductor"


class CompileError(RuntimeError):
    """torch.compile is unavailable, or failed for this variant."""


def _message(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return (f"torch.compile ({BACKEND}) failed for this variant: {type(exc).__name__}: "
            f"{first}; set compile: false in the probe's settings to measure it eager")


def compile_model(model: nn.Module, enabled: bool) -> nn.Module:
    """``model`` itself when ``enabled`` is false, else ``torch.compile(model)`` (sharing
    its parameters); :class:`CompileError` when torch.compile is unavailable."""
    if not enabled:
        return model
    if not hasattr(torch, "compile"):
        raise CompileError(f"compile: true, but torch {torch.__version__} has no "
                           "torch.compile; use torch >= 2.0 or set compile: false")
    try:
        torch._dynamo.reset()
        return torch.compile(model, backend=BACKEND)  # type: ignore[return-value]
    except Exception as exc:  # noqa: BLE001 - any failure to set up the compiler
        raise CompileError(_message(exc)) from exc


def _compiler_errors() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for module, name in (("torch._dynamo.exc", "TorchDynamoException"),
                         ("torch._inductor.exc", "InductorError")):
        try:
            found.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


@contextlib.contextmanager
def compile_errors(enabled: bool) -> Iterator[None]:
    """Within it, a dynamo/inductor failure of a compiled model becomes a
    :class:`CompileError`; other exceptions (the model's own) pass unchanged."""
    if not enabled:
        yield
        return
    try:
        yield
    except _compiler_errors() as exc:
        raise CompileError(_message(exc)) from exc


__all__ = ["BACKEND", "CompileError", "compile_errors", "compile_model"]
