"""Metrics: which way each one is better, and the headline metric a comparison is made on.

Every metric the lab compares has a *direction*: ``lower`` (losses, times, steps) or
``higher`` (accuracies) is better. The built-in ones are named in :data:`DIRECTIONS`
(plus the rules that a name ending in ``_s`` or ``_ms`` is a time, lower is better, and
that ``M_at_N``, metric M at N tokens per window, goes M's way); a
plugin probe declares its own with ``register(..., metrics={"my_score": "higher"})``.

An experiment's ``compare_on`` (default ``loss``) names its *headline metric* ``M``: the
number the comparison is about. Tuned axes are chosen on its validation value ``val_M``
and reported on its test value ``test_M``, respecting its direction
(docs/fair-comparisons.md). A store written before a held-out column existed falls back
to older columns (:data:`FALLBACKS`), and the report says the numbers are then optimistic
when the same column chose and reports.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Direction = Literal["lower", "higher"]
LOWER: Direction = "lower"
HIGHER: Direction = "higher"
DEFAULT_COMPARE_ON = "loss"
#: the probe whose rows hold the built-in headline metrics
TRAINING = "training"

#: built-in metric -> the direction in which it is better
DIRECTIONS: dict[str, Direction] = {
    "loss": LOWER, "val_loss": LOWER, "test_loss": LOWER, "eval_loss": LOWER,
    "final_loss": LOWER, "best_loss": LOWER,
    "recall_accuracy": HIGHER, "val_recall_accuracy": HIGHER, "test_recall_accuracy": HIGHER,
    "steps_to_solve": LOWER, "time": LOWER,
}
#: built-in headline metrics (a ``compare_on`` value) and what each needs to be recorded
HEADLINES: dict[str, str] = {
    "loss": "any training run",
    "recall_accuracy": "the recall task (data: {source: synthetic, task: recall})",
}
#: headline -> (choose columns after val_M, report columns after test_M): what a store
#: written before the held-out column has instead (the first present is used)
FALLBACKS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "loss": (("eval_loss", "final_loss"), ("eval_loss", "final_loss")),
    "recall_accuracy": ((), ("recall_accuracy",)),
}
TIME_SUFFIXES = ("_s", "_ms")
#: ``M_at_N``: metric M scored at N tokens per window (the training probe's
#: ``eval_lengths``), better the way M is
AT_LENGTH = re.compile(r"(.+)_at_\d+")
#: headline -> the best value it can take (an accuracy cannot beat 1): a choice there is
#: not unresolved at an edge of the sweep, since no value beyond it can do better
CEILINGS: dict[str, float] = {"recall_accuracy": 1.0}


def finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (NaN, inf, None and text are not)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


def declared(registry: Any = None) -> dict[str, tuple[Direction, str]]:
    """Metric -> (direction, probe) that the registry's probes declare (plugin probes'
    ``metrics=``); empty without a registry."""
    out: dict[str, tuple[Direction, str]] = {}
    if registry is None:
        return out
    for probe in registry.probes():
        for name, direction in getattr(probe, "metrics", ()):
            out[name] = (direction, probe.name)
    return out


def direction(metric: str, registry: Any = None) -> Direction | None:
    """Whether ``metric`` is better ``lower`` or ``higher`` (None: it has no direction,
    e.g. a parameter count or a gradient norm)."""
    if metric in DIRECTIONS:
        return DIRECTIONS[metric]
    mine = declared(registry).get(metric)
    if mine is not None:
        return mine[0]
    if metric.endswith(TIME_SUFFIXES):
        return LOWER
    for prefix in ("val_", "test_"):
        if metric.startswith(prefix):
            return direction(metric[len(prefix):], registry)
    at_length = AT_LENGTH.fullmatch(metric)  # test_loss_at_256: test_loss's direction
    if at_length:
        return direction(at_length.group(1), registry)
    return None


def compare_choices(registry: Any = None) -> list[str]:
    """Every metric ``compare_on`` may name: the built-in headlines, then each metric a
    registered probe declares."""
    return list(dict.fromkeys([*HEADLINES, *declared(registry)]))


def compare_on_problem(name: Any, registry: Any = None) -> str | None:
    """Why ``compare_on: name`` names no headline metric (None: it does)."""
    choices = compare_choices(registry)
    if isinstance(name, str) and name in choices:
        return None
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"{name!r} is not a metric a comparison can be made on; {hint}"
            f"use one of: {', '.join(choices)} (a plugin probe adds its own with "
            "register(..., metrics={name: 'higher' or 'lower'}))")


@dataclass(frozen=True)
class Headline:
    """The metric a comparison is made on: chosen on ``choose`` (validation), reported on
    ``report`` (test), the first of each present in the rows of ``probe``."""

    name: str
    direction: Direction
    probe: str
    choose: tuple[str, ...]
    report: tuple[str, ...]

    @property
    def lower_is_better(self) -> bool:
        return self.direction == LOWER

    def at_best_possible(self, value: float) -> bool:
        """Whether ``value`` is the best this metric can take (:data:`CEILINGS`)."""
        bound = CEILINGS.get(self.name)
        return bound is not None and finite(value) and (
            value <= bound if self.lower_is_better else value >= bound)

    @property
    def val(self) -> str:
        return self.choose[0]

    @property
    def test(self) -> str:
        return self.report[0]

    def columns(self, present: Iterable[str]) -> tuple[str | None, str | None]:
        """``(choose, report)``: the first validation and test column among ``present``
        (None where none is)."""
        have = set(present)
        return (next((m for m in self.choose if m in have), None),
                next((m for m in self.report if m in have), None))

    def key(self, value: float) -> float:
        """A sort key where smaller is better; a missing or non-finite value is worst."""
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            return math.inf
        return float(value) if self.lower_is_better else -float(value)

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly better than ``b``."""
        return self.key(a) < self.key(b)


