"""The report's fair-comparison parts: the tuned table, the loss-vs-learning-rate plot and
the sentences that say when a ranking depends on the setting (:mod:`.tuned`), and the
scaling views when the grid varies size (:mod:`.scaling`). A probe that trains gives them
as its ``fair`` piece (:func:`fair_piece`); the report merges every probe's
(:func:`fair_of`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from ...config.metrics import finite as _finite
from ...plugin.registry import Registry
from ..claims import claims_table, measured_row, verdict_of
from ..frame import ReportData
from ..headline import tuned_leads
from ..labels import value_text
from ..learned import nothing_learned
from ..panels import mark_coinciding, panels_legend, small_multiples
from ..parts import pieces
from ..plots import Plot, legend, log_scale, styles
from ..tables import Table, fmt
from ..verdict import Lead
from ..words import groups, ranking_phrase
from .conditions import axes_table, condition_table, condition_values, effects_by_condition
from .gaps import group_values
from .improving import improving_cell, improving_lines
from .scaling import scaling_parts
from .tuned import (
    Sweep,
    added,
    choose,
    find_sweep,
    group_name,
    lr_curves,
    tuned_frame,
)

MAX_FLIPS = 4  # ranking sentences at most


@dataclass
class FairParts:
    """What the report adds for a tuning or size sweep."""

    tables: list[Table] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    tuned: pd.DataFrame | None = None  # tuned.csv
    by_size: pd.DataFrame | None = None  # effects_by_size.csv
    by_condition: pd.DataFrame | None = None  # effects_by_condition.csv
    claims: list[dict[str, Any]] = field(default_factory=list)  # rows for verdicts.csv


def fair_parts(data: ReportData, probe: str, size_probe: str,
               count: Callable[[Any], float] | None = None) -> FairParts:
    """The tuned comparison (a run with setting axes) and the scaling views (a grid over
    model size) of ``probe``'s losses (``size_probe``: the probe counting non-embedding
    parameters; ``count(spec)``: the count from a variant's stored spec when that probe
    has no rows for it); empty parts otherwise."""
    parts = FairParts()
    sweep = find_sweep(data, probe)
    if sweep is not None:
        claims = claims_table(data)
        frame = with_groups(tuned_frame(sweep), sweep, claims)
        parts.tuned = frame
        parts.tables.append(tuned_table(sweep, frame))
        learned = not nothing_learned(data)
        named: set[str] = set()  # the groups some verdict is about: every pair's
        for row in claims[claims["kind"] == "pair"].itertuples():
            _name(named, str(row.condition) if isinstance(row.condition, str) else "",
                  str(row.a), str(row.b))
        parts.lines += tuned_lines(sweep, frame, learned, named)
        if learned:  # the ranking sentences' rows (:func:`ranking_rows`)
            parts.claims += [row for flip in ranking_rows(sweep, frame)[:MAX_FLIPS]
                             for row in (flip.at_lr, flip.at_best)]
        parts.lines += leads_within(data, sweep, named, parts.claims)
        parts.lines += improving_lines(sweep, frame, named)
        if sweep.lr_axis is not None:
            parts.plots.append(lr_plot(sweep, frame))
        _by_condition(parts, sweep)
    elif (plain := find_sweep(data, probe, untuned=True)) is not None:
        plain_frame, named = tuned_frame(plain), set()
        parts.lines += condition_lines(plain, plain_frame, not nothing_learned(data), named)
        parts.lines += leads_within(data, plain, named, parts.claims)
        parts.lines += improving_lines(plain, plain_frame, named)
        _by_condition(parts, plain)
    scaled = scaling_parts(data, sweep, probe, size_probe, count)
    if scaled is not None:
        plots, lines, tables, parts.by_size = scaled
        parts.plots += plots
        parts.lines += lines
        parts.tables += tables
    return parts


def leads_within(data: ReportData, sweep: Sweep, named: set[str] | None = None,
                 claims: list[dict[str, Any]] | None = None) -> list[str]:
    """The headline's leader and the metrics whose clear leader differs
    (:func:`..headline.tuned_leads`), over the compared variants at their chosen settings:
    only the disagreements (per condition where there are conditions), since the claims'
    verdicts (:func:`..words.verdict_lines`) name each condition's pairs on the headline. ``named`` gains the
    groups the sentences said are about; ``claims`` gains their ``lead`` rows (each with
    its condition)."""
    rows = data.rows[data.rows["run"] == sweep.run]
    out: list[tuple[str, Lead, str]] = []
    for cond in dict.fromkeys(sweep.sizes.get(g, "") for g in sweep.archs):
        picks = {sweep.compared.get(g, g): str(c["variant"]) for g in sweep.groups_of(cond)
                 if (c := choose(sweep, g)) is not None}
        said: list[Lead] = []
        found = list(zip(tuned_leads(data, picks, rows, getattr(data, "registry", None),
                                     said), said))
        # the headline's leader restates a pair the claims' verdicts already give
        # (:func:`..words.verdict_lines`): only the metrics that disagree are said here,
        # while the headline pair's groups still count as named by a verdict
        for _, lead in found[:1]:
            _name(named, cond, lead.first, lead.second)
        out += [((f"{cond}: {line[:1].lower()}{line[1:]}" if cond else line), lead, cond)
                for line, lead in found[1:]]
    for _, lead, cond in out[:MAX_FLIPS]:
        _name(named, cond, lead.first, lead.second)
        if claims is not None:
            claims.append({**lead.row, "condition": cond})
    return [line for line, _, _ in out[:MAX_FLIPS]]


def _name(named: set[str] | None, cond: str, *compared: str) -> None:
    """Add the groups of ``compared`` variants in condition ``cond`` to ``named``."""
    if named is not None:
        named.update(group_name(c, cond) for c in compared)


def _by_condition(parts: FairParts, sweep: Sweep) -> None:
    """effects_by_condition.csv and its table, when the sweep has conditions."""
    parts.by_condition = effects_by_condition(sweep)
    if parts.by_condition is not None and len(parts.by_condition):
        parts.tables.append(condition_table(parts.by_condition))


def fair_piece(probe: str, size_probe: str, count: Callable[[Any], float] | None = None
               ) -> Callable[[ReportData], FairParts]:
    """A ``ProbeView.fair`` piece: :func:`fair_parts` of ``probe``'s losses."""
    return partial(fair_parts, probe=probe, size_probe=size_probe, count=count)


