"""Tuned comparisons: each compared variant at its own best setting, within each condition.

Every axis of a run has a role (:mod:`variantlab.config.roles`): *compared* axes make the
architecture variants the question is about, *tuned* axes (``measure.*``, and model keys
under ``tune:``) are chosen per compared variant, *condition* axes (``data.*``, ``emb_dim``,
``n_layers``, keys under ``conditions:``) say what task or scale a comparison is made at:
variants are compared only within one condition. One learning rate (or schedule, or DyT
alpha0) is rarely best for every architecture, so comparing them at one shared setting is
unfair to all but one (Wen et al. 2025, "Fantastic pretraining optimizers and where to
find them"). The rule (docs/fair-comparisons.md), for the run's headline metric ``M``
(``compare_on``, :mod:`variantlab.config.metrics`):

1. a *group* is one compared variant in one condition; its *runs* are its variants (one
   per combination of tuned values) times the seeds;
2. for each tuned combination, the *choice score* is the mean over seeds of ``val_M``; a
   seed with no finite value (diverged, failed, missing) makes it the worst score, so a
   setting where any seed diverged is never chosen over one where all finished;
3. the chosen setting has the best score in ``M``'s direction, up to a *tie*: a setting
   whose paired differences to the best over seeds have a 95% interval that includes 0
   (within noise; one seed: only an equal score), or that reaches the best value the
   metric can take beside a best there, ties with it. One rule breaks every tie: the lower
   mean validation loss when ``M`` is not the loss and the runs recorded one (else the
   best score), then the first in sweep order; the claim then carries ``tie-broken``
   (:mod:`..claims`);
4. it is reported on ``test_M`` (never the metric that chose it): the mean over seeds and
   a 95% t-interval over seeds, ``n`` = seeds with a finite value, and the paired
   difference to the baseline compared variant of the same condition at *its* best
   setting, per seed, with a t-interval over seeds;
5. ``at_edge``: the choice is the smallest or largest value the group tried on some tuned
   axis (the best may lie outside the sweep) and no setting tied with it lies inside the
   sweep on every axis; the group's result is then *unresolved*,
   and it gets no group (``group``: the letters of :mod:`..words`, filled by the report
   from its claims: variants not separated by a clear verdict share one). A choice
   that scores the best value the metric can take (recall accuracy 1.00 on every seed) is
   never at an edge: no value beyond it can do better, so it is neither extended nor
   unresolved;
6. ``still_improving``: how many seeds of the chosen setting were still improving at the
   end of training, by the report's judgement (:mod:`..converged`: the headline metric's
   validation curve where one was recorded, else the training loss's stored row), out of
   ``seeds_judged`` (the seeds with a ``still_improving`` row; a seed without one is
   unknown, never counted as stopped; empty when no seed has one);
7. ``lr_sensitivity`` (Wortsman et al. 2023, "Small-scale proxies for large-scale
   Transformer training instabilities"): per seed, the mean over the swept learning
   rates of ``min(loss(lr), loss at init)`` minus the lowest loss over them (the other
   tuned axes at the chosen values; loss = the choice metric; a diverged run counts as
   the loss at init), averaged over seeds. For a metric where higher is better, the best
   value minus the mean over rates, a run without a finite value counting as the lowest
   value of its seed.

Runs without held-out splits (no ``val_loss``/``test_loss`` rows) fall back to
``eval_loss`` (then ``final_loss``) for both, and the report says the tuned number is
then optimistic (the metric that chose also reports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ...config.metrics import Headline, headline, headline_of
from ...config.metrics import finite as _finite
from ...config.roles import COMPARED, CONDITION, SIZE_KEYS, TUNED, numeric, stored_roles
from ...store.store import axis_default
from ..effects import clear, interval
from ..frame import ReportData
from ..labels import GridLabels, value_text

SETTING = "measure."
CHOOSE = headline().choose  # loss: the first present chooses
REPORT = headline().report  # loss: the first present reports
TUNED_COLUMNS = ("variant", "val_loss", "test_loss", "low", "high", "n", "vs_baseline",
                 "vs_low", "vs_high", "group", "unresolved", "at_edge", "edge_axes", "extended",
                 "lr_sensitivity", "diverged", "runs", "still_improving", "seeds_judged",
                 "chosen_on", "reported_on")
#: model keys that make a size axis: architectures that differ in these are different sizes
SIZE_AXES = SIZE_KEYS


@dataclass
class Sweep:
    """A run's variants grouped by role: one *group* per compared variant and condition,
    its tuned axes chosen within it (module docstring)."""

    run: str
    arch_axes: list[str]  # compared
    setting_axes: list[str]  # tuned
    values: dict[str, list[Any]]  # tuned axis -> values in sweep order (grid, then added)
    cells: pd.DataFrame  # variant, arch, compared, condition, a column per tuned axis (raw
    # values) and per compared axis (as text)
    per_seed: pd.DataFrame  # variant, seed, arch, settings..., val, test, init, diverged,
    # improving (the report's still_improving; NaN: no row)
    chosen_on: str
    reported_on: str
    baseline: str  # the baseline compared variant
    archs: list[str] = field(default_factory=list)  # groups, in sweep order
    sizes: dict[str, str] = field(default_factory=dict)  # group -> its condition
    condition_axes: list[str] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)  # tuned axis -> as written
    head: Headline = field(default_factory=headline)
    compared: dict[str, str] = field(default_factory=dict)  # group -> compared variant
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)  # condition -> values
    wanted: str = ""  # a compare_on metric the run did not record (the loss stands in)
    # group -> its choice (:func:`choose`): a report asks for each group's many times
    chosen: dict[str, pd.Series | None] = field(default_factory=dict, init=False,
                                                repr=False, compare=False)

    def same_size(self, a: str, b: str) -> bool:
        """Whether groups ``a`` and ``b`` are in the same condition (so comparable)."""
        return self.sizes.get(a, "") == self.sizes.get(b, "")

    @property
    def lr_axis(self) -> str | None:
        return next((a for a in self.setting_axes if a.rsplit(".", 1)[-1] == "lr"), None)

    @property
    def optimistic(self) -> bool:
        return self.chosen_on == self.reported_on

    @property
    def metric_columns(self) -> tuple[str, str]:
        """tuned.csv's columns of the choice score and the reported mean."""
        return self.head.val, self.head.test

    def groups_of(self, condition: str) -> list[str]:
        return [g for g in self.archs if self.sizes.get(g, "") == condition]


