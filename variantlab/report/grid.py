"""The report's parts for sweeps: the effects tables, a reading that stays short at any
size, the browsable variant table and the side-by-side of variants measured in several runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import pandas as pd

from .effects import HEADLINE, Effects, cell_means, clear, label_of
from .frame import ReportData, differing_axes, variant_flat
from .learned import nothing_learned
from .plots import Plot, heatmap
from .tables import Table, cell_text, fmt
from .verdict import lead
from .words import MAX_READING, lead_phrase

MAX_NAMES = 3  # names listed in one sentence of the reading before "and N more"
AVERAGES = "Averages over settings and conditions"


def cut(names: Sequence[str], k: int = MAX_NAMES) -> str:
    """``a, b, c and 4 more``."""
    names = list(names)
    head = ", ".join(names[:k])
    return head + (f" and {len(names) - k} more" if len(names) > k else "")


def _interval(low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return "— (one seed: no interval)"
    return f"[{fmt(low)}, {fmt(high)}]"


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + fmt(x)


def effects_table(effects: Effects) -> Table:
    """Main effects, metric by metric, largest first."""
    base = effects.grid.baseline
    body = [[label_of(r.metric), r.axis, f"{r.value} vs {base[r.axis]}", _signed(r.effect),
             _interval(r.low, r.high), str(r.n), "yes" if clear(r.low, r.high) else "no"]
            for r in effects.main.itertuples()]
    note = ("paired differences against the axis's baseline value, each pair sharing "
            "its run, seed and the other axes' values, averaged within each seed; 95% "
            "Student-t interval over seeds (the seed is the unit of replication; n = seeds); "
            "'clear' when the interval excludes 0. Time in ms. All rows are in effects.csv.")
    settings = [a for a in effects.grid.axes if a.startswith("measure.")]
    if settings:
        note += (f" Setting axes ({', '.join(settings)}) are averaged over like the others "
                 "here; Tuned comparison compares each architecture at its own chosen setting.")
    if effects.main["n"].max() < 2:
        note += " One seed: no interval can be given; run more seeds to get one."
    if effects.several_runs:
        note += f" Effects are of run {effects.grid.run} only; runs are never pooled."
    title = "Effects of each axis"
    if pooled(effects):
        title = AVERAGES
        note += (" Each is an average over the settings and conditions of the grid: a "
                 "description, not a verdict on any one condition (the verdicts are per "
                 "condition, in verdicts.csv and the reading).")
    return Table(title, ["metric", "axis", "value", "effect",
                                           "95% interval", "n seeds", "clear"], body, note)


def pooled(effects: Effects) -> bool:
    """Whether the grid has tuned or condition axes: its main effects then average over
    learning rates or conditions, never a verdict."""
    return any(r in ("tuned", "condition") for r in effects.grid.roles.values())


def interaction_table(effects: Effects) -> Table:
    """Two-way interactions of the top axes on the primary metric."""
    body = [[r.axis, r.value, _signed(r.effect), _interval(r.low, r.high), str(r.n),
             "yes" if clear(r.low, r.high) else "no"] for r in effects.pairs.itertuples()]
    base = effects.grid.baseline
    note = (f"on {label_of(effects.primary)}, among the top axes ({', '.join(effects.top)}): "
            "y(a,b) − y(a0,b) − y(a,b0) + y(a0,b0) against the baseline values ("
            + ", ".join(f"{a}={base[a]}" for a in effects.top)
            + "), paired as the main effects; non-zero means the effect of one axis depends "
            "on the other.")
    return Table("Interactions", ["axes", "values", "interaction", "95% interval", "n seeds",
                                  "clear"], body, note)


def unchanged(effects: Effects, metric: str) -> bool:
    """Whether no axis moves ``metric`` at all: no effect row, or every effect exactly 0
    (a parameter count that no compared axis changes)."""
    mine = effects.main[effects.main["metric"] == metric]
    return not len(mine) or bool((mine["effect"].abs() == 0).all())


def best_sentence(data: ReportData, effects: Effects, losses: bool = True) -> str | None:
    """On each headline metric with a direction, the best grid variant when its lead over
    the next is clear over seeds, else that the first two are not clearly different
    (:mod:`.verdict`); None when nothing was learned (:mod:`.learned`). ``losses`` False:
    the losses are left to the experiment's headline metric (:mod:`.headline`)."""
    if nothing_learned(data):
        return None
    parts = []
    for metric, label, lower in HEADLINE:
        if not losses and metric.endswith("_loss"):
            continue
        part = effects.values[effects.values["metric"] == metric]
        found = (lead(part[["variant", "seed", "value"]], lower, metric)
                 if lower is not None else None)
        if found is not None:
            parts.append(lead_phrase(label, found))
    return "; ".join(parts) + "." if parts else None