def fair_of(data: ReportData, registry: Registry | None = None) -> FairParts:
    """Every registered probe's ``fair`` parts, merged in rank order (tuned.csv and
    effects_by_size.csv: the first probe's that has one)."""
    axes = axes_table(data)
    merged = FairParts(tables=[axes] if axes is not None else [])
    if data.registry is None:
        data.registry = registry  # the headline metric of a plugin probe needs its direction
    for piece in pieces(registry, "fair", lambda probe, failure: FairParts()):
        got = piece(data)
        merged.tables += got.tables
        merged.lines += got.lines
        merged.plots += got.plots
        merged.claims += got.claims
        merged.tuned = merged.tuned if merged.tuned is not None else got.tuned
        merged.by_size = merged.by_size if merged.by_size is not None else got.by_size
        merged.by_condition = merged.by_condition if merged.by_condition is not None \
            else got.by_condition
    return merged


def _num(x: object) -> str:
    return fmt(float(x)) if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def with_groups(frame: pd.DataFrame, sweep: Sweep, claims: pd.DataFrame) -> pd.DataFrame:
    """tuned.csv's ``group``: per condition, the letters of :func:`..words.groups` from the
    claims' verdicts (best reported mean first); empty for an unresolved group."""
    test = sweep.metric_columns[1]
    out = frame.assign(group="")
    conds = [sweep.sizes.get(g, "") for g in sweep.archs]
    for cond in dict.fromkeys(conds):
        where = [c == cond and u != True for c, u in zip(conds, out["unresolved"])]  # noqa: E712
        mine = out[where]
        order = mine.assign(_k=[sweep.head.key(v) for v in mine[test]]).sort_values(
            "_k", kind="stable")["variant"].astype(str).tolist()
        letters = groups(claims[claims["kind"] == "pair"], cond, order)
        out.loc[where, "group"] = [letters.get(str(v), "") for v in mine["variant"]]
    return out


