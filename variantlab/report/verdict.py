"""The leader on a metric, as a claims row.

"Best variant by" and "leads" say that one variant is ahead of another on a metric. The
leader and the runner-up by mean are compared on their paired per-seed difference (each
seed pairs the two variants' runs on the same data), a ``lead`` row of the claims
(:func:`.claims.measured_row`); :func:`.words.lead_phrase` says "Best variant by" only when
that row's verdict puts the leader ahead (its 95% t-interval excludes 0). Otherwise the two
are *not clearly different*, and the numbers are printed with enough digits to show what
difference there is (:func:`variantlab.report.tables.apart`). With one seed there is no
interval, so no verdict: the report gives the numbers and says why it names no winner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .claims import measured_row, verdict_of


@dataclass(frozen=True)
class Lead:
    """The leader on a metric and the runner-up, with the leader's paired margin over it
    (positive: ahead) and its 95% interval over ``n`` seeds (NaN bounds: one seed), and
    the comparison's claims ``row`` (``kind`` ``lead``: ``first`` minus ``second``)."""

    first: str
    second: str
    first_mean: float
    second_mean: float
    margin: float
    low: float
    high: float
    n: int
    row: dict[str, Any] = field(default_factory=dict, compare=False)
    better: str = "lower"  # the row's verdict that puts ``first`` ahead

    @property
    def clear(self) -> bool:
        """Whether the row's verdict puts ``first`` ahead (its interval excludes 0)."""
        return self.row.get("verdict") == self.better


def lead(values: pd.DataFrame, lower: bool, metric: str = "") -> Lead | None:
    """The best two variants by mean over seeds of ``values`` (variant, seed, value) and how
    sure the first's lead is, from its claims row (:func:`.claims.measured_row` on the
    paired per-seed differences; None with fewer than two variants)."""
    if not len(values):
        return None
    finite = values[pd.to_numeric(values["value"], errors="coerce").map(math.isfinite)]
    means = finite.groupby("variant", sort=False)["value"].mean()
    if len(means) < 2:
        return None
    ranked = means.sort_values(ascending=lower, kind="stable")
    first, second = str(ranked.index[0]), str(ranked.index[1])
    table = finite.pivot_table(index="seed", columns="variant", values="value", aggfunc="mean")
    diff = table[first] - table[second]
    row = measured_row("", first, second, metric, "lead", diff[diff.map(math.isfinite)])
    row["verdict"] = verdict_of(row)
    row.update({"a_mean": float(ranked.iloc[0]), "b_mean": float(ranked.iloc[1])})
    sign = -1.0 if lower else 1.0  # ahead: lower values when lower is better
    low, high = sorted((sign * row["low"], sign * row["high"]))
    return Lead(first, second, float(ranked.iloc[0]), float(ranked.iloc[1]),
                sign * row["estimate"], low, high, row["n_seeds"], row,
                "lower" if lower else "higher")


__all__ = ["Lead", "lead"]
