"""The noise of a loss curve, measured from the curve itself (the divergence flag of
:mod:`variantlab.probes.training` and ``still_improving`` of :mod:`variantlab.probes.heldout`
judge a change against it)."""

from __future__ import annotations

import math


def step_noise(losses: list[float]) -> float:
    """Standard deviation of one step's loss around the curve, from the step-to-step
    differences (their interquartile range, so that a trend or a few jumps do not inflate
    it); 0 with fewer than two differences."""
    diffs = sorted(b - a for a, b in zip(losses, losses[1:]))
    if len(diffs) < 2:
        return 0.0
    iqr = _quantile(diffs, 0.75) - _quantile(diffs, 0.25)
    # a normal's IQR is 1.349 sigma; a difference of two steps has sqrt(2) x one's noise
    return iqr / 1.349 / math.sqrt(2)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


__all__ = ["step_noise"]
