"""The report's claims as data: one row per comparison it makes (verdicts.csv).

Every verdict word of a report (``lower``, ``higher``, ``equal within ±δ``, groups,
"holds", "flips") is rendered from these rows (:mod:`.words`); nothing else decides one.

**Pairs.** The compared variants are the arms: with tuned or condition axes each compared
variant in each condition at its chosen setting (:mod:`.fair.tuned`), reported on the
headline metric's test value; otherwise every variant as it ran, on the headline metric
(its test value, else the older held-out or final columns). Within each condition every
pair ``(a, b)`` is compared on the paired difference ``a - b`` over seeds (a seed pairs two
runs on the same initialisation and batches; differences below float rounding count as
0, :func:`.effects.rounding`): ``estimate`` and its 95% t-interval ``low``, ``high``, a
paired t-test's ``p``, and ``holm_p``, the p-value Holm-adjusted over all pairs of the
condition, so each condition's family-wise error is at most 5% (a condition of more than
MAX_ARMS compared variants pairs each with the baseline only, and Holm runs over those).

**Verdict**, in this order:

- ``not estimated``: no seed paired, or one seed (no interval);
- ``unresolved``: an arm's best setting sits at an edge of its sweep;
- ``lower`` / ``higher``: ``holm_p < 0.05``; ``a``'s value is lower / higher than ``b``'s
  (the metric's direction says which is better);
- ``equal within ±δ``: the 90% interval lies inside ``±δ`` (two one-sided tests at 5%),
  ``δ`` the experiment's ``equivalence_margin`` for the headline metric
  (:data:`DEFAULT_MARGINS`);
- ``not clearly different``: otherwise; a difference up to ``max(|low|, |high|)`` is not
  ruled out.

Each row also has ``detectable``, the smallest difference its seeds detect with 80%
power from the observed spread of the paired differences, and ``seeds_for_delta``
(:mod:`.stats`).

**Caveats** name what qualifies a row: ``best at an edge``, ``tie-broken`` (the chosen
setting tied with another, :func:`.fair.tuned.tied`), ``still improving (k of n)``,
``seeds that did not learn (k of n)`` (:func:`.learned.seed_learning`), ``one rate only
(not tuned)``, ``averaged over (axes)``. Recall rows carry ``solved_share``: the seeds
that solved the task (a ``steps_to_solve`` row: validation recall reached 0.99).

**Other lengths.** A run that also scores its models at other lengths (``eval_lengths``:
``test_loss_at_256``) gets its pairs again on each, ``kind`` ``length``: the same arms at the
settings chosen at the training length, Holm over each condition's pairs of one length.

**Averages.** A grid's main effects (:mod:`.effects`) are averages over the grid's other
axes; with two or more axes those on the pairs' metric are rows too (``kind`` ``average``, condition
``averaged``), judged on their 95% interval and never a verdict on one condition.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ..config.metrics import CEILINGS, Headline, headline_of
from ..config.metrics import finite as _finite
from .effects import Effects, rounding
from .fair.tuned import Sweep, at_edge, choose, find_sweep, improving, tie_broken
from .frame import ReportData
from .learned import PROBE, seed_learning
from .parts import pieces
from .stats import ALPHA, detectable, equivalent, holm, interval, p_value, pandas_std, seeds_for

VERDICT_COLUMNS = ("condition", "a", "b", "metric", "a_setting", "b_setting", "estimate",
                   "low", "high", "n_seeds", "verdict", "caveats")
EXTRA_COLUMNS = ("kind", "p", "holm_p", "low90", "high90", "delta", "sd", "detectable",
                 "seeds_for_delta", "a_mean", "b_mean", "solved_share")
COLUMNS = VERDICT_COLUMNS + EXTRA_COLUMNS
#: the equivalence margin δ per headline metric when the experiment sets none: 0.02 nats
#: of loss (perplexity within 2%: exp(0.02) = 1.020), 2 points of recall accuracy (0.02)
DEFAULT_MARGINS: dict[str, float] = {"loss": 0.02, "recall_accuracy": 0.02}
CLEAR = ("lower", "higher")
AVERAGED = "averaged"
#: row kinds tested on their Holm-adjusted p (families of pairs within a condition)
HOLM_KINDS = ("pair", "length")
MAX_ARMS = 24  # all pairs up to this many arms in a condition (276 pairs); beyond, vs the baseline


def stored_doc(data: ReportData) -> dict[str, Any]:
    """The first run's experiment text as it ran (its meta's ``yaml``), safely loaded;
    empty when there is none or it does not parse."""
    for meta in data.runs[:1]:
        try:
            doc = yaml.safe_load(meta.yaml or "") or {}
        except yaml.YAMLError:
            doc = {}
        return doc if isinstance(doc, dict) else {}
    return {}


def margins_of(data: ReportData) -> dict[str, float]:
    """Headline metric -> δ: the first run's ``equivalence_margin`` (read from the
    experiment text it stored) over :data:`DEFAULT_MARGINS`."""
    out = dict(DEFAULT_MARGINS)
    given = stored_doc(data).get("equivalence_margin")
    if isinstance(given, dict):
        out.update({str(k): float(v) for k, v in given.items() if _finite(v) and float(v) > 0})
    return out


@dataclass
class Arm:
    """One side of a comparison: a compared variant in a condition at its setting, with
    its test values per seed and what qualifies them."""

    name: str
    condition: str
    setting: str
    values: pd.Series  # seed -> value
    unresolved: bool = False
    caveats: list[str] = field(default_factory=list)
    solved: str = ""  # "k/n" seeds solved (recall), else ""
    variant: str = ""  # the stored variant of its chosen setting ("" for a plain arm)


def _setting(sweep: Sweep, chosen: pd.Series) -> str:
    return ", ".join(f"{a.rsplit('.', 1)[-1]}={chosen[a]:g}" if isinstance(chosen[a], float)
                     else f"{a.rsplit('.', 1)[-1]}={chosen[a]}" for a in sweep.setting_axes
                     if chosen[a] is not None and chosen[a] == chosen[a])


def _learning(frame: pd.DataFrame, variant: str, seeds: Sequence[Any]) -> str:
    """The caveat for ``variant``'s ``seeds`` that did not learn, from
    :func:`seed_learning` (``frame``, made once per report)."""
    mine = frame[(frame["variant"] == variant) & frame["seed"].isin(list(seeds))]
    stuck = int((~mine["learned"].astype(bool)).sum())
    return f"seeds that did not learn ({stuck} of {len(mine)})" if stuck else ""


def _solved(data: ReportData, head: Headline, variant: str, values: pd.Series) -> str:
    """``k/n``: of the seeds with a value, those the probe counted as solved (a
    ``steps_to_solve`` row); empty for a metric without a ceiling or a store without
    those rows."""
    if head.name not in CEILINGS or head.lower_is_better:
        return ""
    rows = data.rows[(data.rows["metric"] == "steps_to_solve") & (data.rows["probe"] == PROBE)]
    if not len(rows):
        return ""
    seeds = [s for s, v in values.items() if _finite(v)]
    mine = rows[(rows["variant"] == variant) & rows["seed"].isin(seeds)
                & rows["value"].map(_finite)]
    return f"{mine['seed'].nunique()}/{len(seeds)}" if seeds else ""


def sweep_arms(data: ReportData, sweep: Sweep) -> list[Arm]:
    """The compared variants of a tuned or condition sweep at their chosen settings."""
    arms = []
    learning = seed_learning(data)
    for group in sweep.archs:
        chosen = choose(sweep, group)
        if chosen is None:  # every setting has a seed without a finite value: no pair
            arms.append(Arm(sweep.compared.get(group, group), sweep.sizes.get(group, ""), "",
                            pd.Series(dtype=float), False,
                            ["no setting finished on every seed"]))
            continue
        mine = sweep.per_seed[sweep.per_seed["variant"] == chosen["variant"]]
        values = mine.set_index("seed")["test"]
        caveats = []
        edges = at_edge(sweep, chosen) if sweep.setting_axes else []
        if edges:
            caveats.append(f"best at an edge ({' '.join(edges)})")
        if tie_broken(sweep, group):
            caveats.append("tie-broken")
        judged = improving(mine.set_index("seed")["improving"])
        if _finite(judged["still_improving"]) and judged["still_improving"] > 0:
            caveats.append(f"still improving ({judged['still_improving']:.0f} of "
                           f"{judged['seeds_judged']:.0f})")
        stuck = _learning(learning, str(chosen["variant"]), list(values.index))
        if stuck:
            caveats.append(stuck)
        if not sweep.setting_axes:
            caveats.append("one rate only (not tuned)")
        arms.append(Arm(sweep.compared.get(group, group), sweep.sizes.get(group, ""),
                        _setting(sweep, chosen), values, bool(edges), caveats,
                        _solved(data, sweep.head, str(chosen["variant"]), values),
                        str(chosen["variant"])))
    return arms


def length_metrics(data: ReportData, metric: str) -> list[str]:
    """The metrics that score ``metric`` at other lengths (``eval_lengths``:
    ``test_loss_at_256``), shortest first."""
    pattern = re.compile(re.escape(metric) + r"_at_(\d+)$")
    found = {m: int(hit.group(1)) for m in data.rows["metric"].unique()
             if isinstance(m, str) and (hit := pattern.match(m))}
    return sorted(found, key=found.__getitem__)


def length_rows(data: ReportData, arms: list[Arm], metric: str, delta: float,
                baseline: str = "") -> list[dict[str, Any]]:
    """The pairs again on each of ``metric``'s other lengths (:func:`length_metrics`),
    every arm at the setting chosen at the training length (the test at other lengths
    never chooses): ``kind`` ``length``, Holm over each condition's pairs of one length."""
    rows = data.rows[(data.rows["probe"] == PROBE) & (data.rows["scope"] == "model")]
    out: list[dict[str, Any]] = []
    for name in length_metrics(data, metric):
        part = rows[rows["metric"] == name]
        by_variant = dict(tuple(part.groupby("variant", sort=False)))
        moved = [replace(a, values=by_variant[a.variant].groupby("seed")["value"].mean(),
                         solved="") for a in arms if a.variant in by_variant]
        for row in pair_rows([a for a in moved if len(a.values)], name, delta, baseline):
            row["kind"] = "length"
            out.append(row)
    return out