def tuned_table(sweep: Sweep, frame: pd.DataFrame) -> Table:
    val_col, test_col = sweep.metric_columns
    cols = ["variant", *sweep.condition_axes, *sweep.setting_axes, f"{sweep.chosen_on} (chose)",
            f"{sweep.reported_on}", "95% interval", "n seeds", f"vs {sweep.baseline}",
            "at edge", "lr sensitivity", "diverged", "still improving", "group"]
    body = []
    seeds = int(sweep.per_seed["seed"].nunique())
    for r in frame.to_dict("records"):
        inter = (f"[{_num(r['low'])}, {_num(r['high'])}]" if _finite(r.get("low"))
                 else "— (one seed)" if r.get("n") == 1 else "—")
        vs = ("" if r["variant"] == sweep.baseline else
              f"{_num(r['vs_baseline'])} [{_num(r['vs_low'])}, {_num(r['vs_high'])}]")
        edge = "yes" if r["at_edge"] == True else "no"  # noqa: E712 (numpy bools, NaN)
        group = str(r.get("group") or "") or ("unresolved" if r["unresolved"] == True  # noqa: E712
                                              else "—")
        body.append([str(r["variant"]), *[_cell(r[a]) for a in sweep.condition_axes],
                     *[_cell(r[a]) for a in sweep.setting_axes],
                     _num(r[val_col]), _num(r[test_col]), inter, _num(r["n"]), vs,
                     edge, _num(r["lr_sensitivity"]), f"{r['diverged']}/{r['runs']}",
                     improving_cell(r, seeds), group])
    better = "higher" if not sweep.head.lower_is_better else "lower"
    within = (f" within each condition ({', '.join(sweep.condition_axes)}), never across"
              if sweep.condition_axes else "")
    note = (f"each compared variant at its own best setting{within}: chosen by the mean "
            f"{sweep.chosen_on} over seeds ({better} is better), reported on "
            f"{sweep.reported_on}; intervals are 95% t-intervals over seeds; vs = paired "
            "difference per seed to the baseline variant at its own best, in the same "
            "condition; group: variants of one condition that share a letter are not "
            "separated by a clear verdict (all pairs, Holm over the condition's pairs; "
            "verdicts.csv), 'unresolved' when the best sits at an edge of the sweep; lr "
            "sensitivity (Wortsman et al. 2023) = mean over lrs "
            "of min(loss, loss at init) minus the best loss; still improving = seeds of the "
            "chosen setting still improving at the end of training (judged on the headline "
            "metric's validation curve where recorded, else the training loss) out of the "
            "seeds judged. All numbers are in tuned.csv; "
            "see docs/fair-comparisons.md.")
    return Table("Tuned comparison", cols, body, note)


def _cell(x: object) -> str:
    return _num(x) if isinstance(x, float) else value_text(x)


def tuned_lines(sweep: Sweep, frame: pd.DataFrame, learned: bool = True,
                named: set[str] | None = None) -> list[str]:
    """The reading's sentences: the choice per compared variant, what is optimistic, what
    edge extension added, which results sit at an edge (unresolved), the verdict in each
    condition and whether it holds across them, and where a ranking depends on the
    learning rate; no verdict when no variant learned anything (``learned`` False).
    ``named`` gains the groups the verdicts are about."""
    axes = ", ".join(sweep.setting_axes)
    within = (f" within each condition of {', '.join(sweep.condition_axes)}"
              if sweep.condition_axes else "")
    lines = [f"Tuned comparison over {axes}: each of {len(set(sweep.compared.values()))} "
             f"compared variant(s) at its own best setting{within} (by mean "
             f"{sweep.chosen_on}, reported on {sweep.reported_on}); see Tuned comparison and "
             "tuned.csv."]
    if sweep.wanted:
        lines.append(f"compare_on: {sweep.wanted} was not recorded by this run, so the "
                     f"comparison is on the loss instead ({sweep.chosen_on}, "
                     f"{sweep.reported_on}).")
    if sweep.optimistic:
        lines.append(f"This run has no held-out validation/test {sweep.head.name}: "
                     f"{sweep.chosen_on} both chose the setting and reports it, so the tuned "
                     "numbers are optimistic.")
    grown = [f"{group} ({'; '.join(f'{a}: ' + ', '.join(map(value_text, v)) for a, v in more.items())})"
             for group in sweep.archs if (more := added(sweep, group))]
    if grown:
        lines.append("Edge extension ran values beyond the grid for " + "; ".join(grown[:4])
                     + (f" and {len(grown) - 4} more" if len(grown) > 4 else "") + ".")
    edge = [f"{group_name(r['variant'], sweep.sizes.get(g, ''))} ({r['edge_axes']})"
            for g, r in zip(sweep.archs, frame.to_dict("records")) if r["at_edge"] == True]  # noqa: E712
    if edge:
        lines.append("Unresolved: the best setting sits at the edge of the sweep for "
                     + "; ".join(edge[:4]) + ", so no ranking is given where it does; widen "
                     "the sweep there (extend: true on the axis, or run --extend-edges), the "
                     "best may lie outside it.")
    if frame["n"].max() == 1:
        lines.append("One seed: the tuned numbers have no interval; run more seeds.")
    lines += condition_values(sweep, frame)
    if learned:  # the verdicts themselves lead the reading (:func:`..words.verdict_lines`)
        if named is not None and sweep.condition_axes:
            named.update(sweep.archs)
        lines += ranking_flips(sweep, frame, named)
    return lines


