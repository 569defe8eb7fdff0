"""Verdicts per condition, and the axes with their roles.

Variants are compared only within one condition (:mod:`variantlab.config.roles`).
``effects_by_condition.csv`` generalises ``effects_by_size.csv`` to every condition axis:
each compared axis value's effect against its baseline value in each condition, on the
headline metric's test value with every compared variant at its own best tuned setting,
paired per seed (t-interval over seeds), and whether its sign holds across conditions
(``holds``, ``flips``, ``unclear`` for an effect of exactly 0, ``one condition``). A group
whose best sits at an edge of the sweep (unresolved) gives no effect in its condition.
The **Axes** table lists every axis of a run with a grid: its role, its values and what
edge extension added.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ...config.roles import stored_roles
from ..frame import ReportData
from ..labels import GridLabels
from ..tables import Table, fmt
from .scaling import by_size_table, effects_by_size
from .tuned import Sweep, at_edge, choose

MAX_CONDITIONS = 12  # conditions listed with their number in one sentence


def effects_by_condition(sweep: Sweep) -> pd.DataFrame | None:
    """effects_by_condition.csv (module docstring); None without condition axes or
    compared axes."""
    compared = [a for a in sweep.arch_axes if a in sweep.cells.columns]
    if not sweep.condition_axes or not compared:
        return None
    records = []
    for group in sweep.archs:
        chosen = choose(sweep, group)
        if chosen is None or at_edge(sweep, chosen):
            continue
        mine = sweep.per_seed[sweep.per_seed["variant"] == chosen["variant"]]
        cell = sweep.cells[sweep.cells["variant"] == chosen["variant"]].iloc[0]
        records += [{"seed": seed, "condition": sweep.sizes.get(group, ""), "value": value,
                     **{a: cell[a] for a in compared}}
                    for seed, value in zip(mine["seed"], mine["test"])]
    base = sweep.cells[sweep.cells["compared"] == sweep.baseline]
    if not records or not len(base):
        return None
    baseline = {a: str(base[a].iloc[0]) for a in compared}
    frame = effects_by_size(pd.DataFrame(records), compared, baseline, sweep.reported_on,
                            over="condition")
    return frame


def condition_values(sweep: Sweep, frame: pd.DataFrame) -> list[str]:
    """When nothing is compared (one compared variant: every axis a condition, a pilot),
    the headline metric's test value per condition, with its 95% interval over seeds; no
    ranking. Empty when two or more variants are compared."""
    if len(set(sweep.compared.values())) > 1 or not sweep.condition_axes:
        return []
    test = sweep.metric_columns[1]
    said = []
    for group, rec in zip(sweep.archs, frame.to_dict("records")):
        value = rec.get(test, float("nan"))
        if not isinstance(value, (int, float)) or value != value:
            said.append(f"{sweep.sizes.get(group, '')}: —")
            continue
        low, high = rec.get("low", float("nan")), rec.get("high", float("nan"))
        spread = (f" [{fmt(low)}, {fmt(high)}]" if low == low and high == high else
                  " (one seed)" if rec.get("n") == 1 else "")
        said.append(f"{sweep.sizes.get(group, '')}: {fmt(value)}{spread}")
    more = (f"; and {len(said) - MAX_CONDITIONS} more (see the tables)"
            if len(said) > MAX_CONDITIONS else "")
    best = " at its best setting" if sweep.setting_axes else ""
    return [f"Nothing is compared here: every axis is a condition (the task or scale), so "
            f"no variant is ranked. {sweep.reported_on}{best} per condition: "
            + "; ".join(said[:MAX_CONDITIONS]) + more + "."]


def condition_table(frame: pd.DataFrame) -> Table:
    return by_size_table(frame, over="condition")


def axes_table(data: ReportData) -> Table | None:
    """Every axis of the first run with a grid: its role, the values its grid lists, and
    the values edge extension added (None: no run has a grid; named variants alone are
    compared variant by variant)."""
    for meta in data.runs:
        if not meta.grid:
            continue
        mine = data.variants[data.variants["run"] == meta.run]
        overs = [dict(o) for o in mine["overrides"] if isinstance(o, Mapping)]
        roles = stored_roles(meta, overs)
        grid, labels = meta.grid or {}, GridLabels.of(meta)
        body = []
        for axis, role in roles.items():
            listed = [labels.text(axis, v) for v in grid.get(axis, [])]
            seen = list(dict.fromkeys(labels.text(axis, o[axis]) for o in overs if axis in o))
            extra = [v for v in seen if listed and v not in listed]
            body.append([axis, role, ", ".join(listed or seen), ", ".join(extra)])
        note = ("compared: the variants the question is about; tuned: each compared variant "
                "at its own best value (chosen on validation); condition: the task or scale, "
                "variants are compared only within one. Added: values beyond the grid that "
                "edge extension ran. See docs/fair-comparisons.md.")
        return Table("Axes", ["axis", "role", "values", "added"], body, note)
    return None