def plain_arms(data: ReportData) -> tuple[Headline, str, list[Arm]]:
    """Every variant as it ran, on the first run's headline metric (its test column,
    else the older held-out or final columns the rows have)."""
    meta = data.runs[0] if data.runs else None
    head = headline_of(meta, getattr(data, "registry", None))
    held = data.rows[(data.rows["probe"] == head.probe) & (data.rows["scope"] == "model")]
    _, column = head.columns(set(held["metric"]))
    if column is None:
        return head, "", []
    part = held[held["metric"] == column]
    by_variant = dict(tuple(part.groupby("variant", sort=False)))
    learning = seed_learning(data)
    learning_of = dict(tuple(learning.groupby("variant", sort=False)))  # one filter, not V
    arms = []
    for variant in data.order:
        if variant not in by_variant:
            continue
        values = by_variant[variant].groupby("seed")["value"].mean()
        if not len(values):
            continue
        caveats = [c for c in [_learning(learning_of.get(variant, learning.iloc[:0]), variant,
                                         list(values.index))] if c]
        if head.probe == PROBE:
            caveats.append("one rate only (not tuned)")
        arms.append(Arm(variant, "", "", values, False, caveats,
                        _solved(data, head, variant, values)))
    return head, column, arms


def _caveats(a: Arm, b: Arm) -> str:
    said: dict[str, list[str]] = {}
    for arm, tag in ((a, "a"), (b, "b")):
        for c in arm.caveats:
            said.setdefault(c, []).append(tag)
    return "; ".join(c if c.startswith("one rate") or len(tags) == 2 else
                     f"{c} [{tags[0]}: {a.name if tags[0] == 'a' else b.name}]"
                     for c, tags in said.items())


