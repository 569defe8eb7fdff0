"""The report's statistics over seeds: intervals, paired tests, Holm, equivalence, power.

The seed is the unit of replication: every comparison is a set of paired differences, one
per seed (two variants' runs on the same seed share its initialisation and its batches).
Student's t comes from :mod:`scipy.special` (``stdtr``, ``stdtrit``: the functions
``scipy.stats.t`` itself calls, without its import time); nothing here is tabulated.

- :func:`interval`: mean and a two-sided t-interval (95% unless ``level`` says otherwise);
- :func:`p_value`: the two-sided paired t-test of a mean difference of 0 (differences that
  all agree: p = 1 when they are all 0, else 0);
- :func:`holm`: Holm's step-down adjustment, which keeps the family-wise error of a set of
  tests (all pairs of one condition) at the level of one;
- :func:`equivalent`: two one-sided tests (TOST) at 5% each, i.e. the 90% interval lies
  inside ``[-delta, +delta]``;
- :func:`detectable`: the smallest true difference a paired t-test at 5% finds with 80%
  power over ``n`` seeds with seed spread ``sd``, by the usual formula
  ``(t(0.975, n-1) + t(0.80, n-1)) * sd / sqrt(n)``;
- :func:`seeds_for`: the fewest seeds for which that difference is at most ``delta``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

ALPHA = 0.05  # each condition's family-wise error (Holm) and the TOST's one-sided level
POWER = 0.80
MAX_SEEDS = 1000  # seeds_for gives up beyond this many


def _special() -> Any:
    """:mod:`scipy.special`, imported on the first t this process takes (0.3 s that the
    tuned-sweep chooser of ``variantlab run`` does not need to spend before its first unit;
    ``scipy.stats`` would cost 1.2 s more, for the same t)."""
    from scipy import special

    return special


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile ``q`` with ``df`` degrees of freedom (NaN below 1)."""
    return float(_special().stdtrit(df, q)) if df >= 1 else math.nan


def _finite(diffs: pd.Series | Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite values of ``diffs`` as floats, in order (a report takes thousands of
    intervals on a large grid: numpy, not a Series per call; the mean and standard
    deviation of what is left have pandas' bits, as pandas sums with numpy)."""
    d = np.asarray(diffs, dtype=float).ravel()
    return d[np.isfinite(d)]


def pandas_mean(values: pd.Series | Sequence[float] | np.ndarray) -> float:
    """``Series.mean()`` of ``values`` (NaN skipped, as pandas does: zeros in their place,
    divided by the count left), without building a Series: the same bits."""
    v = np.array(values, dtype=float).ravel()
    missing = np.isnan(v)
    n = int(v.size - missing.sum())
    if n == 0:
        return math.nan
    v[missing] = 0.0
    return float(v.sum() / n)


def pandas_std(values: pd.Series | Sequence[float] | np.ndarray) -> float:
    """``Series.std(ddof=1)`` of ``values`` (NaN skipped, as pandas does: zeros in their
    place, divided by the count left), without building a Series: the same bits."""
    v = np.array(values, dtype=float).ravel()
    missing = np.isnan(v)
    n = int(v.size - missing.sum())
    if n < 2:
        return math.nan
    v[missing] = 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # an infinity gives NaN, quietly
        square = (v.sum() / n - v) ** 2
        square[missing] = 0.0
        return float(np.sqrt(square.sum() / (n - 1)))


#: A mean under this fraction of its interval's half-width is written as 0 (:func:`interval`)
NOISE = 1e-9


def interval(diffs: pd.Series | Sequence[float], level: float = 0.95
             ) -> tuple[float, float, float, int]:
    """Mean, low, high (two-sided t-interval at ``level``) and n of ``diffs``; one value:
    NaN bounds; none: all NaN and n = 0. A mean under :data:`NOISE` of the interval's
    half-width is 0: float rounding, not a direction (pandas' bits otherwise)."""
    d = _finite(diffs)
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(d.mean())
    if n == 1:
        return mean, math.nan, math.nan, 1
    half = t_quantile(0.5 + level / 2, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    if abs(mean) < NOISE * half:
        # differences that cancel leave a float residue (recall accuracies of k/N, whose
        # roundings differ with k, give -3.7e-17 for +1/N, -1/N and 0): no sign, no digits
        mean = 0.0
    return mean, mean - half, mean + half, n


def p_value(diffs: pd.Series | Sequence[float]) -> float:
    """Two-sided p of a paired t-test that the mean difference is 0 (NaN under 2 values)."""
    d = _finite(diffs)
    n = len(d)
    if n < 2:
        return math.nan
    sd = float(d.std(ddof=1))
    mean = float(d.mean())
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    t = mean / (sd / math.sqrt(n))
    return float(2 * _special().stdtr(n - 1, -abs(t)))  # the upper tail, t.sf


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given (NaN stays NaN and is not counted):
    the k-th smallest of m is multiplied by ``m - k + 1``, then made non-decreasing."""
    known = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(known)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for k, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


def equivalent(low90: float, high90: float, delta: float) -> bool:
    """TOST: whether the 90% interval lies inside ``(-delta, +delta)``."""
    return (math.isfinite(low90) and math.isfinite(high90) and delta > 0
            and -delta < low90 and high90 < delta)


def detectable(sd: float, n: int) -> float:
    """The smallest difference a two-sided paired t-test at ALPHA detects with POWER over
    ``n`` seeds whose paired differences spread ``sd`` (NaN under 2 seeds)."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return (t_quantile(1 - ALPHA / 2, n - 1) + t_quantile(POWER, n - 1)) * sd / math.sqrt(n)


def seeds_for(sd: float, delta: float) -> float:
    """The fewest seeds (at least 2) whose :func:`detectable` difference is at most
    ``delta``; NaN when unknown (no spread measured, no margin) or beyond MAX_SEEDS."""
    if not (math.isfinite(sd) and delta > 0):
        return math.nan
    if not detectable(sd, MAX_SEEDS) <= delta:
        return math.nan
    low, high = 2, MAX_SEEDS  # detectable falls as n grows: bisect for the first n that does
    while low < high:
        mid = (low + high) // 2
        if detectable(sd, mid) <= delta:
            high = mid
        else:
            low = mid + 1
    return float(low)


__all__ = ["ALPHA", "POWER", "detectable", "equivalent", "holm", "interval", "p_value",
           "pandas_mean", "pandas_std", "seeds_for", "t_quantile"]
