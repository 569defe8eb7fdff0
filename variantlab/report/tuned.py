"""Tuned comparisons: each architecture variant at its own best setting.

A sweep whose variants set probe settings (``measure.<probe>.<key>``, *setting axes*)
besides model keys (*architecture axes*) is read as a tuning sweep: one learning rate
(or schedule, or step count) is rarely best for every architecture, so comparing them at
one shared setting is unfair to all but one (Wen et al. 2025, "Fantastic pretraining
optimizers and where to find them"). The rule (docs/fair-comparisons.md):

1. an *architecture variant* is a value of every architecture axis; its *runs* are its
   variants (one per combination of setting values) times the seeds;
2. for each setting combination, the *choice score* is the mean over seeds of
   ``val_loss``; a seed with no finite value (diverged, failed, missing) counts as +inf,
   so a setting where any seed diverged is never chosen over one where all finished;
3. the chosen setting is the one with the lowest score (ties: the first in sweep order);
4. it is reported on ``test_loss`` (never the metric that chose it): the mean over seeds
   and a 95% t-interval over seeds, ``n`` = seeds with a finite test loss, and the paired
   difference to the baseline architecture at *its* best setting, per seed, with a
   t-interval over seeds;
5. ``at_edge``: the choice is the smallest or largest value tried on some axis (the best
   may lie outside the sweep);
6. ``lr_sensitivity`` (Wortsman et al. 2023, "Small-scale proxies for large-scale
   Transformer training instabilities"): per seed, the mean over the swept learning
   rates of ``min(loss(lr), loss at init)`` minus the lowest loss over them (the other
   setting axes at the chosen values; loss = the choice metric; a diverged run counts as
   the loss at init), averaged over seeds.

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

from .effects import interval
from .frame import ReportData
from .labels import GridLabels, value_text

SETTING = "measure."
CHOOSE = ("val_loss", "eval_loss", "final_loss")  # the first present chooses
REPORT = ("test_loss", "eval_loss", "final_loss")  # the first present reports
TUNED_COLUMNS = ("variant", "val_loss", "test_loss", "low", "high", "n", "vs_baseline",
                 "vs_low", "vs_high", "at_edge", "edge_axes", "lr_sensitivity", "diverged",
                 "runs", "chosen_on", "reported_on")


#: model keys that make a size axis: architectures that differ in these are different sizes
SIZE_AXES = ("emb_dim", "n_layers")


@dataclass
class Sweep:
    """A run's variants split into architecture and setting axes."""

    run: str
    arch_axes: list[str]
    setting_axes: list[str]
    values: dict[str, list[Any]]  # setting axis -> values in sweep order
    cells: pd.DataFrame  # variant, arch, one column per setting axis (raw values)
    per_seed: pd.DataFrame  # variant, seed, arch, settings..., val, test, init, diverged
    chosen_on: str
    reported_on: str
    baseline: str  # the baseline architecture
    archs: list[str] = field(default_factory=list)  # in sweep order
    sizes: dict[str, str] = field(default_factory=dict)  # arch -> its size-axis values

    def same_size(self, a: str, b: str) -> bool:
        """Whether architectures ``a`` and ``b`` have the same values on every size axis."""
        return self.sizes.get(a, "") == self.sizes.get(b, "")

    @property
    def lr_axis(self) -> str | None:
        return next((a for a in self.setting_axes if a.rsplit(".", 1)[-1] == "lr"), None)

    @property
    def optimistic(self) -> bool:
        return self.chosen_on == self.reported_on


def arch_name(overrides: Mapping[str, Any], labels: GridLabels | None = None) -> str:
    """An architecture variant's name: its model overrides, ``base`` without any; with the
    run's grid ``labels``, each grid axis of several values by its short name and its
    value's label (``attention=mha, n_pairs=4``; :mod:`.labels`)."""
    if labels is None:
        parts = [f"{p}={value_text(v)}" for p, v in overrides.items()
                 if not p.startswith(SETTING)]
        return ",".join(parts) or "base"
    parts = [f"{labels.short.get(p, p)}={labels.value(p, v)}" for p, v in overrides.items()
             if not p.startswith(SETTING) and len(labels.axes.get(p, [0, 1])) > 1]
    return ", ".join(parts) or "base"


