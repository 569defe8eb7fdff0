"""The reading leads with the experiment's headline metric and says where others disagree.

An experiment compares on its headline metric (``compare_on``, default loss;
:mod:`variantlab.config.metrics`), read on its test column (``test_loss``,
``test_recall_accuracy``; older stores: the first fallback present). The reading names the
leader on it under the verdict rule (:mod:`.verdict`), then, for each other headline-able
metric the run recorded (loss, recall accuracy, a plugin probe's declared metrics), the
variant that leads on it instead, when that lead is clear ("by test loss, B leads
instead"). Nothing is named when no variant learned anything (:mod:`.learned`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from ..config.metrics import Headline, compare_choices, headline, headline_of
from ..config.roles import CONDITION, stored_roles
from ..store.store import axis_default
from .frame import ReportData
from .labels import GridLabels
from .learned import nothing_learned
from .verdict import Lead, lead
from .words import disagreement_phrase, lead_phrase


def column_label(column: str) -> str:
    """How the reading names a held-out column (``test recall accuracy``)."""
    if column == "recall_accuracy":  # the test split's, under its older name
        return "test recall accuracy"
    if column == "eval_loss":
        return "validation loss"
    if column == "final_loss":
        return "final training loss"
    return column.replace("val_", "validation ", 1).replace("_", " ")


def seed_values(rows: pd.DataFrame, probe: str, column: str,
                variants: Sequence[str] | None = None) -> pd.DataFrame:
    """``variant, seed, value`` of ``probe``'s model-scope ``column`` (``variants``: only
    those)."""
    part = rows[(rows["probe"] == probe) & (rows["metric"] == column)
                & (rows["scope"] == "model") & rows["step"].isna()]
    if variants is not None:
        part = part[part["variant"].isin(list(variants))]
    return part[["variant", "seed", "value"]]


def headlines(data: ReportData, registry: Any = None) -> list[tuple[Headline, str]]:
    """The run's headline metric and its test column, then every other headline-able
    metric the rows have, each with its column (the first of its report columns present)."""
    main = headline_of(data.runs[0], registry) if data.runs else headline(None, registry)
    out: list[tuple[Headline, str]] = []
    present = set(data.rows["metric"]) if len(data.rows) else set()
    for name in dict.fromkeys([main.name, *compare_choices(registry)]):
        try:
            head = headline(name, registry)
        except ValueError:
            continue
        column = next((c for c in head.report if c in present), None)
        if column is not None:
            out.append((head, column))
    return out


def leads(data: ReportData, values_of: Any, registry: Any = None,
          said: list[Lead] | None = None) -> list[str]:
    """The headline sentence and the disagreements (module docstring); ``values_of(head,
    column)`` gives the per-seed values compared. ``said`` gains each sentence's
    :class:`.verdict.Lead`, in order."""
    if nothing_learned(data):
        return []
    found = headlines(data, registry)
    if not found:
        return []
    (head, column), others = found[0], found[1:]
    top = lead(values_of(head, column), head.lower_is_better, column)
    if top is None:
        return []
    lines = [lead_phrase(f"{column_label(column)} (the headline metric)", top) + "."]
    made = [top]
    for other, col in others:
        theirs = lead(values_of(other, col), other.lower_is_better, col)
        if theirs is not None and theirs.clear and (theirs.first != top.first or not top.clear):
            lines.append(disagreement_phrase(column_label(column), top, column_label(col),
                                             theirs))
            made.append(theirs)
    if said is not None:
        said += made
    return lines


def reading_leads(data: ReportData, variants: Sequence[str] | None = None,
                  registry: Any = None) -> list[str]:
    """:func:`leads` over the variants as they ran (``variants``: only those)."""
    return leads(data, lambda head, col: seed_values(data.rows, head.probe, col, variants),
                 registry)


def is_tuning(data: ReportData) -> bool:
    """Whether a run sweeps probe settings (its variants are then compared at their own
    best setting, :mod:`.tuned`, and not as they ran)."""
    return any(isinstance(o, dict) and any(str(k).startswith("measure.") for k in o)
               for o in data.variants["overrides"])


def has_conditions(data: ReportData) -> bool:
    """Whether a run has condition axes (:mod:`variantlab.config.roles`): its variants are
    then compared only within one condition (:mod:`.fair`), never ranked all together."""
    return bool(conditions_of(data))


def conditions_of(data: ReportData, keep: Callable[[str, str], bool] | None = None
                  ) -> dict[str, str]:
    """Variant -> its condition (``n_pairs=2, emb_dim=32``: the value of each condition
    axis of its run, defaults included), for the variants of runs with condition axes.
    ``keep(axis, role)``: the axes named instead (default: those whose role is condition)."""
    keep = keep or (lambda axis, role: role == CONDITION)
    out: dict[str, str] = {}
    for meta in data.runs:
        mine = data.variants[data.variants["run"] == meta.run]
        overs = [dict(o) if isinstance(o, Mapping) else {} for o in mine["overrides"]]
        conds = [a for a, r in stored_roles(meta, overs).items() if keep(a, r)]
        if not conds:
            continue
        labels = GridLabels.of(meta)
        for variant, over, spec in zip(mine["variant"], overs, mine["spec"]):
            out[str(variant)] = ", ".join(
                f"{labels.short.get(a, a)}="
                f"{labels.value(a, over[a] if a in over else axis_default(a, meta, spec))}"
                for a in conds)
    return out


def tuned_leads(data: ReportData, chosen: dict[str, str], probe_rows: pd.DataFrame | None = None,
                registry: Any = None, said: list[Lead] | None = None) -> list[str]:
    """:func:`leads` over architectures at their chosen settings (``chosen``: architecture
    -> its chosen variant), each named by its architecture (``said``: as :func:`leads`)."""
    rows = data.rows if probe_rows is None else probe_rows
    names = {v: a for a, v in chosen.items()}

    def values_of(head: Headline, column: str) -> pd.DataFrame:
        part = seed_values(rows, head.probe, column, list(names))
        return part.assign(variant=part["variant"].map(names))

    return leads(data, values_of, registry, said)


__all__ = ["column_label", "conditions_of", "has_conditions", "headlines",
           "is_tuning", "leads", "reading_leads", "seed_values", "tuned_leads"]
