"""The reading at the top of a report: short sentences computed from the numbers."""

from __future__ import annotations

import math

import pandas as pd

from ..plugin.registry import Registry
from .claims import claims_table
from .effects import Effects, clear, interval
from .frame import ReportData, split_seeds
from .grid import grid_reading, problems
from .headline import conditions_of, has_conditions, is_tuning, reading_leads
from .learned import learned_lines
from .parts import pieces
from .tables import PASS_NAMES
from .words import average_lines, pairs_of

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
    """The fastest and slowest variant against the baseline on the slowest-measured pass
    (the summary's ``{pass}_median_s`` metrics, judged on the rows of the probe whose
    section holds them), among the variants of the baseline's condition when the run has
    condition axes (a wider model is not "slower" than a narrower one: it is another size).

    With several seeds each timing unit is an independent measurement (its own process
    state, minutes apart), so the speed-up is judged seed by seed; with one, only against
    the timing IQR, which misses the machine's drift between units, and the text says so.
    """
    conds = conditions_of(data)  # variants are compared only within one condition
    where = (f" (within the baseline's condition, {conds[data.baseline]})"
             if conds.get(data.baseline) else "")
    for key in ("backward", "step", "forward"):
        metric = f"{key}_median_s"
        table = means(summary, metric)
        if conds:
            table = table[[conds.get(str(v)) == conds.get(data.baseline) for v in table.index]]
        if len(table) < 2 or data.baseline not in table.index:
            continue
        base = table.loc[data.baseline, "mean"]
        others = table.drop(index=data.baseline)["mean"]
        probe = str(table.loc[data.baseline, "section"])
        per_seed = paired_ratios(data.rows, probe, metric, data.baseline)
        parts = []
        for variant in dict.fromkeys([others.idxmin(), others.idxmax()]):
            ratio = base / others[variant]
            if math.isclose(ratio, 1.0, rel_tol=0.02):
                parts.append(f"{variant} is as fast as {data.baseline} (within 2%)"
                             + busy_note(data.rows, probe, [data.baseline, variant]))
                continue
            speed = f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"
            seeds = per_seed.get(variant, [])
            if len(seeds) >= 2 and not speed_is_clear(seeds):
                parts.append(f"{variant} and {data.baseline} are not clearly different in speed "
                             f"({speed_span(seeds)})"
                             + _apart(data, probe, metric, variant)
                             + busy_note(data.rows, probe, [data.baseline, variant]))
                continue
            if len(seeds) >= 2:
                how = _speed_sureness(seeds, ratio > 1)
            else:
                iqr = max(_nan0(table.loc[variant, "iqr"]), _nan0(table.loc[data.baseline, "iqr"]))
                how = (" (within the timing IQR: not a clear difference)"
                       if abs(base - others[variant]) <= iqr else
                       " (one timing unit each; more seeds would show the run-to-run spread)")
            parts.append(f"{variant} is {speed} than {data.baseline}{how}"
                         + _apart(data, probe, metric, variant)
                         + busy_note(data.rows, probe, [data.baseline, variant]))
        return f"{PASS_NAMES[key]}{where}: " + "; ".join(parts) + "."
    return None


def busy_note(rows: pd.DataFrame, probe: str, variants: list[str]) -> str:
    """Says so when a timing of ``variants`` was measured while the machine was busy (the
    timing probe's ``busy`` row, :mod:`variantlab.probes.machine`)."""
    mine = rows[(rows["probe"] == probe) & (rows["metric"] == "busy")
                & rows["variant"].isin(variants) & (rows["value"] == 1)]
    if mine.empty:
        return ""
    which = ", ".join(str(v) for v in dict.fromkeys(mine["variant"]))
    return (f" (but {which} was timed while the machine was busy: its load average was above "
            "the cores the run could use, so the times read slow by an unknown factor; "
            "rerun on an idle machine)")


def _apart(data: ReportData, probe: str, metric: str, variant: str) -> str:
    """Says so when the compared timings were measured by different runs."""
    seeds = split_seeds(data.rows, probe, metric, data.baseline, variant)
    if not seeds:
        return ""
    which = ", ".join(str(s) for s in seeds)
    return (f" (but timed in different invocations of `variantlab run` on seed(s) {which}, "
            "not side by side: rerun both together to compare)")


def paired_ratios(rows: pd.DataFrame, probe: str, metric: str, baseline: str) -> dict[str, list]:
    """Per variant: the baseline's value over the variant's, seed by seed (a speed-up)."""
    table = _by_seed(rows, probe, metric, baseline)
    ratios = (1 / table).mul(table[baseline], axis=0).drop(columns=baseline)
    return {v: ratios[v].dropna().tolist() for v in ratios}


def _by_seed(rows: pd.DataFrame, probe: str, metric: str, baseline: str) -> pd.DataFrame:
    """Model-scope values, seeds down and variants across (empty without the baseline)."""
    part = rows[(rows["probe"] == probe) & (rows["metric"] == metric)
                & (rows["scope"] == "model") & rows["value"].notna()]
    table = part.pivot_table(index="seed", columns="variant", values="value", aggfunc="mean")
    return table if baseline in table else pd.DataFrame({baseline: []})


def speed_is_clear(ratios: list[float]) -> bool:
    """Whether per-seed speed-ups are clearly not 1: the 95% t-interval over seeds of their
    logarithms excludes 0 (the same rule as every other verdict of the report)."""
    logs = pd.Series([math.log(r) for r in ratios if r > 0])
    _, low, high, _ = interval(logs)
    return clear(low, high)


def speed_span(ratios: list[float]) -> str:
    """``n=3, per-seed 0.91x to 1.19x, 95% interval 0.85x to 1.30x``: speed-ups over seeds."""
    logs = pd.Series([math.log(r) for r in ratios if r > 0])
    _, low, high, n = interval(logs)
    return (f"n={n}, per-seed {min(ratios):.2f}x to {max(ratios):.2f}x, 95% interval "
            f"{math.exp(low):.2f}x to {math.exp(high):.2f}x faster: includes 1")


def _speed_sureness(ratios: list[float], faster: bool) -> str:
    """Speed-ups seed by seed, said in the claim's direction (slow-downs as 1/r)."""
    agree = sum(1 for r in ratios if (r > 1) == faster)
    shown = sorted(r if faster else 1 / r for r in ratios)
    return _verdict(agree, len(ratios), f"per-seed {shown[0]:.2f}x to {shown[-1]:.2f}x")


def _verdict(agree: int, n: int, span: str) -> str:
    """Whether a difference held on every seed, with its per-seed span."""
    if agree == n:
        return f" on every seed (n={n}, {span})"
    return f" on {agree} of {n} seeds ({span}): not a clear difference"


def _nan0(x: float) -> float:
    return 0.0 if x is None or math.isnan(x) else float(x)


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