def grid_reading(data: ReportData, summary: pd.DataFrame, effects: Effects,
                 problems: list[str], extra: Sequence[str] = (),
                 heads: Sequence[str] = (), best: bool = True,
                 averages: Sequence[str] = ()) -> list[str]:
    """At most MAX_READING sentences: the grid, the averaged main effects, ``extra`` (the
    per-variant sentences of a small grid), the headline metric's leader and the metrics
    that disagree (``heads``, :mod:`.headline`), the best variants (``best`` False: none,
    for a tuned or condition run, whose fair comparison names them within each
    condition), the problems. ``averages``: the claims' sentence on the main effects
    (:func:`.words.average_lines`); no verdict word is decided here."""
    g = effects.grid
    seeds = len(data.seeds)
    axes = f"{len(g.axes)} ax{'is' if len(g.axes) == 1 else 'es'}"
    lines = [f"A grid of {len(g.cells)} variants over {axes} (" + cut(list(g.axes), 6)
             + f"), {seeds} seed(s); effects are paired differences with 95% intervals over "
             "seeds (see Effects of each axis)."]
    flat = [label_of(m) for m, _, _ in g.metrics if unchanged(effects, m)]
    if pooled(effects):  # averages over rates or conditions: their own section, no verdict
        lines[0] = lines[0].replace("(see Effects of each axis)", f"(averaged over settings "
                                    f"and conditions: see {AVERAGES}, not verdicts)")
        flat = []
    else:  # the claims' average rows (:func:`.words.average_lines`)
        lines += list(averages)
    lines += list(extra)
    if flat:
        lines.append("No axis changes " + cut(flat, 4) + ".")
    said = best_sentence(data, effects, losses=not heads) if best else None
    room = MAX_READING - len(problems) - (1 if said else 0) - len(heads)
    lines = lines[:max(room, 2)] + list(heads) + ([said] if said else [])
    return lines + problems


def problems(data: ReportData, summary: pd.DataFrame) -> list[str]:
    """Divergence, failed units and spec warnings, grouped by message with counts."""
    out = []
    div = summary[(summary["metric"] == "diverged") & (summary["mean"] > 0)]
    if len(div):
        out.append("Training diverged for " + cut(list(div["variant"])) + ".")
    units = data.units
    if "status" in units.columns and (units["status"] == "failed").any():
        errors = units.loc[units["status"] == "failed", "error"].fillna("").astype(str)
        counts = errors.map(lambda e: e.strip().splitlines()[0] if e.strip() else "no message")
        groups = [f"{n} × {msg}" for msg, n in counts.value_counts(sort=True).items()]
        out.append(f"{len(errors)} unit(s) failed: " + cut(groups, 2) + "; see Failed units.")
    warned: dict[str, list[str]] = {}
    for variant, warnings in zip(data.variants["variant"], data.variants["warnings"]):
        for text in warnings or []:
            warned.setdefault(str(text), []).append(variant)
    if warned:
        groups = [f"{msg} ({len(vs)}: {cut(vs, 2)})" for msg, vs in
                  sorted(warned.items(), key=lambda kv: -len(kv[1]))]
        out.append("Spec warnings: " + cut(groups, 2) + "; see Warnings.")
    machines = machines_line(units)
    return out + ([machines] if machines else [])


def machines_line(units: pd.DataFrame) -> str:
    """Says so when the report's units were computed on more than one machine
    (:mod:`variantlab.executors.hardware`): their numbers can differ in the last bits, and
    training can grow that."""
    if "machine" not in units.columns:
        return ""
    done = units[units["status"] == "ok"] if "status" in units.columns else units
    counts = done["machine"].dropna().astype(str).value_counts(sort=True)
    if len(counts) < 2:
        return ""
    groups = [f"{n} units on {name}" for name, n in counts.items()]
    more = f"; and {len(groups) - 3} more" if len(groups) > 3 else ""
    return (f"Computed on {len(counts)} machines: " + "; ".join(groups[:3]) + more + ". The "
            "same code can give other low bits on another processor, and training can grow "
            "them, so a gap between units of different machines is partly the machines'.")


