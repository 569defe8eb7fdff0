"""The report's part for each probe's own tables and plots: the plain view functions of the
registered probes that have rows (after the probes' shared pieces,
:mod:`.parts`), or a generic table of a probe's rows when it declares no view at all or is
not registered where the report runs (a plugin probe from a file)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pandas as pd

from ..plugin.probe import ProbeView
from ..plugin.registry import Registry
from .frame import ReportData
from .guard import Failure, run_part
from .parts import views_of
from .plots import Plot
from .tables import Table, fmt


def probe_views(data: ReportData, registry: Registry) -> tuple[list[Table], list[Plot]]:
    """Tables and plots of the plain view functions of every probe in the rows, in the
    order the probes first appear (a probe's :class:`ProbeView` pieces are the shared
    parts'); a probe with no views, or one ``registry`` does not have, gets a generic
    table."""
    tables: list[Table] = []
    plots: list[Plot] = []
    probes = list(dict.fromkeys(data.rows["probe"])) if len(data.rows) else []
    registered = {p.name: p for p in registry.probes()}
    for name in probes:
        probe = registered.get(name)
        views = views_of(probe) if probe is not None else ()
        if not views:
            tables.append(run_part(f"probe {name}: generic table", generic_table, data, name,
                                   default=partial(notice_table, f"Probe: {name}")))
            continue
        for i, view in enumerate(views):
            if isinstance(view, ProbeView):
                continue
            part = f"probe {name}: view {getattr(view, '__name__', i)}"
            items: list[Any] = run_part(part, _items, view, data,
                                        default=partial(_notice_items, part))
            for item in items:
                (plots if isinstance(item, Plot) else tables).append(item)
    return tables, plots


def _items(view: Any, data: ReportData) -> list[Any]:
    return list(view(data))


def _notice_items(part: str, failure: Failure) -> list[Any]:
    return [notice_table(part, failure)]


def notice_table(title: str, failure: Failure) -> Table:
    """A table in place of one that failed: its title and the notice."""
    return Table(title, ["failed"], [[failure.notice()]])


def generic_table(data: ReportData, probe: str) -> Table:
    """Variants down; one column per (metric, scope, name, layer) of the probe's rows
    without a step, mean ± std over seeds."""
    rows = data.rows[(data.rows["probe"] == probe)]
    rows = rows[rows["step"].isna()] if "step" in rows else rows
    keys = list(dict.fromkeys(_key(r) for _, r in rows.iterrows()))
    body = []
    for variant in data.order:
        mine = rows[rows["variant"] == variant]
        if not len(mine):
            continue
        by: dict[Any, list[float]] = {k: [] for k in keys}
        for _, r in mine.iterrows():
            by[_key(r)].append(float(r["value"]))
        body.append([variant, str(mine["seed"].nunique())] + [_cell(v) for v in by.values()])
    return Table(f"Probe: {probe}", ["variant", "n"] + keys, body,
                 f"rows of the {probe} probe (no view declared): mean ± std over seeds")


def _key(r: pd.Series) -> str:
    parts = [str(r["metric"])]
    if r.get("name"):
        parts.append(str(r["name"]))
    layer = r.get("layer")
    if layer is not None and not pd.isna(layer):
        parts.append(f"layer {int(layer)}")
    return " ".join(parts)


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    s = pd.Series(values)
    mean = fmt(float(s.mean()))
    return mean if len(values) < 2 else f"{mean} ± {fmt(float(s.std()))}"


__all__ = ["generic_table", "notice_table", "probe_views"]