def find_sweep(data: ReportData, probe: str) -> Sweep | None:
    """The first run whose variants have setting axes, with the losses of ``probe`` (the
    probe that trains) per variant and seed (None: no run has setting axes, or none
    trained)."""
    for meta in data.runs:
        mine = data.variants[data.variants["run"] == meta.run]
        overs = [dict(o) if isinstance(o, Mapping) else {} for o in mine["overrides"]]
        axes = list(dict.fromkeys(p for o in overs for p in o))
        setting = [a for a in axes if a.startswith(SETTING)]
        if not setting:
            continue
        records, sizes = [], {}
        labels = GridLabels.of(meta)
        for variant, over in zip(mine["variant"], overs):
            rec = {"variant": variant, "arch": arch_name(over, labels)}
            sizes[rec["arch"]] = ",".join(f"{a}={value_text(over[a])}" for a in SIZE_AXES
                                          if a in over)
            for axis in setting:
                _, probe, key = axis.split(".", 2)
                rec[axis] = over.get(axis, (meta.measure.get(probe) or {}).get(key))
            records.append(rec)
        cells = pd.DataFrame(records)
        rows = data.rows[(data.rows["run"] == meta.run) & (data.rows["probe"] == probe)]
        metrics = set(rows["metric"])
        choose = next((m for m in CHOOSE if m in metrics), None)
        report = next((m for m in REPORT if m in metrics), None)
        if choose is None or report is None:
            return None
        seeds = meta.seeds or sorted({int(s) for s in rows["seed"].dropna()})
        grid = pd.MultiIndex.from_product([cells["variant"], seeds], names=["variant", "seed"])
        per_seed = pd.DataFrame(index=grid).reset_index().merge(cells, on="variant")
        model = rows[rows["scope"] == "model"]
        for col, metric in (("val", choose), ("test", report), ("diverged", "diverged")):
            part = model[model["metric"] == metric].groupby(["variant", "seed"])["value"].mean()
            per_seed[col] = [part.get((v, s), math.nan)
                             for v, s in zip(per_seed["variant"], per_seed["seed"])]
        init = model[(model["metric"] == "loss") & (model["step"] == 0)]
        first = init.groupby(["variant", "seed"])["value"].mean()
        per_seed["init"] = [first.get((v, s), math.nan)
                            for v, s in zip(per_seed["variant"], per_seed["seed"])]
        archs = list(dict.fromkeys(cells["arch"]))
        base_rows = cells[cells["variant"] == data.baseline]
        baseline = str(base_rows["arch"].iloc[0]) if len(base_rows) else archs[0]
        values = {a: _ordered(meta.grid.get(a) if meta.grid else None, cells[a]) for a in setting}
        return Sweep(meta.run, [a for a in axes if not a.startswith(SETTING)], setting, values,
                     cells, per_seed, choose, report, baseline, archs, sizes)
    return None


def _ordered(grid_values: list[Any] | None, seen: pd.Series) -> list[Any]:
    out = list(grid_values or [])
    return out + [v for v in dict.fromkeys(seen) if v not in out]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def scores(sweep: Sweep, arch: str) -> pd.DataFrame:
    """Each setting combination of ``arch``: its variant and the choice score (mean over
    seeds of the choice metric; a seed without a finite value makes it +inf)."""
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    out = []
    for variant, part in mine.groupby("variant", sort=False):
        vals = part["val"].tolist()
        score = sum(vals) / len(vals) if vals and all(map(_finite, vals)) else math.inf
        out.append({"variant": variant, "score": score,
                    **{a: part[a].iloc[0] for a in sweep.setting_axes}})
    return pd.DataFrame(out)


def choose(sweep: Sweep, arch: str) -> pd.Series | None:
    """The chosen combination of ``arch`` (lowest score, the first on ties); None when
    every combination has a seed without a finite choice metric."""
    table = scores(sweep, arch)
    if not len(table) or not math.isfinite(table["score"].min()):
        return None
    return table.loc[table["score"].idxmin()]