def measured_row(condition: str, a: str, b: str, metric: str, kind: str,
                 diffs: pd.Series | np.ndarray, caveats: str = "", delta: float = math.nan
                 ) -> dict[str, Any]:
    """One comparison's row from its paired per-seed differences ``diffs`` (``a`` minus
    ``b``, or the log of ``a`` over ``b``): the 95% and 90% t-intervals, the paired t-test's
    ``p`` and the seed power numbers; ``verdict`` is left for :func:`verdict_of`, which for
    a ``kind`` other than ``pair`` tests the unadjusted ``p``."""
    diffs = np.asarray(diffs, dtype=float)
    estimate, low, high, n = interval(diffs)
    _, low90, high90, _ = interval(diffs, 0.90)
    sd = pandas_std(diffs) if n >= 2 else math.nan
    return {"condition": condition, "a": a, "b": b, "metric": metric, "a_setting": "",
            "b_setting": "", "estimate": estimate, "low": low, "high": high, "n_seeds": n,
            "verdict": "", "caveats": caveats, "kind": kind, "p": p_value(diffs),
            "holm_p": math.nan, "low90": low90, "high90": high90, "delta": delta, "sd": sd,
            "detectable": detectable(sd, n), "seeds_for_delta": seeds_for(sd, delta),
            "a_mean": math.nan, "b_mean": math.nan, "solved_share": ""}


