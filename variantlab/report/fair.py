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

import pandas as pd

from ..plugin.registry import Registry
from .effects import clear
from .frame import ReportData
from .headline import tuned_leads
from .learned import nothing_learned
from .parts import pieces
from .plots import Plot, legend, new_axes, styles
from .scaling import scaling_parts
from .tables import Table, apart, fmt
from .tuned import Sweep, choose, find_sweep, lr_curves, tuned_frame
from .verdict import margin

MAX_FLIPS = 4  # ranking sentences at most


@dataclass
class FairParts:
    """What the report adds for a tuning or size sweep."""

    tables: list[Table] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    tuned: pd.DataFrame | None = None  # tuned.csv
    by_size: pd.DataFrame | None = None  # effects_by_size.csv


def fair_parts(data: ReportData, probe: str, size_probe: str) -> FairParts:
    """The tuned comparison (a run with setting axes) and the scaling views (a grid over
    model size) of ``probe``'s losses (``size_probe``: the probe counting non-embedding
    parameters); empty parts otherwise."""
    parts = FairParts()
    sweep = find_sweep(data, probe)
    if sweep is not None:
        frame = tuned_frame(sweep)
        parts.tuned = frame
        parts.tables.append(tuned_table(sweep, frame))
        parts.lines += tuned_lines(sweep, frame, not nothing_learned(data))
        picks = {a: choose(sweep, a) for a in sweep.archs}
        runs = data.rows[data.rows["run"] == sweep.run]
        parts.lines += tuned_leads(data, {a: str(c["variant"]) for a, c in picks.items()
                                          if c is not None}, runs)
        if sweep.lr_axis is not None:
            parts.plots.append(lr_plot(sweep, frame))
    scaled = scaling_parts(data, sweep, probe, size_probe)
    if scaled is not None:
        plots, lines, tables, parts.by_size = scaled
        parts.plots += plots
        parts.lines += lines
        parts.tables += tables
    return parts


def fair_piece(probe: str, size_probe: str) -> Callable[[ReportData], FairParts]:
    """A ``ProbeView.fair`` piece: :func:`fair_parts` of ``probe``'s losses."""
    return partial(fair_parts, probe=probe, size_probe=size_probe)


def fair_of(data: ReportData, registry: Registry | None = None) -> FairParts:
    """Every registered probe's ``fair`` parts, merged in rank order (tuned.csv and
    effects_by_size.csv: the first probe's that has one)."""
    merged = FairParts()
    for piece in pieces(registry, "fair"):
        got = piece(data)
        merged.tables += got.tables
        merged.lines += got.lines
        merged.plots += got.plots
        merged.tuned = merged.tuned if merged.tuned is not None else got.tuned
        merged.by_size = merged.by_size if merged.by_size is not None else got.by_size
    return merged


def _num(x: object) -> str:
    return fmt(float(x)) if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def tuned_table(sweep: Sweep, frame: pd.DataFrame) -> Table:
    cols = ["variant", *sweep.setting_axes, f"{sweep.chosen_on} (chose)",
            f"{sweep.reported_on}", "95% interval", "n seeds",
            f"vs {sweep.baseline}", "at edge", "lr sensitivity", "diverged"]
    body = []
    for r in frame.to_dict("records"):
        inter = (f"[{_num(r['low'])}, {_num(r['high'])}]" if _finite(r.get("low"))
                 else "— (one seed)" if r.get("n") == 1 else "—")
        vs = ("" if r["variant"] == sweep.baseline else
              f"{_num(r['vs_baseline'])} [{_num(r['vs_low'])}, {_num(r['vs_high'])}]")
        edge = "yes" if r["at_edge"] == True else "no"  # noqa: E712 (numpy bools, NaN)
        body.append([str(r["variant"]), *[_num(r[a]) if isinstance(r[a], float) else str(r[a])
                                          for a in sweep.setting_axes],
                     _num(r["val_loss"]), _num(r["test_loss"]), inter, _num(r["n"]), vs,
                     edge, _num(r["lr_sensitivity"]), f"{r['diverged']}/{r['runs']}"])
    note = (f"each architecture at its own best setting: chosen by the mean {sweep.chosen_on} "
            f"over seeds, reported on {sweep.reported_on}; intervals are 95% t-intervals over "
            "seeds; vs = paired difference per seed to the baseline architecture at its own "
            "best; lr sensitivity (Wortsman et al. 2023) = mean over lrs of min(loss, loss at "
            "init) minus the best loss. All numbers are in tuned.csv; see "
            "docs/fair-comparisons.md.")
    return Table("Tuned comparison", cols, body, note)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def tuned_lines(sweep: Sweep, frame: pd.DataFrame, learned: bool = True) -> list[str]:
    """The reading's sentences: the choice per architecture, what is optimistic or at an
    edge of the sweep, and where a ranking depends on the learning rate."""
    axes = ", ".join(sweep.setting_axes)
    lines = [f"Tuned comparison over {axes}: each of {len(sweep.archs)} architecture "
             f"variant(s) at its own best setting (by mean {sweep.chosen_on}, reported on "
             f"{sweep.reported_on}); see Tuned comparison and tuned.csv."]
    if sweep.optimistic:
        lines.append(f"This run has no held-out val_loss/test_loss: {sweep.chosen_on} both "
                     "chose the setting and reports it, so the tuned numbers are optimistic.")
    edge = frame[frame["at_edge"] == True]  # noqa: E712 (NaN for an architecture never chosen)
    if len(edge):
        said = [f"{r.variant} ({r.edge_axes})" for r in edge.itertuples()]
        lines.append("Best setting at the edge of the sweep for " + "; ".join(said[:4])
                     + ": widen the sweep there, the best may lie outside it.")
    if frame["n"].max() == 1:
        lines.append("One seed: the tuned numbers have no interval; run more seeds.")
    lines += ranking_flips(sweep, frame, learned)
    return lines


