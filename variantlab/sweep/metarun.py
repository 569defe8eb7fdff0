"""Running a model on PyTorch's ``meta`` device without importing ``torch._dynamo``.

The size guard (:mod:`variantlab.sweep.sizeguard`) builds each variant on the meta device
and runs one forward to count activations. PyTorch computes most meta results through its
Python reference kernels (``torch._refs``, ``torch._prims``), each wrapped in
``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` to mark the kernel as
not traceable: 0.8-1.3 s (with sympy) of every ``variantlab validate``, for a command that
compiles nothing. Two pieces keep that out:

- :class:`MetaFills`: an initialiser or random fill of a meta tensor returns it (there are
  no values to make), and dropout in training multiplies by a noise tensor of the input's
  shape and dtype, which autograd saves as PyTorch's dropout saves its scaled noise;
- :func:`no_dynamo_import`: while the forward runs, and only if ``torch._dynamo`` is not
  imported yet, a stand-in module answers the wrappers' ``torch._dynamo.disable(fn)`` with
  ``fn`` itself. On leaving, the stand-in is removed and every kernel it answered forgets
  the answer, so a later ``torch.compile`` in the same process imports the real module and
  marks those kernels as PyTorch intends. Anything else asked of the stand-in raises
  :class:`_StandInAsked`, and the caller runs again without it.

``tests/test_sizeguard.py`` checks that the counts equal a meta build and forward without
either piece, for every built-in component.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_DYNAMO = "torch._dynamo"
_FILLS = frozenset(getattr(torch.Tensor, name) for name in (
    "normal_", "uniform_", "erfinv_", "bernoulli_", "exponential_", "log_normal_", "cauchy_",
    "geometric_", "random_"))


class MetaFills(torch.overrides.TorchFunctionMode):
    """Fills and dropout of meta tensors without PyTorch's reference kernels (see the module
    docstring). ``torch.nn.init``'s functions are caught whole: inside a mode's handler the
    mode is off, so the fills they make would not reach it. Tensors on other devices pass
    through unchanged."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else next(iter(kwargs.values()), None)  # nn.init: tensor=
        if isinstance(first, torch.Tensor) and first.is_meta:
            if func in _FILLS or getattr(func, "__module__", None) == "torch.nn.init":
                return first  # an initialiser or a random fill: no values to make
            if func is torch.nn.functional.dropout:
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                training = args[2] if len(args) > 2 else kwargs.get("training", True)
                if training and p > 0:
                    return first * torch.empty_like(first)  # the scaled noise, as saved
        return func(*args, **kwargs)


class _StandInAsked(RuntimeError):
    """Code asked the stand-in ``torch._dynamo`` for more than ``disable``."""


class _StandIn(types.ModuleType):
    def __init__(self) -> None:
        super().__init__(_DYNAMO)
        self.answered: list[Callable[..., Any]] = []

    def disable(self, fn: Callable[..., Any], recursive: bool = True,
                wrapping: bool = True) -> Callable[..., Any]:
        self.answered.append(fn)
        return fn

    def __getattr__(self, name: str) -> Any:
        raise _StandInAsked(f"torch._dynamo.{name} asked during a meta run")


@contextmanager
def no_dynamo_import() -> Iterator[None]:
    """While inside, ``torch._dynamo`` is a stand-in unless it is imported already (then
    nothing changes); see the module docstring."""
    if _DYNAMO in sys.modules:
        yield
        return
    stand_in = _StandIn()
    sys.modules[_DYNAMO] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_DYNAMO) is stand_in:
            del sys.modules[_DYNAMO]
        if torch.__dict__.get("_dynamo") is stand_in:
            delattr(torch, "_dynamo")
        for fn in stand_in.answered:
            fn.__dict__.pop("__dynamo_disable", None)


def meta_run(fn: Callable[[], T]) -> T:
    """``fn()`` (a meta build and forward) under :class:`MetaFills` and
    :func:`no_dynamo_import`; run again with the real ``torch._dynamo`` if the stand-in
    was asked for anything else."""
    try:
        with no_dynamo_import(), MetaFills():
            return fn()
    except _StandInAsked:
        with MetaFills():
            return fn()