def arch_name(overrides: Mapping[str, Any], axes: list[str] | None = None,
              labels: GridLabels | None = None) -> str:
    """A compared variant's name: its overrides of ``axes`` (default: every non-``measure.``
    path), ``base`` without any; with the run's grid ``labels``, each grid axis of several
    values by its short name and its value's label (``attention=mha, n_pairs=4``;
    :mod:`variantlab.report.labels`)."""
    keep = (lambda p: p in axes) if axes is not None else (lambda p: not p.startswith(SETTING))
    if labels is None:
        parts = [f"{p}={value_text(v)}" for p, v in overrides.items() if keep(p)]
        return ",".join(parts) or "base"
    parts = [f"{labels.short.get(p, p)}={labels.value(p, v)}" for p, v in overrides.items()
             if keep(p) and len(labels.axes.get(p, [0, 1])) > 1]
    return ", ".join(parts) or "base"


def group_name(compared: str, condition: str) -> str:
    return f"{compared} ({condition})" if condition else compared


def find_sweep(data: ReportData, probe: str, untuned: bool = False) -> Sweep | None:
    """The first run whose variants have tuned axes, with the headline metric's values
    per variant and seed (the training ``probe``'s loss at init and divergence; None: no
    run has tuned axes, or none recorded the headline). ``untuned``: instead the first run
    with condition axes and no tuned axis (each group is then one variant as it ran)."""
    for meta in data.runs:
        mine = data.variants[data.variants["run"] == meta.run]
        overs = [dict(o) if isinstance(o, Mapping) else {} for o in mine["overrides"]]
        roles = stored_roles(meta, overs)
        tuned = [a for a, r in roles.items() if r == TUNED]
        compared = [a for a, r in roles.items() if r == COMPARED]
        conds = [a for a, r in roles.items() if r == CONDITION]
        if (bool(tuned) or not conds) if untuned else not tuned:
            continue
        records: list[dict[str, Any]] = []
        sizes: dict[str, str] = {}
        names: dict[str, str] = {}
        cond_values: dict[str, dict[str, Any]] = {}
        labels = GridLabels.of(meta)
        for variant, over, spec in zip(mine["variant"], overs, mine["spec"]):
            value = {a: over[a] if a in over else axis_default(a, meta, spec)
                     for a in [*tuned, *conds, *compared]}
            cond = ", ".join(f"{labels.short.get(a, a)}={labels.value(a, value[a])}"
                             for a in conds)
            name = arch_name(over, compared, labels)
            group = group_name(name, cond)
            sizes[group], names[group] = cond, name
            cond_values.setdefault(cond, {  # tuned.csv: a named value by its name, numbers as numbers
                a: labels.text(a, value[a]) if labels.labels_value(a, value[a]) else value[a]
                for a in conds})
            records.append({"variant": variant, "arch": group, "compared": name,
                            "condition": cond, **{a: value[a] for a in tuned},
                            **{a: value_text(value[a]) for a in compared if a not in tuned}})
        cells = pd.DataFrame(records)
        head = headline_of(meta, getattr(data, "registry", None))
        rows = data.rows[data.rows["run"] == meta.run]
        held = rows[rows["probe"] == head.probe]
        choose_col, report_col = head.columns(set(held["metric"]))
        wanted = ""
        if choose_col is None and head.name != "loss":
            wanted, head = head.name, headline()  # not recorded: the loss, said so
            held = rows[rows["probe"] == head.probe]
            choose_col, report_col = head.columns(set(held["metric"]))
        if choose_col is None:
            return None
        # validation recorded, test not (yet): a tuned sweep's test split is scored at each
        # group's choice once that is made, so the choice is on the headline all the same
        report_col = report_col or head.test
        seeds = meta.seeds or sorted({int(s) for s in rows["seed"].dropna()})
        grid = pd.MultiIndex.from_product([cells["variant"], seeds], names=["variant", "seed"])
        per_seed = pd.DataFrame(index=grid).reset_index().merge(cells, on="variant")
        trained = rows[(rows["probe"] == probe) & (rows["scope"] == "model")]
        scored = held[held["scope"] == "model"]
        tie_col = "val_loss" if head.name != "loss" else ""
        for col, part in (("val", scored[scored["metric"] == choose_col]),
                          ("tie", scored[scored["metric"] == tie_col]),
                          ("test", scored[scored["metric"] == report_col]),
                          ("diverged", trained[trained["metric"] == "diverged"]),
                          ("init", trained[(trained["metric"] == "loss")
                                           & (trained["step"] == 0)]),
                          ("improving", trained[(trained["metric"] == "still_improving")
                                                & trained["step"].isna()])):
            got = part.groupby(["variant", "seed"])["value"].mean()
            per_seed[col] = [got.get((v, s), math.nan)
                             for v, s in zip(per_seed["variant"], per_seed["seed"])]
        groups = list(dict.fromkeys(cells["arch"]))
        base_rows = cells[cells["variant"] == data.baseline]
        baseline = str(base_rows["compared"].iloc[0]) if len(base_rows) else names[groups[0]]
        written = {a: list((meta.grid or {}).get(a) or []) for a in tuned}
        values = {a: _ordered(written[a], cells[a]) for a in tuned}
        return Sweep(meta.run, compared, tuned, values, cells, per_seed, choose_col,
                     report_col, baseline, groups, sizes, conds, written, head, names,
                     cond_values, wanted)
    return None