def by_seed(arm: Arm) -> dict[Any, float]:
    """An arm's values as a dict, seed -> value."""
    return dict(zip(arm.values.index, arm.values.to_numpy(dtype=float)))


def pair_row(a: Arm, b: Arm, metric: str, delta: float, tol: float,
             values: dict[int, dict[Any, float]]) -> dict[str, Any]:
    """One pair's row before Holm (``holm_p`` is filled per condition); ``values``: each
    arm's :func:`by_seed` by ``id`` (made once per condition: an arm is in many pairs)."""
    va, vb = values[id(a)], values[id(b)]
    # the seeds both have, in a's order, both finite
    seeds = [s for s, v in va.items() if s in vb and math.isfinite(v) and math.isfinite(vb[s])]
    both_a = np.array([va[s] for s in seeds], dtype=float)
    both_b = np.array([vb[s] for s in seeds], dtype=float)
    diff = both_a - both_b
    diff = np.where(np.abs(diff) > tol, diff, 0.0)
    row = measured_row(a.condition, a.name, b.name, metric, "pair", diff, _caveats(a, b), delta)
    n = row["n_seeds"]
    row.update({"a_setting": a.setting, "b_setting": b.setting,
                "a_mean": float(both_a.mean()) if n else math.nan,
                "b_mean": float(both_b.mean()) if n else math.nan,
                "solved_share": f"{a.solved} vs {b.solved}" if a.solved or b.solved else "",
                "_unresolved": a.unresolved or b.unresolved})
    return row


def verdict_of(row: dict[str, Any]) -> str:
    """The verdict word of one row (module docstring)."""
    if row["n_seeds"] < 2:
        return "not estimated"
    if row.get("_unresolved"):
        return "unresolved"
    p = row["holm_p"] if row["kind"] in HOLM_KINDS else row["p"]
    if _finite(p) and p < ALPHA and row["estimate"] != 0:
        return "lower" if row["estimate"] < 0 else "higher"
    if equivalent(row["low90"], row["high90"], row["delta"]):
        return f"equal within ±{row['delta']:g}"
    return "not clearly different"


