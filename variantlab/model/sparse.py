"""What routed (mixture-of-experts) modules expose to training and to the probes.

A module takes part by defining any of these, all optional (the built-in ``moe``
feed-forward defines them all, ``variantlab_plugins/moe.py``):

- ``aux_terms() -> dict[str, torch.Tensor]``: the auxiliary losses of its last forward,
  unweighted, as 0-d tensors that carry gradients (``aux_loss``: the load-balancing loss
  of Switch / Mixtral, Fedus et al. 2021; ``z_loss``: ST-MoE's router z-loss, Zoph et al.
  2022), and ``aux_weights() -> dict[str, float]``: the coefficient of each in the training
  objective;
- ``routing_stats() -> dict[str, Any]``: detached statistics of its last forward
  (``load``: share of the routing assignments per expert, ``router_entropy``,
  ``dropped_fraction``);
- ``after_step()``: called once after each optimizer step (aux-loss-free balancing,
  Wang et al. 2024, updates its per-expert bias there);
- ``inactive_params() -> int``: the parameters a token does not use (the experts it is
  not routed to), so that active parameters are the total minus these.

A dense model has no such module: :func:`aux_loss` returns None and every number stays
what it was.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

#: model -> (its routed modules, its after-step hooks), while :func:`fixed_structure` holds
_FIXED: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[Any, ...], tuple[Any, ...]]] = \
    weakref.WeakKeyDictionary()


@contextmanager
def fixed_structure(model: nn.Module) -> Iterator[None]:
    """Within, ``model``'s routed modules and after-step hooks are found once, not at each
    call (a training loop, whose model keeps its modules: walking them twice a step cost
    0.4 ms of a tiny GPT's 15 ms step on CPU)."""
    _FIXED[model] = (tuple(_walk_routed(model)), tuple(_walk_hooks(model)))
    try:
        yield
    finally:
        _FIXED.pop(model, None)


def _walk_routed(model: nn.Module) -> Iterator[Any]:
    return (m for m in model.modules() if callable(getattr(m, "aux_terms", None)))


def _walk_hooks(model: nn.Module) -> Iterator[Any]:
    hooks = (getattr(m, "after_step", None) for m in model.modules())
    return (hook for hook in hooks if callable(hook))


def routed_modules(model: nn.Module) -> Iterator[Any]:
    """The modules of ``model`` that report auxiliary losses (``aux_terms``)."""
    fixed = _FIXED.get(model)
    return iter(fixed[0]) if fixed is not None else _walk_routed(model)


def aux_loss(model: nn.Module) -> torch.Tensor | None:
    """The weighted auxiliary loss of ``model``'s last forward: the mean over its routed
    modules of ``sum(weight * term)``; None when it has no routed module or every weight is 0
    (the training objective is then the task's loss alone, unchanged)."""
    total: torch.Tensor | None = None
    count = 0
    for m in routed_modules(model):
        count += 1
        weights = m.aux_weights()
        for name, term in m.aux_terms().items():
            w = weights.get(name, 0.0)
            if w:
                total = w * term if total is None else total + w * term
    return None if total is None else total / count


def aux_values(model: nn.Module) -> dict[str, float]:
    """Each auxiliary term of the last forward, unweighted, averaged over the routed modules
    (empty for a dense model)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for m in routed_modules(model):
        for name, term in m.aux_terms().items():
            sums[name] = sums.get(name, 0.0) + float(term.detach())
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}


def after_step(model: nn.Module) -> None:
    """Let every module with an ``after_step`` hook update itself after an optimizer step."""
    fixed = _FIXED.get(model)
    for hook in fixed[1] if fixed is not None else _walk_hooks(model):
        hook()


def inactive_params(model: nn.Module) -> int:
    """Parameters of ``model`` that one token does not use (0 for a dense model)."""
    hooks: list[Any] = [getattr(m, "inactive_params", None) for m in model.modules()]
    return sum(int(fn()) for fn in hooks if callable(fn))


def stats_of(module: nn.Module) -> dict[str, Any] | None:
    """A routed module's statistics of its last forward, or None."""
    fn = getattr(module, "routing_stats", None)
    return fn() if callable(fn) else None