def condition_lines(sweep: Sweep, frame: pd.DataFrame, learned: bool = True,
                    named: set[str] | None = None) -> list[str]:
    """The reading of a run with condition axes and no tuned axis: each compared variant
    as it ran, compared only with the others of its condition (the claims' verdicts,
    :func:`..words.verdict_lines`), or,
    when nothing is compared, the headline metric per condition; no verdict when no
    variant learned anything (``learned`` False). ``named`` gains the groups the verdicts
    are about."""
    n = len(set(sweep.compared.values()))
    if n < 2:
        return condition_values(sweep, frame)
    lines = [f"Compared only within each condition of {', '.join(sweep.condition_axes)}, "
             f"never across: {n} compared variants on {sweep.reported_on}; see Effects by "
             "condition and effects_by_condition.csv."]
    if not learned:
        return lines
    if named is not None:  # the claims' verdicts name every group
        named.update(sweep.archs)
    return lines


def _paired(sweep: Sweep, a: str, b: str, column: str = "val", lr: float | None = None
            ) -> pd.Series:
    """Group ``a``'s ``column`` minus group ``b``'s, seed by seed, at each one's chosen
    setting or both at learning rate ``lr``."""
    values = pd.concat([group_values(sweep, a, column, lr), group_values(sweep, b, column, lr)])
    table = values.pivot_table(index="seed", columns="variant", values="value", aggfunc="mean")
    if a not in table or b not in table:
        return pd.Series(dtype=float)
    diff = table[a] - table[b]
    return diff[diff.map(_finite)]


@dataclass
class Flip:
    """Two groups whose order on the choice metric changes with the learning rate: the
    ``ranking`` claims rows of ``lose`` minus ``win`` at ``lr`` and at each one's best, with
    the means to show (choice metric at ``lr``, then at the best; ``lose``'s first)."""

    win: str
    lose: str
    lr: float
    at_lr: dict[str, Any]
    at_best: dict[str, Any]
    shown: tuple[float, float, float, float]


def ranking_rows(sweep: Sweep, frame: pd.DataFrame) -> list[Flip]:
    """Pairs of compared variants of the same condition whose order by mean on the choice
    metric at some learning rate is the other way round from their order at their own best
    settings (the learning rate where the reversal is largest), never for a group whose
    best sits at an edge (unresolved): each with its two ``ranking`` rows
    (:func:`..claims.measured_row` on the paired per-seed differences, ``lose`` minus
    ``win``, unadjusted). Only pairs whose two rows are both clear, opposite ways round, are
    kept: an order that is not clear at either end is not said to change (the rule for
    "flips" in docs/fair-comparisons.md)."""
    if sweep.lr_axis is None:
        return []
    val_col = sweep.metric_columns[0]
    records = dict(zip(sweep.archs, frame.to_dict("records")))
    chosen = {g: r[val_col] for g, r in records.items()}
    curves = {a: lr_curves(sweep, a, choose(sweep, a)).set_index("lr") for a in sweep.archs}
    key, name = sweep.head.key, sweep.chosen_on
    out: list[Flip] = []
    for i, a in enumerate(sweep.archs):
        for b in sweep.archs[i + 1:]:
            va, vb = chosen.get(a, math.nan), chosen.get(b, math.nan)
            if not sweep.same_size(a, b) or not (_finite(va) and _finite(vb)) or va == vb \
                    or records[a]["unresolved"] == True or records[b]["unresolved"] == True:  # noqa: E712
                continue
            win, lose = (a, b) if key(va) < key(vb) else (b, a)
            ca, cb = curves[win], curves[lose]
            flips = []
            for lr in ca.index.intersection(cb.index):
                x, y = ca.loc[lr, "mean"], cb.loc[lr, "mean"]
                if key(y) < key(x):
                    flips.append((key(x) - key(y), lr, x, y))
            if not flips:
                continue
            _, lr, x, y = max(flips, key=lambda f: f[0] if math.isfinite(f[0]) else 1e300)
            cond = sweep.sizes.get(win, "")
            at_lr = measured_row(cond, lose, win, name, "ranking", _paired(sweep, lose, win,
                                                                          "val", lr))
            at_lr.update({"a_setting": f"lr={fmt(lr)}", "b_setting": f"lr={fmt(lr)}",
                          "a_mean": float(y), "b_mean": float(x)})
            at_best = measured_row(cond, lose, win, name, "ranking", _paired(sweep, lose, win))
            at_best.update({"a_setting": "its best", "b_setting": "its best",
                            "a_mean": float(chosen[lose]), "b_mean": float(chosen[win])})
            for row in (at_lr, at_best):
                row["verdict"] = verdict_of(row)
            better, worse = ("lower", "higher") if sweep.head.lower_is_better else \
                ("higher", "lower")
            if at_lr["verdict"] != better or at_best["verdict"] != worse:
                continue  # an order that is not clear both ways is no flip
            out.append(Flip(win, lose, float(lr), at_lr, at_best,
                            (y, x, chosen[lose], chosen[win])))
    return out