def _seed_values(sweep: Sweep, arch: str, chosen: pd.Series, lr: float | None = None
                 ) -> pd.DataFrame:
    """``variant`` (= ``arch``), ``seed``, ``value``: the choice metric per seed at ``arch``'s
    chosen setting, or at learning rate ``lr`` with its other settings as chosen."""
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    if lr is None:
        mine = mine[mine["variant"] == chosen["variant"]]
    else:
        for axis in sweep.setting_axes:
            mine = mine[mine[axis] == (lr if axis == sweep.lr_axis else chosen[axis])]
    return pd.DataFrame({"variant": arch, "seed": mine["seed"], "value": mine["val"]})


def ranking_flips(sweep: Sweep, frame: pd.DataFrame, learned: bool = True) -> list[str]:
    """When two architectures of the same size rank one way at some learning rate and the
    other way at their own best settings ("relu beats gelu at lr 0.001, loses at each one's
    best"), both judged on the choice metric (the test metric at the best is added). Said
    only when both orders are clear over seeds (:mod:`.verdict`); a flip whose orders are
    not clear says the two are not clearly different at their best. Nothing when no
    variant learned anything (``learned`` False)."""
    if sweep.lr_axis is None or not learned:
        return []
    by_arch = frame.set_index("variant")
    chosen, tested = by_arch["val_loss"], by_arch["test_loss"]
    picks = {a: choose(sweep, a) for a in sweep.archs}
    curves = {a: lr_curves(sweep, a, picks[a]).set_index("lr") for a in sweep.archs}
    out = []
    for i, a in enumerate(sweep.archs):
        for b in sweep.archs[i + 1:]:
            va, vb = chosen.get(a, math.nan), chosen.get(b, math.nan)
            if not sweep.same_size(a, b) or not (_finite(va) and _finite(vb)) or va == vb:
                continue
            win, lose = (a, b) if va < vb else (b, a)
            ca, cb = curves[win], curves[lose]
            flips = []
            for lr in ca.index.intersection(cb.index):
                x, y = ca.loc[lr, "mean"], cb.loc[lr, "mean"]
                x = x if _finite(x) else math.inf
                y = y if _finite(y) else math.inf
                if y < x:
                    flips.append((x - y, lr, x, y))
            if not flips:
                continue
            _, lr, x, y = max(flips, key=lambda f: f[0] if math.isfinite(f[0]) else 1e300)
            best = margin(pd.concat([_seed_values(sweep, win, picks[win]),
                                     _seed_values(sweep, lose, picks[lose])]), win, lose, True)
            at_lr = margin(pd.concat([_seed_values(sweep, lose, picks[lose], lr),
                                      _seed_values(sweep, win, picks[win], lr)]),
                           lose, win, True)
            vl, vw = apart(chosen[lose], chosen[win])
            tl, tw = apart(tested[lose], tested[win])
            on = sweep.chosen_on
            if clear(*best[1:3]) and clear(*at_lr[1:3]):
                yl, xw = apart(y, x)
                out.append(f"The ranking depends on the learning rate: {lose} beats {win} at "
                           f"lr {fmt(lr)} ({on} {yl} vs {xw}), loses at each one's best lr "
                           f"({on} {vl} vs {vw}; {sweep.reported_on} {tl} vs {tw}); both "
                           f"orders hold over {best[3]} seeds.")
            else:
                why = ("one seed: no interval, so no verdict" if best[3] < 2 else
                       f"paired 95% intervals over {best[3]} seeds include 0")
                out.append(f"At each one's best lr, {lose} and {win} are not clearly "
                           f"different ({on} {vl} vs {vw}; {sweep.reported_on} {tl} vs "
                           f"{tw}; {why}), though their order changes at lr {fmt(lr)}.")
    return out[:MAX_FLIPS]


def lr_plot(sweep: Sweep, frame: pd.DataFrame) -> Plot:
    """Loss against learning rate (log x), one line per architecture, seed spread as a
    band, diverged points marked at the loss at init."""
    title = "Loss vs learning rate"
    caption = (f"Mean {sweep.chosen_on} over seeds at each learning rate (other settings at "
               "each architecture's chosen values), min-max over seeds shaded; x: a learning "
               "rate with a diverged run (drawn at the loss at init); the dashed line is the "
               "loss at init.")
    fig, (ax,) = new_axes()
    inits = []
    for arch, style in zip(sweep.archs, styles(len(sweep.archs))):
        curve = lr_curves(sweep, arch, choose(sweep, arch))
        if not len(curve):
            continue
        ax.plot(curve["lr"], curve["mean"], label=arch, color=style["color"],
                linestyle=style["linestyle"], marker="o")
        ax.fill_between(curve["lr"], curve["low"], curve["high"], color=style["color"],
                        alpha=0.15, linewidth=0)
        bad = curve[curve["diverged"] > 0]
        if len(bad):
            ax.scatter(bad["lr"], bad["init"], marker="x", color=style["color"], s=40)
        inits += curve["init"].dropna().tolist()
    if inits:
        ax.axhline(sum(inits) / len(inits), color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel("learning rate")
    ax.set_ylabel(sweep.chosen_on)
    legend(fig, ax, len(sweep.archs))
    return Plot("loss_vs_lr", title, caption, fig)