def browse_table(data: ReportData, summary: pd.DataFrame) -> Table:
    """The variant table of the HTML page: the differing axes and the headline metrics
    (mean over seeds); its axis columns can be filtered and every column sorted."""
    axes = differing_axes(data)
    v = data.variants
    runs = v["run"].nunique() > 1
    metrics = [(m, label) for m, label, _ in HEADLINE if (summary["metric"] == m).any()]
    means = summary.pivot_table(index="variant", columns="metric", values="mean",
                                aggfunc="first") if len(summary) else pd.DataFrame()
    columns = ["variant"] + (["run"] if runs else []) + axes + [label for _, label in metrics]
    body = []
    for rec in v.itertuples():
        flat = variant_flat(rec.spec, rec.overrides)
        name = rec.variant + (" (baseline)" if rec.variant == data.baseline else "")
        cells = [name] + ([str(rec.run)] if runs else [])
        cells += [cell_text(flat.get(axis, "")) for axis in axes]
        cells += [fmt(_at(means, rec.variant, m), "count" if m == "total" else "")
                  for m, _ in metrics]
        body.append(cells)
    first = 1 + runs
    note = ("Click a column's header to sort by it; choose an axis value above a column to "
            "show only those variants." if len(body) > 1 else "")
    return Table("Variants", columns, body, note,
                 filters=list(range(first, first + len(axes))))


def _at(means: pd.DataFrame, variant: str, metric: str) -> float:
    try:
        return float(means.at[variant, metric])
    except (KeyError, ValueError):
        return math.nan


def cross_run_table(data: ReportData, summary: pd.DataFrame) -> Table | None:
    """Variants measured in two or more runs, side by side on each headline metric with the
    difference of each later run from the first (None when no variant is in two runs)."""
    v = data.variants
    if v["run"].nunique() < 2:
        return None
    shared = [n for n, group in v.groupby("stored_name", sort=False) if group["run"].nunique() > 1]
    if not shared:
        return None
    runs = list(dict.fromkeys(v["run"]))
    display = {(r, n): d for r, n, d in zip(v["run"], v["stored_name"], v["variant"])}
    means = summary.set_index(["variant", "metric"])["mean"]
    metrics = [(m, label) for m, label, _ in HEADLINE if (summary["metric"] == m).any()]
    body = []
    for name in shared:
        for metric, label in metrics:
            vals = [means.get((display.get((r, name), ""), metric), math.nan) for r in runs]
            if all(math.isnan(x) for x in vals):
                continue
            diffs = [_signed(x - vals[0]) if not (math.isnan(x) or math.isnan(vals[0]))
                     else "—" for x in vals[1:]]
            body.append([name, label] + [fmt(x) for x in vals] + diffs)
    columns = ["variant", "metric"] + runs + [f"{r} − {runs[0]}" for r in runs[1:]]
    return Table("Across runs", columns, body,
                 f"the same variant in each run (mean over seeds) and each run's difference "
                 f"from {runs[0]}; runs are never pooled.")


MAX_LINES = 30  # plots draw every variant up to this many, else the baseline and extremes
EXTREMES = 3


def focus(data: ReportData, summary: pd.DataFrame,
          effects: Effects | None = None) -> tuple[list[str] | None, str]:
    """The variants per-variant plots draw when there are too many for a line each: the
    baseline and the EXTREMES lowest and highest by the grid's primary metric (else the
    first headline metric present), and a caption sentence saying so; ``(None, "")`` when
    every variant fits."""
    if len(data.order) <= MAX_LINES:
        return None, ""
    first = [h for h in HEADLINE if effects is not None and h[0] == effects.primary]
    for metric, label, lower in first + list(HEADLINE):
        part = summary[(summary["metric"] == metric) & summary["mean"].notna()]
        if part["variant"].nunique() > 2 * EXTREMES:
            ranked = list(part.sort_values("mean", kind="stable")["variant"])
            if lower is False:
                ranked.reverse()
            chosen = set(ranked[:EXTREMES] + ranked[-EXTREMES:] + [data.baseline])
            picked = [v for v in data.order if v in chosen]
            return picked, (f"Of {len(data.order)} variants, this shows the baseline and the "
                            f"{EXTREMES} lowest and {EXTREMES} highest by {label}; every "
                            "variant is in the tables.")
    return data.order[:MAX_LINES], (f"This shows the first {MAX_LINES} of "
                                    f"{len(data.order)} variants; every variant is in the tables.")


def effect_plots(effects: Effects | None) -> list[Plot]:
    """A heatmap of the primary metric over each pair of the top axes (a 2-axis grid: its
    one pair)."""
    if effects is None or len(effects.top) < 2:
        return []
    label = label_of(effects.primary)
    out = []
    for i, (a, b) in enumerate(combinations(effects.top, 2)):
        table = cell_means(effects.grid, effects.values, effects.primary, a, b)
        out.append(heatmap(table, f"heatmap{i + 1}", f"{label}: {a} × {b}",
                           f"Mean {label} of each combination of {a} (down) and {b} (across), "
                           "over seeds and the other axes' values.", label))
    return out