def headline(name: str | None = None, registry: Any = None) -> Headline:
    """The headline metric ``name`` (default: loss); ValueError for one
    :func:`compare_on_problem` refuses."""
    name = name or DEFAULT_COMPARE_ON
    mine = declared(registry)
    if name in HEADLINES:
        extra_choose, extra_report = FALLBACKS.get(name, ((), ()))
        return Headline(name, DIRECTIONS[name], TRAINING, (f"val_{name}", *extra_choose),
                        (f"test_{name}", *extra_report))
    if name in mine:
        dirn, probe = mine[name]
        return Headline(name, dirn, probe, (f"val_{name}",), (f"test_{name}",))
    raise ValueError(compare_on_problem(name, registry))


def headline_of(meta: Any, registry: Any = None) -> Headline:
    """The headline metric of a stored run (its meta's ``compare_on``; loss for a store
    written before the key existed, or naming a metric no probe here declares)."""
    name = getattr(meta, "compare_on", "") or DEFAULT_COMPARE_ON
    try:
        return headline(name, registry)
    except ValueError:
        return headline(DEFAULT_COMPARE_ON)


def compare_on_checks(spec: Any, measure: Any, registry: Any, variants: Sequence[Any]
                      ) -> list[tuple[tuple, str, str]]:
    """``(YAML location, message, at)`` when an experiment's ``compare_on`` names no
    headline metric, or one that no probe running here records, or an
    ``equivalence_margin`` key names no headline metric."""
    choices = compare_choices(registry)
    margins = [(("equivalence_margin", key), f"equivalence_margin: {key!r} is not a headline "
                f"metric; use one of {', '.join(choices)}", "auto")
               for key in getattr(spec, "equivalence_margin", {}) or {} if key not in choices]
    return margins + _compare_on_checks(spec, measure, registry, variants)


def _compare_on_checks(spec: Any, measure: Any, registry: Any, variants: Sequence[Any]
                       ) -> list[tuple[tuple, str, str]]:
    name = spec.compare_on
    problem = compare_on_problem(name, registry)
    if problem is not None:
        return [(("compare_on",), problem, "auto")]
    if name == DEFAULT_COMPARE_ON:
        return []
    probe = headline(name, registry).probe
    if probe not in measure:
        return [(("compare_on",), f"compare_on: {name} is recorded by probe {probe!r}, which "
                 f"does not run here; add it under measure: (measure: {{{probe}: {{}}}})",
                 "auto")]
    datas = [spec.data, *(v.data_or(spec.data) for v in variants)]
    if name == "recall_accuracy" and not any(getattr(d, "task", None) == "recall" for d in datas):
        return [(("compare_on",), f"compare_on: recall_accuracy needs "
                 f"{HEADLINES['recall_accuracy']}; this experiment's data has none", "auto")]
    return []


__all__ = ["DEFAULT_COMPARE_ON", "DIRECTIONS", "finite", "HIGHER", "LOWER", "Direction", "Headline",
           "compare_choices", "compare_on_checks", "compare_on_problem",
           "declared", "direction", "headline", "headline_of"]