def _missing(v: Any) -> bool:
    """A value a variant has not got (a tuned axis its model lacks: DyT's alpha0 beside
    LayerNorm)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def _ordered(grid_values: list[Any] | None, seen: pd.Series) -> list[Any]:
    out = list(grid_values or [])
    return out + [v for v in dict.fromkeys(seen) if v not in out and not _missing(v)]


def scores(sweep: Sweep, arch: str) -> pd.DataFrame:
    """Each tuned combination of group ``arch``: its variant, the choice score (mean over
    seeds of the choice metric; NaN when a seed has no finite value), ``key`` (smaller
    is better; +inf for a NaN score) and ``tie`` (the mean validation loss that breaks a
    tie on ``key`` when the headline is another metric; +inf when absent)."""
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    out = []
    for variant, part in mine.groupby("variant", sort=False):
        vals = part["val"].tolist()
        score = sum(vals) / len(vals) if vals and all(map(_finite, vals)) else math.nan
        ties = part["tie"].tolist() if "tie" in part else []
        tie = sum(ties) / len(ties) if ties and all(map(_finite, ties)) else math.inf
        out.append({"variant": variant, "score": score, "key": sweep.head.key(score),
                    "tie": tie,
                    **{a: part[a].iloc[0] for a in sweep.setting_axes}})
    return pd.DataFrame(out)


def tied(sweep: Sweep, arch: str, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """The tuned combinations of group ``arch`` tied with the best choice score (module
    docstring, rule 3): the best itself, every combination whose score is equal, and,
    with two or more seeds, every one whose paired differences to the best over seeds
    have a 95% interval that includes 0 (within noise); a combination at the best value
    the metric can take ties with a best there. Empty without a finite score."""
    table = scores(sweep, arch) if table is None else table
    if not len(table) or not math.isfinite(table["key"].min()):
        return table.iloc[0:0]
    best = table.loc[table["key"].idxmin()]
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    top = mine[mine["variant"] == best["variant"]].set_index("seed")["val"]
    keep = []
    for rec in table.itertuples():
        if not math.isfinite(rec.key):
            keep.append(False)
            continue
        if rec.key == best["key"] or (sweep.head.at_best_possible(rec.score)
                                      and sweep.head.at_best_possible(best["score"])):
            keep.append(True)
            continue
        other = mine[mine["variant"] == rec.variant].set_index("seed")["val"]
        _, low, high, n = interval((other - top).dropna())
        keep.append(n >= 2 and not clear(low, high))
    return table[keep]


def choose(sweep: Sweep, arch: str) -> pd.Series | None:
    """The chosen combination of group ``arch``: among the combinations tied with the best
    score (:func:`tied`), the lowest mean validation loss when the headline is another
    metric (``tie``), else the best score, then the first in sweep order; None when every
    combination has a seed without a finite choice metric. Without tuned axes, the group's
    variant as it ran (its seeds without a finite value drop out of its mean, as in any
    untuned comparison). Worked out once per group of a sweep."""
    if arch not in sweep.chosen:
        sweep.chosen[arch] = _choose(sweep, arch)
    return sweep.chosen[arch]


def _choose(sweep: Sweep, arch: str) -> pd.Series | None:
    table = scores(sweep, arch)
    if len(table) and not sweep.setting_axes and not math.isfinite(table["key"].min()):
        return table.iloc[0]
    best = tied(sweep, arch, table)
    if not len(best):
        return None
    return best.loc[best["tie"].idxmin()] if math.isfinite(best["tie"].min()) else \
        best.loc[best["key"].idxmin()]


def tie_broken(sweep: Sweep, arch: str) -> list[str]:
    """The variants of group ``arch`` tied with its best besides the chosen one (empty: no
    tie was broken)."""
    chosen = choose(sweep, arch)
    if chosen is None or not sweep.setting_axes:
        return []
    return [str(v) for v in tied(sweep, arch)["variant"] if v != chosen["variant"]]


def tried(sweep: Sweep, arch: str, axis: str) -> list[Any]:
    """The values of tuned ``axis`` that group ``arch`` ran, in sweep order."""
    mine = set(sweep.cells.loc[sweep.cells["arch"] == arch, axis].map(value_text))
    return [v for v in sweep.values[axis] if value_text(v) in mine]


def _edges(sweep: Sweep, arch: str, combo: pd.Series) -> list[str]:
    out = []
    for axis in sweep.setting_axes:
        values = tried(sweep, arch, axis)
        if len(values) < 2:
            continue
        nums = numeric(values)
        ends = (nums[0], nums[-1]) if nums is not None else (values[0], values[-1])
        if combo[axis] in ends:
            out.append(axis)
    return out


def at_edge(sweep: Sweep, chosen: pd.Series) -> list[str]:
    """Tuned axes (with more than one value tried by the chosen variant's group) whose
    chosen value is the smallest or the largest tried (the first or last listed, for
    values that do not compare). None when the choice scores the best value the metric
    can take (recall accuracy 1.00 on every seed): nothing beyond the edge can beat it;
    none either when a combination tied with the best (:func:`tied`) sits inside the
    sweep on every axis: the best is then bracketed."""
    if sweep.head.at_best_possible(chosen["score"]):
        return []
    arch = sweep.cells.loc[sweep.cells["variant"] == chosen["variant"], "arch"].iloc[0]
    out = _edges(sweep, arch, chosen)
    if out and any(not _edges(sweep, arch, combo) for _, combo in tied(sweep, arch).iterrows()):
        return []
    return out


def added(sweep: Sweep, arch: str) -> dict[str, list[Any]]:
    """Tuned axis -> the values group ``arch`` ran beyond the grid (edge extension)."""
    out = {}
    for axis in sweep.setting_axes:
        grid = {value_text(v) for v in sweep.grid.get(axis, [])}
        extra = [v for v in tried(sweep, arch, axis)
                 if grid and value_text(v) not in grid and not _missing(v)]
        if extra:
            out[axis] = extra
    return out


def _at(sweep: Sweep, chosen: pd.Series) -> pd.DataFrame:
    mine = sweep.per_seed[sweep.per_seed["variant"] == chosen["variant"]]
    return mine.set_index("seed")


def at_chosen(sweep: Sweep, arch: str, chosen: pd.Series | None, lr: str) -> pd.DataFrame:
    """Group ``arch``'s runs per seed with every tuned axis but ``lr`` at its ``chosen``
    value (an axis the group lacks, such as alpha0 beside LayerNorm, is not filtered)."""
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    if chosen is not None:
        for axis in sweep.setting_axes:
            if axis != lr and not _missing(chosen[axis]):
                mine = mine[mine[axis] == chosen[axis]]
    return mine


def improving(values: pd.Series) -> dict[str, float]:
    """``still_improving`` (seeds of ``values`` at 1; NaN when none has a value) and
    ``seeds_judged`` (seeds with a value) of one group's chosen setting (module
    docstring, rule 6)."""
    known = values[values.map(_finite)]
    return {"still_improving": float((known > 0.5).sum()) if len(known) else math.nan,
            "seeds_judged": float(len(known))}


def lr_sensitivity(sweep: Sweep, arch: str, chosen: pd.Series) -> float:
    """Wortsman et al. 2023's LR sensitivity of group ``arch`` (module docstring, rule 7);
    NaN without an lr axis of two or more values or (lower is better) the loss at init."""
    lr = sweep.lr_axis
    if lr is None or len(tried(sweep, arch, lr)) < 2:
        return math.nan
    mine = at_chosen(sweep, arch, chosen, lr)
    per_seed = []
    for _, part in mine.groupby("seed"):
        finite = [v for v in part["val"] if _finite(v)]
        if not finite:
            continue
        if sweep.head.lower_is_better:
            init = part["init"].dropna()
            if not len(init):
                return math.nan
            l0 = float(init.mean())
            losses = [v if _finite(v) else math.inf for v in part["val"]]
            per_seed.append(sum(min(v, l0) for v in losses) / len(losses) - min(finite))
        else:
            vals = [v if _finite(v) else min(finite) for v in part["val"]]
            per_seed.append(max(finite) - sum(vals) / len(vals))
    return sum(per_seed) / len(per_seed) if per_seed else math.nan


def tuned_frame(sweep: Sweep) -> pd.DataFrame:
    """tuned.csv: one row per compared variant per condition (module docstring)."""
    val_col, test_col = sweep.metric_columns
    chosen = {a: choose(sweep, a) for a in sweep.archs}
    records = []
    for arch in sweep.archs:
        c, cond = chosen[arch], sweep.sizes.get(arch, "")
        mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
        bad = int(((mine["diverged"] == 1) | ~mine["val"].map(_finite)).sum())
        more = added(sweep, arch)
        rec: dict[str, Any] = {"_group": arch, "variant": sweep.compared.get(arch, arch),
                               **sweep.conditions.get(cond, {}), "runs": len(mine),
                               "diverged": bad, "chosen_on": sweep.chosen_on,
                               "reported_on": sweep.reported_on, "unresolved": True,
                               "extended": "; ".join(f"{a}: {', '.join(map(value_text, v))}"
                                                     for a, v in more.items())}
        records.append(rec)
        if c is None:
            continue
        at = _at(sweep, c)
        test = at["test"]
        mean, low, high, n = interval(test[test.map(_finite)])
        rec.update({a: c[a] for a in sweep.setting_axes})
        rec.update({val_col: c["score"], test_col: mean, "low": low, "high": high, "n": n,
                    **improving(at["improving"])})
        base_group = group_name(sweep.baseline, cond)
        base = chosen.get(base_group)
        if base is not None and arch != base_group:
            diff = (test - _at(sweep, base)["test"]).where(lambda d: d.map(_finite))
            rec["vs_baseline"], rec["vs_low"], rec["vs_high"], _ = interval(diff)
        edges = at_edge(sweep, c)
        rec.update(at_edge=bool(edges), unresolved=bool(edges), edge_axes=" ".join(edges),
                   lr_sensitivity=lr_sensitivity(sweep, arch, c))
    columns = ["variant", *sweep.condition_axes, *sweep.setting_axes, val_col, test_col,
               *TUNED_COLUMNS[3:]]
    return pd.DataFrame(records, columns=columns)


def lr_curves(sweep: Sweep, arch: str, chosen: pd.Series | None) -> pd.DataFrame:
    """``lr, mean, low, high, diverged`` of group ``arch``'s choice metric at each swept
    lr (other tuned axes at its chosen values; seed spread = min and max over seeds)."""
    lr = sweep.lr_axis
    assert lr is not None
    mine = at_chosen(sweep, arch, chosen, lr)
    out = []
    for value, part in mine.groupby(lr, sort=True):
        ok = part["val"][part["val"].map(_finite)]
        n_bad = int(len(part) - len(ok) + (part["diverged"] == 1)[part["val"].map(_finite)].sum())
        out.append({"lr": float(value), "mean": ok.mean() if len(ok) else math.nan,
                    "low": ok.min() if len(ok) else math.nan,
                    "high": ok.max() if len(ok) else math.nan, "diverged": n_bad,
                    "init": part["init"].mean()})
    return pd.DataFrame(out, columns=["lr", "mean", "low", "high", "diverged", "init"])
