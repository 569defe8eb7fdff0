"""Each variant against the baseline, on the headline metric, within one condition.

The reading's per-variant sentence: on the headline metric's test value (``compare_on``,
:mod:`variantlab.config.metrics`), the best and the worst compared variant against the
baseline compared variant *of the same condition* (:mod:`variantlab.config.roles`), each
pair judged by the paired 95% t-interval over seeds (:mod:`..verdict`): "better" or
"worse" only when it excludes 0, else "not clearly different", and with one seed the
numbers alone. A run whose conditions hold two compared variants or fewer says nothing
here: the leader sentence (:mod:`..headline`, :func:`.compare.verdict_lines`) already
names the pair. A tuned run says nothing here either: its variants are compared at their
own best setting (:mod:`.tuned`), never as they ran.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..frame import ReportData
from ..headline import column_label, headlines, seed_values
from ..learned import nothing_learned
from ..tables import apart, fmt
from ..verdict import margin
from .compare import group_values
from .tuned import find_sweep

MIN_COMPARED = 3  # compared variants in a condition before this sentence adds anything


def gap_parts(values: pd.DataFrame, base: str, lower: bool) -> list[str]:
    """The best and the worst variant of ``values`` (variant, seed, value) other than
    ``base``, each against ``base``: better or worse with the paired interval when it
    excludes 0, else not clearly different; one seed: the numbers only."""
    means = values.groupby("variant", sort=False)["value"].mean().dropna()
    if base not in means or len(means) < 2:
        return []
    others = means.drop(index=base).sort_values(ascending=lower, kind="stable")
    out = []
    for variant in dict.fromkeys([others.index[0], others.index[-1]]):
        ahead, low, high, n = margin(values, str(variant), base, lower)
        x, y = apart(float(means[variant]), float(means[base]))
        if n < 2:
            out.append(f"{variant} {x} vs {y} (one seed: no verdict)")
        elif low > 0 or high < 0:
            word = "better" if ahead > 0 else "worse"
            out.append(f"{variant} is {word} ({x} vs {y}; ahead by {fmt(ahead)} "
                       f"[{fmt(low)}, {fmt(high)}] over {n} seeds)")
        else:
            out.append(f"{variant} is not clearly different ({x} vs {y}; ahead by "
                       f"{fmt(ahead)}, 95% interval [{fmt(low)}, {fmt(high)}] over {n} seeds "
                       "includes 0)")
    return out


def baseline_gaps(data: ReportData, probe: str, registry: Any = None) -> str | None:
    """The per-variant sentence (module docstring); None where it would add nothing."""
    if nothing_learned(data) or find_sweep(data, probe) is not None:
        return None
    sweep = find_sweep(data, probe, untuned=True)
    if sweep is not None:
        said = []
        for cond in dict.fromkeys(sweep.sizes.get(g, "") for g in sweep.archs):
            groups = sweep.groups_of(cond)
            if len(groups) < MIN_COMPARED:
                continue
            values = pd.concat([group_values(sweep, g) for g in groups])
            names = {g: sweep.compared.get(g, g) for g in groups}
            values = values.assign(variant=values["variant"].map(names))
            parts = gap_parts(values, sweep.baseline, sweep.head.lower_is_better)
            if parts:
                said.append(f"{cond}: " + "; ".join(parts))
        if not said:
            return None
        return (f"By {column_label(sweep.reported_on)}, against the baseline "
                f"{sweep.baseline} of each condition: " + "; ".join(said) + ".")
    found = headlines(data, registry if registry is not None else data.registry)
    if not found:
        return None
    head, column = found[0]
    values = seed_values(data.rows, head.probe, column)
    if values["variant"].nunique() < MIN_COMPARED:
        return None
    parts = gap_parts(values, data.baseline, head.lower_is_better)
    if not parts:
        return None
    return (f"By {column_label(column)}, against {data.baseline} (the baseline): "
            + "; ".join(parts) + ".")


__all__ = ["baseline_gaps", "gap_parts"]
