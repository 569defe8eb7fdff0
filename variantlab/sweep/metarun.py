"""Running a model on PyTorch's ``meta`` device without importing ``torch._dynamo`` or sympy.

The size guard (:mod:`variantlab.sweep.sizeguard`) builds each variant on the meta device
and runs one forward to count activations. PyTorch computes most meta results through its
Python reference kernels (``torch._refs``, ``torch._prims``), each wrapped in
``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` to mark the kernel as
not traceable: 0.8-1.3 s (with sympy) of every ``variantlab validate``, for a command that
compiles nothing. The same kernels' checks (``torch._check``, broadcasting, type promotion)
import ``torch.fx.experimental.symbolic_shapes`` and sympy (about 0.3 s CPU) to answer
questions about plain ``bool`` and ``int`` values. Three pieces keep that out:

- :class:`MetaFills`: an initialiser or random fill of a meta tensor returns it (there are
  no values to make), and dropout in training multiplies by a noise tensor of the input's
  shape and dtype, which autograd saves as PyTorch's dropout saves its scaled noise;
- :func:`no_dynamo_import`: while the forward runs, and only if ``torch._dynamo`` is not
  imported yet, a stand-in module answers the wrappers' ``torch._dynamo.disable(fn)`` with
  ``fn`` itself. On leaving, the stand-in is removed and every kernel it answered forgets
  the answer, so a later ``torch.compile`` in the same process imports the real module and
  marks those kernels as PyTorch intends. Anything else asked of the stand-in raises
  :class:`_StandInAsked`, and the caller runs again without it;
- the same function puts stand-ins for ``torch.fx.experimental.symbolic_shapes`` and
  ``sympy`` (each only if not imported yet). Without them no ``ShapeEnv`` can exist, so no
  ``SymInt``/``SymBool`` and no sympy expression can either: the stand-in's helpers
  (``expect_true``, ``guard_or_false``, ``sym_eq``, ...) answer concrete values exactly as
  the real ones do for them, and ``sympy.Basic`` is a class nothing is an instance of. A
  symbolic value, or any other name asked of them, raises :class:`_StandInAsked` likewise.
  A module first imported during the run that kept a stand-in (or one of its answers) in a
  global gets the real one on leaving.

``tests/test_sizeguard.py`` checks that the counts equal a meta build and forward without
either piece, for every built-in component.
"""

from __future__ import annotations

import functools
import importlib
import operator
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_DYNAMO = "torch._dynamo"
_SHAPES = "torch.fx.experimental.symbolic_shapes"
_SYMPY = "sympy"
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
    """Code asked a stand-in module for more than it answers."""


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


def _concrete(*values: Any) -> None:
    """Raise :class:`_StandInAsked` if any value is symbolic (the real module's job)."""
    for v in values:
        if isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            raise _StandInAsked(f"a symbolic {type(v).__name__} in a meta run")


def _plain_bool(a: Any, skip: int = 0) -> bool:
    """``expect_true``, ``guard_or_false``, ``guard_size_oblivious``, ... of a ``bool``."""
    _concrete(a)
    if type(a) is not bool:
        raise AssertionError(f"Expected bool, got {type(a)}")
    return a


def _sym_and(x: Any, *others: Any) -> Any:
    _concrete(x, *others)
    return functools.reduce(operator.and_, others, x)


def _sym_or(x: Any, *others: Any) -> Any:
    _concrete(x, *others)
    return functools.reduce(operator.or_, others, x)


def _sym_eq(x: Any, y: Any) -> Any:
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return len(x) == len(y) and functools.reduce(operator.and_, map(_sym_eq, x, y), True)
    _concrete(x, y)
    if not (isinstance(x, int) and isinstance(y, int)):
        raise AssertionError(f"unexpected sym_eq between {type(x)} {type(y)}")
    return x == y


def _hint(a: Any) -> Any:
    _concrete(a)
    if not isinstance(a, int):  # bool is an int
        raise AssertionError(f"Expected int, got {type(a)}")
    return a


def _always(answer: bool) -> Callable[[Any], bool]:
    def answer_for(a: Any) -> bool:
        _concrete(a)
        return answer
    return answer_for


_SHAPES_ANSWERS: dict[str, Callable[..., Any]] = {
    "expect_true": _plain_bool, "guard_bool": _plain_bool, "guard_or_false": _plain_bool,
    "guard_or_true": _plain_bool, "guard_size_oblivious": _plain_bool,
    "statically_known_true": _plain_bool, "sym_and": _sym_and, "sym_or": _sym_or,
    "sym_eq": _sym_eq, "guarding_hint_or_throw": _hint, "has_guarding_hint": _always(True),
    "is_nested_int": _always(False)}


class _NoSympyExpression:
    """``sympy.Basic`` while sympy is not imported: no sympy expression exists then."""


class _AnswerStandIn(types.ModuleType):
    """A module answering only the names in ``answers``; the import system's own questions
    (``__path__``, ...) get ``AttributeError`` as from any module without them."""

    def __init__(self, name: str, answers: dict[str, Any]) -> None:
        super().__init__(name)
        self.__dict__.update(answers)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _StandInAsked(f"{self.__name__}.{name} asked during a meta run")


@contextmanager
def no_dynamo_import() -> Iterator[None]:
    """While inside, ``torch._dynamo``, ``torch.fx.experimental.symbolic_shapes`` and
    ``sympy`` are stand-ins, each unless it is imported already (then it stays as it is);
    see the module docstring."""
    stand_in = _StandIn()
    placed = {name: module for name, module in (
        (_DYNAMO, stand_in), (_SHAPES, _AnswerStandIn(_SHAPES, _SHAPES_ANSWERS)),
        (_SYMPY, _AnswerStandIn(_SYMPY, {"Basic": _NoSympyExpression})))
        if name not in sys.modules}
    before = set(sys.modules)
    sys.modules.update(placed)
    try:
        yield
    finally:
        for name, module in placed.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        _rebind(set(sys.modules) - before, placed)
        if torch.__dict__.get("_dynamo") is stand_in:
            delattr(torch, "_dynamo")
        for fn in stand_in.answered:
            fn.__dict__.pop("__dynamo_disable", None)


def _rebind(fresh: set[str], placed: Mapping[str, types.ModuleType]) -> None:
    """A module first imported during the run that bound a stand-in, or one of its answers,
    to a global (``import sympy`` at its top) gets the real object in its place (importing
    the real module then): no stand-in outlives the run."""
    modules = {id(module): name for name, module in placed.items()}
    owners = {id(value): name for name, module in placed.items()
              for key, value in vars(module).items()
              if not key.startswith("__") and callable(value)}
    for name in fresh:
        space = getattr(sys.modules.get(name), "__dict__", {})
        for key, value in list(space.items()):
            if id(value) in modules:
                space[key] = importlib.import_module(modules[id(value)])
            elif id(value) in owners:  # one answer may stand for several names: the bound one
                stand_in = vars(placed[owners[id(value)]])
                attr = key if stand_in.get(key) is value else \
                    next(k for k, v in stand_in.items() if v is value)
                space[key] = getattr(importlib.import_module(owners[id(value)]), attr)


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
