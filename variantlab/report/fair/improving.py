"""Convergence in the tuned comparison: whether the runs behind each verdict had stopped
improving.

``tuned.csv`` counts, per compared variant and condition, the seeds of the chosen setting
that were still improving at the end of training (``still_improving`` out of
``seeds_judged``, :func:`.tuned.improving`; the report's judgement, :mod:`..converged`).
A verdict between runs still improving compares two points on curves that had not
flattened: it may change with more steps. So the reading names, in one sentence, the
groups that some verdict is about (the best of a condition and the variant it is compared
with, both sides of a ranking that depends on the learning rate, the leaders of another
metric; collected by the sentences that make them) and that were still improving on at
least one seed, and those whose seeds have no ``still_improving`` row (unknown, not
stopped). docs/fair-comparisons.md#still-improving.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ...config.metrics import finite as _finite
from .tuned import Sweep

MAX_NAMED = 4  # groups named in the sentence, then "and N more"
DOC = "docs/fair-comparisons.md#still-improving"


def improving_cell(record: Mapping[str, Any], seeds: int) -> str:
    """The tuned table's ``still improving`` cell of one row: ``k/m`` (seeds still
    improving of those judged), the seeds of ``seeds`` without a judgement added as
    unknown; ``—`` when none was judged (or no setting was chosen)."""
    known = record.get("seeds_judged")
    if not _finite(known) or not known:
        return "—"
    cell = f"{int(record['still_improving'])}/{int(known)}"
    return cell + (f" ({seeds - int(known)} unknown)" if seeds > known else "")


def _listed(items: list[str]) -> str:
    more = len(items) - MAX_NAMED
    return "; ".join(items[:MAX_NAMED]) + (f"; and {more} more" if more > 0 else "")


def improving_lines(sweep: Sweep, frame: pd.DataFrame, named: set[str]) -> list[str]:
    """One reading sentence over the groups in ``named`` (those a verdict is about), in
    sweep order: those still improving on some seed of their chosen setting, and those
    with seeds not judged; nothing when every one had stopped improving."""
    seeds = int(sweep.per_seed["seed"].nunique())
    still, unknown = [], []
    for group, r in zip(sweep.archs, frame.to_dict("records")):
        known = r.get("seeds_judged")
        if group not in named or not _finite(known):
            continue
        k = r.get("still_improving")
        if _finite(k) and k > 0:
            still.append(f"{group}: {int(k)} of {int(known)} seeds")
        if known < seeds:
            unknown.append(f"{group}: {seeds - int(known)} of {seeds} seeds")
    if unknown and not (frame["seeds_judged"] > 0).any():
        return ["This run recorded no still_improving rows: whether the runs behind the "
                "verdicts had stopped improving is unknown."]
    parts = []
    if still:
        parts.append("Still improving at the end of training (seeds of the chosen setting): "
                     f"{_listed(still)}; verdicts involving them may change with more steps "
                     f"({DOC}).")
    if unknown:
        parts.append(f"Not known whether still improving (no still_improving row): "
                     f"{_listed(unknown)}; verdicts involving them may rest on runs that had "
                     "not converged.")
    return [" ".join(parts)] if parts else []


__all__ = ["MAX_NAMED", "improving_cell", "improving_lines"]