def ranking_flips(sweep: Sweep, frame: pd.DataFrame, named: set[str] | None = None
                  ) -> list[str]:
    """When two compared variants of the same condition rank one way at some learning rate
    and the other way at their own best settings (:func:`ranking_rows`), said from their
    rows (:func:`..words.ranking_phrase`). ``named`` gains the groups said."""
    out = []
    for flip in ranking_rows(sweep, frame)[:MAX_FLIPS]:
        if named is not None:
            named.update((flip.win, flip.lose))
        out.append(ranking_phrase(pd.Series(flip.at_lr), pd.Series(flip.at_best), flip.lr,
                                  flip.shown))
    return out


def lr_plot(sweep: Sweep, frame: pd.DataFrame) -> Plot:
    """The choice metric against learning rate (log x), one panel per condition (shared
    axes), one line per compared variant in each, seed spread as a band; for a loss,
    diverged points are marked at the loss at init (dashed), for a metric where higher is
    better at the bottom of the axes."""
    loss = sweep.head.lower_is_better
    title = "Loss vs learning rate" if loss else f"{sweep.head.name} vs learning rate"
    where = "drawn at the loss at init; the dashed line is the loss at init" if loss else \
        "drawn at the bottom of the axes"
    conditions = list(dict.fromkeys(sweep.sizes.get(g, "") for g in sweep.archs))
    per = (f" One panel per condition ({', '.join(sweep.condition_axes)}), on shared axes."
           if len(conditions) > 1 else "")
    caption = (f"Mean {sweep.chosen_on} over seeds at each learning rate (other settings at "
               "each variant's chosen values), min-max over seeds shaded; x: a learning "
               f"rate with a diverged run ({where}).{per}")
    compared = list(dict.fromkeys(sweep.compared.get(g, g) for g in sweep.archs))
    style = dict(zip(compared, styles(len(compared))))
    fig, axes = small_multiples(len(conditions))
    inits, marks = [], []
    for ax, condition in zip(axes, conditions):
        for group in sweep.groups_of(condition):
            curve = lr_curves(sweep, group, choose(sweep, group))
            if not len(curve):
                continue
            name = sweep.compared.get(group, group)
            color = style[name]["color"]
            ax.plot(curve["lr"], curve["mean"], label=name, color=color,
                    linestyle=style[name]["linestyle"], marker="o")
            ax.fill_between(curve["lr"], curve["low"], curve["high"], color=color, alpha=0.15,
                            linewidth=0)
            bad = curve[curve["diverged"] > 0]
            if len(bad):
                marks.append((ax, bad, color))
            inits += curve["init"].dropna().tolist()
        if len(conditions) > 1:
            ax.set_title(condition, fontsize=9)
    caption += mark_coinciding(axes)
    bottom = axes[0].get_ylim()[0]  # shared: the same in every panel
    for ax, bad, color in marks:
        ax.scatter(bad["lr"], bad["init"] if loss else [bottom] * len(bad), marker="x",
                   color=color, s=40)
    for ax in axes:
        if inits and loss:
            ax.axhline(sum(inits) / len(inits), color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("learning rate")
        ax.set_ylabel(sweep.chosen_on)
    log_scale(axes[0], "x")  # shared
    if len(conditions) > 1:
        fig.suptitle(title)
        panels_legend(fig, axes)
    else:
        axes[0].set_title(title)
        legend(fig, axes[0], len(compared))
    return Plot("loss_vs_lr", title, caption, fig)
