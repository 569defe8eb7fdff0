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
from ..headline import column_label, has_conditions, headlines, is_tuning, seed_values
from ..learned import nothing_learned
from ..tables import apart, fmt
from ..verdict import margin
from .tuned import Sweep, choose

MIN_COMPARED = 3  # compared variants in a condition before this sentence adds anything


def group_values(sweep: Sweep, group: str, column: str = "test", lr: float | None = None
                 ) -> pd.DataFrame:
    """``variant`` (= ``group``), ``seed``, ``value``: ``column`` (``test``: the reported
    metric, ``val``: the choice metric) per seed at the group's chosen setting, or at
    learning rate ``lr`` with its other settings as chosen."""
    chosen = choose(sweep, group)
    mine = sweep.per_seed[sweep.per_seed["arch"] == group]
    if chosen is None:
        mine = mine.iloc[0:0]
    elif lr is None:
        mine = mine[mine["variant"] == chosen["variant"]]
    else:
        for axis in sweep.setting_axes:
            mine = mine[mine[axis] == (lr if axis == sweep.lr_axis else chosen[axis])]
    return pd.DataFrame({"variant": group, "seed": mine["seed"], "value": mine[column]})


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
        elif low > 0:
            out.append(f"{variant} is better ({x} vs {y}; ahead by {fmt(ahead)} "
                       f"[{fmt(low)}, {fmt(high)}] over {n} seeds)")
        elif high < 0:
            out.append(f"{variant} is worse ({x} vs {y}; behind by {fmt(-ahead)} "
                       f"[{fmt(-high)}, {fmt(-low)}] over {n} seeds)")
        else:  # the difference as measured, the variant's value minus the baseline's
            diff, lo, hi = (-ahead, -high, -low) if lower else (ahead, low, high)
            out.append(f"{variant} is not clearly different ({x} vs {y}; paired difference "
                       f"{fmt(diff)}, 95% interval [{fmt(lo)}, {fmt(hi)}] over {n} seeds "
                       "includes 0)")
    return out


def condition_gaps(sweep: Sweep) -> str | None:
    """The sentence for a run with conditions and no tuned axis (module docstring): per
    condition of three or more compared variants, the best and the worst against that
    condition's baseline; None where no condition has three."""
    said = []
    for cond in dict.fromkeys(sweep.sizes.get(g, "") for g in sweep.archs):
        groups = sweep.groups_of(cond)
        if len(groups) < MIN_COMPARED:
            continue
        values = pd.concat([group_values(sweep, g) for g in groups])
        names = {g: sweep.compared.get(g, g) for g in groups}
        parts = gap_parts(values.assign(variant=values["variant"].map(names)),
                          sweep.baseline, sweep.head.lower_is_better)
        if parts:
            said.append(f"{cond}: " + "; ".join(parts))
    if not said:
        return None
    return (f"By {column_label(sweep.reported_on)}, against the baseline {sweep.baseline} of "
            "each condition: " + "; ".join(said) + ".")


def baseline_gaps(data: ReportData, probe: str, registry: Any = None) -> str | None:
    """The sentence for a run without tuned or condition axes (module docstring): the best
    and the worst variant against the baseline; None where it would add nothing (a run
    with tuned or condition axes says it in its fair comparison, :mod:`.compare`)."""
    if nothing_learned(data) or is_tuning(data) or has_conditions(data):
        return None
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


__all__ = ["baseline_gaps", "condition_gaps", "gap_parts", "group_values"]
