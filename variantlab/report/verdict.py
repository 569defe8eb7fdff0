"""Verdict words only where the numbers carry them.

"best", "beats", "loses", "better" and "worse" say that one variant is ahead of another on a
metric. The report says so only when the paired difference over seeds has a 95% t-interval
that excludes 0 (:func:`variantlab.report.effects.interval`; each seed pairs the two
variants' runs on the same data). Otherwise the two are *not clearly different*, and the
numbers are printed with enough digits to show what difference there is
(:func:`variantlab.report.tables.apart`). With one seed there is no interval, so no verdict:
the report gives the numbers and says why it names no winner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from .effects import clear, interval
from .tables import apart, fmt


@dataclass(frozen=True)
class Lead:
    """The leader on a metric and the runner-up, with the leader's paired margin over it
    (positive: ahead) and its 95% interval over ``n`` seeds (NaN bounds: one seed)."""

    first: str
    second: str
    first_mean: float
    second_mean: float
    margin: float
    low: float
    high: float
    n: int

    @property
    def clear(self) -> bool:
        """Whether the margin's interval excludes 0."""
        return clear(self.low, self.high)


def margin(values: pd.DataFrame, a: str, b: str, lower: bool) -> tuple[float, float, float, int]:
    """How far ``a`` is ahead of ``b``, seed by seed (``values``: variant, seed, value; a
    positive difference means ``a`` is better): mean, 95% interval and seeds paired."""
    table = values.pivot_table(index="seed", columns="variant", values="value", aggfunc="mean")
    if a not in table or b not in table:
        return math.nan, math.nan, math.nan, 0
    diff = (table[b] - table[a]) if lower else (table[a] - table[b])
    return interval(diff[diff.map(math.isfinite)])


def lead(values: pd.DataFrame, lower: bool) -> Lead | None:
    """The best two variants by mean over seeds of ``values`` (variant, seed, value) and how
    sure the first's lead is (None with fewer than two variants)."""
    if not len(values):
        return None
    finite = values[pd.to_numeric(values["value"], errors="coerce").map(math.isfinite)]
    means = finite.groupby("variant", sort=False)["value"].mean()
    if len(means) < 2:
        return None
    ranked = means.sort_values(ascending=lower, kind="stable")
    first, second = str(ranked.index[0]), str(ranked.index[1])
    mean, low, high, n = margin(finite, first, second, lower)
    return Lead(first, second, float(ranked.iloc[0]), float(ranked.iloc[1]), mean, low, high, n)


def lead_sentence(label: str, found: Lead, unit: str = "") -> str:
    """``Best variant by <label>: ...`` when the lead is clear; else that the first two are
    not clearly different (or, with one seed, that there is no verdict)."""
    a, b = apart(found.first_mean, found.second_mean, unit)
    if found.clear:
        return (f"Best variant by {label}: {found.first} ({a}), ahead of {found.second} "
                f"({b}) by {fmt(found.margin)} [{fmt(found.low)}, {fmt(found.high)}] over "
                f"{found.n} seeds")
    label = label[:1].upper() + label[1:]
    if found.n < 2:
        return (f"{label}: {found.first} {a}, {found.second} {b} (one seed: no interval, so "
                "no verdict)")
    return (f"{label}: {found.first} ({a}) and {found.second} ({b}) are not clearly different "
            f"(paired difference {fmt(found.margin)}, 95% interval [{fmt(found.low)}, "
            f"{fmt(found.high)}] over {found.n} seeds includes 0)")


__all__ = ["Lead", "lead", "lead_sentence", "margin"]