def pair_rows(arms: list[Arm], metric: str, delta: float, baseline: str = ""
              ) -> list[dict[str, Any]]:
    """Every pair of arms within each condition, Holm-adjusted per condition; a condition
    of more than MAX_ARMS arms pairs each with its ``baseline`` arm only (else the first)."""
    tol = rounding(pd.concat([a.values for a in arms])) if arms else 0.0
    rows: list[dict[str, Any]] = []
    for cond in dict.fromkeys(a.condition for a in arms):
        mine = [a for a in arms if a.condition == cond]
        pairs = list(combinations(mine, 2))
        if len(mine) > MAX_ARMS:
            base = next((a for a in mine if a.name == baseline), mine[0])
            pairs = [(base, a) for a in mine if a is not base]
        values = {id(arm): by_seed(arm) for arm in mine}
        family = [pair_row(a, b, metric, delta, tol, values) for a, b in pairs]
        tested = [r for r in family if not r["_unresolved"] and r["n_seeds"] >= 2]
        for r, adjusted in zip(tested, holm([r["p"] for r in tested])):
            r["holm_p"] = adjusted
        rows += family
    return rows


def average_rows(effects: Effects | None, metric: str) -> list[dict[str, Any]]:
    """A grid's main effects on the pairs' ``metric`` (else the grid's headline metric) as
    ``average`` rows (module docstring); none for a grid of one axis (its effects are the
    pairs)."""
    if effects is None or len(effects.grid.axes) < 2 or not effects.grid.metrics:
        return []
    present = set(effects.main["metric"])
    metric = metric if metric in present else effects.grid.metrics[0][0]
    rows = []
    main = effects.main[effects.main["metric"] == metric]
    for r in main.itertuples():
        others = [a for a in effects.grid.axes if a != r.axis]
        base = effects.grid.baseline[str(r.axis)]
        rows.append({"condition": AVERAGED, "a": f"{r.axis}={r.value}", "b": f"{r.axis}={base}",
                     "metric": r.metric, "a_setting": "", "b_setting": "",
                     "estimate": r.effect, "low": r.low, "high": r.high, "n_seeds": int(r.n),
                     "verdict": "", "caveats": f"averaged over ({', '.join(others)})",
                     "kind": "average", "p": math.nan, "holm_p": math.nan,
                     "low90": math.nan, "high90": math.nan, "delta": math.nan, "sd": math.nan,
                     "detectable": math.nan, "seeds_for_delta": math.nan,
                     "a_mean": math.nan, "b_mean": math.nan, "solved_share": ""})
    for r in rows:  # the 95% interval alone: an average is described, never tested
        clear = _finite(r["low"]) and _finite(r["high"]) and (r["low"] > 0 or r["high"] < 0)
        r["verdict"] = ("not estimated" if r["n_seeds"] < 2 else
                        ("lower" if r["estimate"] < 0 else "higher") if clear else
                        "not clearly different")
    return rows


def compute_claims(data: ReportData, effects: Effects | None = None) -> pd.DataFrame:
    """Every comparison of the report, one row each (:data:`COLUMNS`)."""
    margins = margins_of(data)
    sweep = find_sweep(data, PROBE) or find_sweep(data, PROBE, untuned=True)
    if sweep is not None:
        return sweep_claims(data, sweep, average_rows(effects, sweep.reported_on)
                            + probe_rows(data))
    head, metric, arms = plain_arms(data)
    return _frame(pair_rows(arms, metric, margins.get(head.name, math.nan), data.baseline)
                  + average_rows(effects, metric) + probe_rows(data))


def probe_rows(data: ReportData) -> list[dict[str, Any]]:
    """Every registered probe's ``claims`` rows (:class:`variantlab.plugin.probe.ProbeView`),
    e.g. the timing probe's (``kind`` ``timing``) and the dynamics probe's (``dynamics``)."""
    return [dict(row) for piece in pieces(getattr(data, "registry", None), "claims")
            for row in piece(data)]


