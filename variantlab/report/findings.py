"""The reading at the top of a report: short sentences computed from the numbers."""

from __future__ import annotations

import pandas as pd

from ..plugin.registry import Registry
from .claims import claims_table
from .effects import Effects
from .frame import ReportData
from .grid import grid_reading, problems
from .headline import conditions_of, has_conditions, is_tuning, reading_leads
from .learned import learned_lines
from .parts import pieces
from .tables import PASS_NAMES
from .timing_claims import PASSES, busy_variants, timed_table
from .words import average_lines, busy_text, pairs_of, speed_phrase

MAX_LISTED = 4  # with many variants, name the extremes only
SMALL_GRID = 8  # a grid of this many variants or fewer also gets the per-variant reading


def means(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The summary's lines of ``metric`` with a mean, by variant."""
    part = summary[(summary["metric"] == metric) & summary["mean"].notna()]
    return part.set_index("variant")


def listing(pairs: list[tuple[str, str]]) -> str:
    """``variant: text; ...``, the extremes only when there are more than MAX_LISTED."""
    if len(pairs) > MAX_LISTED:
        pairs = pairs[:2] + [("…", "")] + pairs[-2:]
    return "; ".join(f"{v}: {t}" if t else v for v, t in pairs)


def timing_speed(data: ReportData, summary: pd.DataFrame) -> str | None:
    """The fastest and slowest variant against the baseline on the slowest-measured pass,
    among the variants of the baseline's condition when the run has condition axes: each
    said from its ``timing`` claims row (:func:`.claims.timing_rows`,
    :func:`.words.speed_phrase`), which judges the time ratio seed by seed (each timing unit
    is its own measurement, minutes apart). ``summary`` is not read: the rows hold it all."""
    claims = claims_table(data)
    timed = claims[claims["kind"] == "timing"]
    conds = conditions_of(data)
    where = (f" (within the baseline's condition, {conds[data.baseline]})"
             if conds.get(data.baseline) else "")
    for key in PASSES:
        mine = timed[timed["metric"] == f"{key}_median_s"]
        if not len(mine):
            continue
        ends = mine.set_index("a")["a_mean"]
        table, _ = timed_table(data.rows, f"{key}_median_s", data.baseline)
        parts = [speed_phrase(row, ratios_of(table, str(row.a), data.baseline))
                 for row in mine.set_index("a").loc[list(dict.fromkeys(
                     [ends.idxmin(), ends.idxmax()]))].reset_index().itertuples()]
        return f"{PASS_NAMES[key]}{where}: " + "; ".join(parts) + "."
    return None


def busy_note(rows: pd.DataFrame, probe: str, variants: list[str]) -> str:
    """Says so when a timing of ``variants`` was measured while the machine was busy."""
    return busy_text(", ".join(busy_variants(rows, probe, variants)))


def ratios_of(table: pd.DataFrame, variant: str, baseline: str) -> list[float]:
    """The variant's time over the baseline's, seed by seed."""
    if variant not in table or baseline not in table:
        return []
    return (table[variant] / table[baseline]).dropna().tolist()


def reading(data: ReportData, summary: pd.DataFrame, effects: Effects | None = None,
            registry: Registry | None = None) -> list[str]:
    """The report's opening sentences, in order of what readers look at first: for a grid,
    what each axis does (see :mod:`.grid`), and for a grid of at most SMALL_GRID variants
    the per-variant comparison where it fits; else the per-variant comparison (every
    registered probe's ``reading`` piece, then its ``aside``). Problems are grouped by
    message either way, so the reading stays short at any size. Which variants learned
    nothing (:mod:`.learned`) comes first."""
    trouble = problems(data, summary)
    first = learned_lines(data)  # "nothing was learned" before anything is compared
    lines = [line for piece in pieces(registry, "reading") for line in piece(data, summary)]
    # tuned or condition runs: the fair comparison (:mod:`.fair`) names the leaders, within
    # each condition; nothing ranks all variants together
    within = has_conditions(data)
    # the claims' pair verdicts (:mod:`.words`) say who is ahead: no leader sentence beside
    claims = claims_table(data)
    apart = is_tuning(data) or within or bool(len(pairs_of(claims)))
    if effects is not None:  # a small grid keeps its per-variant sentences where they fit
        small = len(data.order) <= SMALL_GRID
        heads = ([] if apart else
                 reading_leads(data, list(effects.grid.cells["variant"]), registry))
        return first + grid_reading(data, summary, effects, trouble,
                                    [line for line in lines if line] if small else [], heads,
                                    best=not apart, averages=average_lines(claims))
    heads = [] if apart else reading_leads(data, registry=registry)
    aside = [line for piece in pieces(registry, "aside") for line in piece(data, summary)]
    out = first + heads + [line for line in lines + aside if line] + trouble
    return out or ["No probe produced comparable numbers; see the tables below."]
