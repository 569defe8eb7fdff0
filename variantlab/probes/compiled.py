"""``compile: true``: running a probe's model under ``torch.compile``.

``torch.compile`` is lazy: it traces and compiles at the model's first call (and again
for each new mode or shape). :func:`compile_model` wraps the model after a
``torch._dynamo.reset()`` (so a long run never hits dynamo's recompile limit, past which
it would silently fall back to eager, and each unit's compile time is its own);
:func:`compile_errors` turns a failure of dynamo or inductor during a call into a
:class:`CompileError` that says what to do. The runner stores it as the unit's error, and
the other units go on.

``compile: auto`` (the training probe's default) compiles a run of at least
:data:`AUTO_STEPS` steps (:func:`use_compile`) and, when compiling fails, runs the unit
eager instead and says so (the training probe's ``compile_fallback`` row). The rule, from
benchmarks/compile.py (benchmarks/RESULTS.md, 2026-11-24, 1 thread): compiled
forward+backward takes at most 0.75 of eager's time, and eager at least 9 ms a step on the
smallest model measured (a gpt of width 64, batch 4 x 64), so compiling saves at least
0.25 x 9 ms = 2.25 ms a step; compiling costs at most 2.2 s from inductor's warm cache, so it
pays back from 2.2 s / 2.25 ms = 980 steps: :data:`AUTO_STEPS` = 1,000. The cache is
inductor's on-disk FX graph and AOTAutograd caches (one folder per user, shared by the
processes of a run and kept across runs), which the units of a sweep's same-shape
variants (other seeds, rates, any setting that leaves the graph alone) reuse: only the first
unit of a shape pays the cold compile (6 to 16 s, paid back after 3,000 to 7,000 steps).
Shorter runs, the fast test suite's among them, stay eager, and their unit keys are those
of ``compile: false`` (the training probe's settings write ``auto`` as ``false`` there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

#: What the compiled model is compiled with (inductor: the default backend).
BACKEND = "inductor"
#: ``compile: auto`` compiles a run of at least this many steps (module docstring)
AUTO_STEPS = 1000


def use_compile(mode: bool | str, steps: int) -> bool:
    """Whether a run of ``steps`` steps runs compiled under ``compile: mode`` (``true``,
    ``false`` or ``auto``)."""
    return steps >= AUTO_STEPS if mode == "auto" else bool(mode)


def warm_cache() -> None:
    """Inductor's on-disk caches on (FX graphs, AOTAutograd), so that same-shape units
    reuse each other's compiled code, across processes and runs."""
    for module, name in (("torch._inductor.config", "fx_graph_cache"),
                         ("torch._functorch.config", "enable_autograd_cache")):
        try:
            config = __import__(module, fromlist=[name])
        except ImportError:  # no inductor: compile_model says so
            continue
        if hasattr(config, name):
            setattr(config, name, True)


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
        warm_cache()
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


__all__ = ["AUTO_STEPS", "BACKEND", "CompileError", "compile_errors", "compile_model",
           "use_compile", "warm_cache"]