def sweep_claims(data: ReportData, sweep: Sweep, more: Sequence[dict[str, Any]] = ()
                 ) -> pd.DataFrame:
    """The pair rows of a tuned or condition ``sweep`` (then ``more`` rows)."""
    delta = margins_of(data).get(sweep.head.name, math.nan)
    arms = sweep_arms(data, sweep)
    return _frame(pair_rows(arms, sweep.reported_on, delta, sweep.baseline)
                  + length_rows(data, arms, sweep.reported_on, delta, sweep.baseline)
                  + list(more))


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    for r in rows:
        if not r["verdict"]:
            r["verdict"] = verdict_of(r)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def claims_table(data: ReportData, effects: Effects | None = None) -> pd.DataFrame:
    """The report's claims (:func:`compute_claims`), computed once per report data: the
    reading, the tables and anything else that says a verdict read these rows."""
    cached = data.__dict__.get("_claims")
    if cached is None:
        if effects is None:
            from .effects import compute_effects
            from .tables import seed_metrics

            effects = compute_effects(data, seed_metrics(data, data.registry))
        cached = data.__dict__["_claims"] = compute_claims(data, effects)
    return cached


def seeds_frame(data: ReportData) -> pd.DataFrame:
    """seeds.csv: one row per variant and seed: its compared name, condition and setting
    (``chosen``: the setting its group's verdicts are on), every summary metric the
    training and probe rows hold for it (model-scope scalars), whether it learned
    (:func:`.learned.seed_learning`)."""
    rows = data.rows[(data.rows["scope"] == "model") & data.rows["step"].isna()]
    if not len(rows):
        return pd.DataFrame(columns=["variant", "seed"])
    wide = rows.pivot_table(index=["variant", "seed"], columns="metric", values="value",
                            aggfunc="mean").reset_index()
    wide.columns.name = None
    sweep = find_sweep(data, PROBE) or find_sweep(data, PROBE, untuned=True)
    info = pd.DataFrame({"variant": data.order, "compared": data.order, "condition": "",
                         "setting": "", "chosen": True})
    if sweep is not None:
        picked = {str(c["variant"]) for g in sweep.archs if (c := choose(sweep, g)) is not None}
        cells = sweep.cells
        info = pd.DataFrame({
            "variant": cells["variant"], "compared": cells["compared"],
            "condition": cells["condition"],
            "setting": [", ".join(f"{a.rsplit('.', 1)[-1]}={r[a]}" for a in sweep.setting_axes)
                        for _, r in cells.iterrows()],
            "chosen": cells["variant"].isin(picked)})
    learning = seed_learning(data)[["variant", "seed", "learned"]]
    out = info.merge(wide, on="variant", how="inner").merge(learning, on=["variant", "seed"],
                                                            how="left")
    lead = ["variant", "compared", "condition", "setting", "chosen", "seed", "learned"]
    rest = [c for c in out.columns if c not in lead]
    first = [c for c in ("test_loss", "test_recall_accuracy", "steps_to_solve") if c in rest]
    return out[lead + first + [c for c in rest if c not in first]]


def csv_text(frame: pd.DataFrame) -> str:
    """A claims or seeds frame as CSV text (formula-safe, 6 significant digits)."""
    from .tables import csv_safe

    return csv_safe(frame).to_csv(index=False, float_format="%.6g", lineterminator="\n")


__all__ = ["AVERAGED", "CLEAR", "COLUMNS", "DEFAULT_MARGINS", "HOLM_KINDS", "VERDICT_COLUMNS",
           "Arm", "claims_table", "compute_claims", "csv_text", "length_metrics", "length_rows",
           "margins_of", "measured_row",
           "probe_rows", "seeds_frame", "stored_doc", "sweep_claims", "verdict_of"]