def at_edge(sweep: Sweep, chosen: pd.Series) -> list[str]:
    """Setting axes (with more than one value) whose chosen value is the smallest or the
    largest tried (the first or last listed, for values that do not compare)."""
    out = []
    for axis, values in sweep.values.items():
        if len(values) < 2:
            continue
        value = chosen[axis]
        try:
            ends = (min(values), max(values))
        except TypeError:
            ends = (values[0], values[-1])
        if value in ends:
            out.append(axis)
    return out


def _at(sweep: Sweep, arch: str, chosen: pd.Series) -> pd.DataFrame:
    mine = sweep.per_seed[sweep.per_seed["variant"] == chosen["variant"]]
    return mine.set_index("seed")


def lr_sensitivity(sweep: Sweep, arch: str, chosen: pd.Series) -> float:
    """Wortsman et al. 2023's LR sensitivity of ``arch`` (module docstring, rule 6); NaN
    without an lr axis of two or more values or without the loss at init."""
    lr = sweep.lr_axis
    if lr is None or len(sweep.values[lr]) < 2:
        return math.nan
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    for axis in sweep.setting_axes:
        if axis != lr:
            mine = mine[mine[axis] == chosen[axis]]
    per_seed = []
    for _, part in mine.groupby("seed"):
        init = part["init"].dropna()
        if not len(init):
            return math.nan
        l0 = float(init.mean())
        losses = [v if _finite(v) else math.inf for v in part["val"]]
        best = min(losses)
        if not math.isfinite(best):
            continue
        per_seed.append(sum(min(v, l0) for v in losses) / len(losses) - best)
    return sum(per_seed) / len(per_seed) if per_seed else math.nan


def tuned_frame(sweep: Sweep) -> pd.DataFrame:
    """tuned.csv: one row per architecture variant (module docstring)."""
    chosen = {a: choose(sweep, a) for a in sweep.archs}
    base = chosen.get(sweep.baseline)
    base_test = _at(sweep, sweep.baseline, base)["test"] if base is not None else None
    records = []
    for arch in sweep.archs:
        c = chosen[arch]
        mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
        bad = int(((mine["diverged"] == 1) | ~mine["val"].map(_finite)).sum())
        rec: dict[str, Any] = {"variant": arch, "runs": len(mine), "diverged": bad,
                               "chosen_on": sweep.chosen_on, "reported_on": sweep.reported_on}
        if c is None:
            records.append(rec)
            continue
        test = _at(sweep, arch, c)["test"]
        mean, low, high, n = interval(test[test.map(_finite)])
        rec.update({a: c[a] for a in sweep.setting_axes})
        rec.update(val_loss=c["score"], test_loss=mean, low=low, high=high, n=n)
        if base_test is not None and arch != sweep.baseline:
            diff = (test - base_test).where(lambda d: d.map(_finite))
            rec["vs_baseline"], rec["vs_low"], rec["vs_high"], _ = interval(diff)
        edges = at_edge(sweep, c)
        rec.update(at_edge=bool(edges), edge_axes=" ".join(edges),
                   lr_sensitivity=lr_sensitivity(sweep, arch, c))
        records.append(rec)
    columns = ["variant", *sweep.setting_axes, *TUNED_COLUMNS[1:]]
    return pd.DataFrame(records, columns=columns)


def lr_curves(sweep: Sweep, arch: str, chosen: pd.Series | None) -> pd.DataFrame:
    """``lr, mean, low, high, diverged`` of ``arch``'s choice metric at each swept lr
    (other setting axes at its chosen values; seed spread = min and max over seeds)."""
    lr = sweep.lr_axis
    assert lr is not None
    mine = sweep.per_seed[sweep.per_seed["arch"] == arch]
    if chosen is not None:
        for axis in sweep.setting_axes:
            if axis != lr:
                mine = mine[mine[axis] == chosen[axis]]
    out = []
    for value, part in mine.groupby(lr, sort=True):
        ok = part["val"][part["val"].map(_finite)]
        n_bad = int(len(part) - len(ok) + (part["diverged"] == 1)[part["val"].map(_finite)].sum())
        out.append({"lr": float(value), "mean": ok.mean() if len(ok) else math.nan,
                    "low": ok.min() if len(ok) else math.nan,
                    "high": ok.max() if len(ok) else math.nan, "diverged": n_bad,
                    "init": part["init"].mean()})
    return pd.DataFrame(out, columns=["lr", "mean", "low", "high", "diverged", "init"])
