"""Which variants learned nothing: their held-out number stayed at their starting point.

Every training unit records where it started (:mod:`variantlab.probes.start`). A variant
is judged on the number its task is about, over the seeds that have it:

- the recall task (the run records a recall accuracy): its test recall accuracy against
  chance (``chance_recall_accuracy``), higher is better; the noise is a chance-level
  accuracy's binomial standard deviation over the scored queries (``recall_noise``);
- otherwise its held-out loss (``test_loss``, else ``val_loss`` / ``eval_loss``, else
  ``final_loss``) against the lower of the loss at initialisation (``init_loss``) and the
  chance loss of random tokens (``chance_loss``, ln vocab_size); the noise is one training
  step's loss noise (``loss_noise``).

Per seed the *gain* is how far the number moved from the starting point in the better
direction. A variant **learned nothing** when no seed's gain exceeds ``SIGMAS`` times that
unit's own noise and its mean gain over seeds is at most ``SIGMAS`` times its noise: the
larger of the units' own noise (mean over seeds) and the standard error of the mean gain
over seeds (its standard deviation over sqrt(seeds)). So a variant that solved the task on
two seeds and not on a third learned (it can learn; whether reliably is the interval's
business), and a run of seeds that all sit at chance learned nothing. A variant whose
units recorded no starting point (a store from before these rows) is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from .frame import ReportData
from .tables import fmt

PROBE = "training"
SIGMAS = 3.0
MAX_SHOWN = 4  # variants named with their numbers in one sentence


@dataclass(frozen=True)
class Measure:
    """What a task is judged on: the first held-out column present, its starting point
    (the lowest of ``start`` for a loss, the only one for an accuracy) and its noise."""

    label: str
    columns: tuple[str, ...]
    start: tuple[str, ...]
    noise: str
    higher: bool
    start_label: str  # how the reading names the starting point


RECALL = Measure("recall accuracy", ("test_recall_accuracy", "recall_accuracy",
                                     "val_recall_accuracy"),
                 ("chance_recall_accuracy",), "recall_noise", True, "chance")
LOSS = Measure("loss", ("test_loss", "val_loss", "eval_loss", "final_loss"),
               ("init_loss", "chance_loss"), "loss_noise", False, "its starting point")
LEARNED_COLUMNS = ("variant", "metric", "value", "start", "gain", "noise", "n", "learned")


def _table(rows: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """(variant, seed) down, ``metrics`` across (mean of duplicates)."""
    part = rows[rows["metric"].isin(metrics) & (rows["scope"] == "model") & rows["step"].isna()]
    if not len(part):
        return pd.DataFrame(columns=list(metrics))
    table = part.pivot_table(index=["variant", "seed"], columns="metric", values="value",
                             aggfunc="mean")
    return table.reindex(columns=list(metrics))


def measure_of(rows: pd.DataFrame) -> tuple[Measure, str] | None:
    """The measure the training rows are judged on and its column (None: no held-out
    number or no starting point recorded)."""
    present = set(rows["metric"])
    judged = rows[rows["step"].isna()] if "step" in rows.columns else rows
    has = judged.groupby("metric")["variant"].agg(set).to_dict() if len(judged) else {}
    for measure in (RECALL, LOSS):
        scored = [c for c in measure.columns if c in present]
        every = set().union(*(has.get(c, set()) for c in scored))
        # the first column every variant has (a tuned sweep scores its test split at the
        # chosen settings only: its validation column then judges every variant alike)
        column = next((c for c in scored if has.get(c, set()) >= every), None) or \
            next(iter(scored), None)
        if column is not None and present & set(measure.start):
            return measure, column
    return None


def learned_frame(data: ReportData) -> pd.DataFrame:
    """One line per judged variant (:data:`LEARNED_COLUMNS`): the measure's column, its mean
    over seeds, the mean starting point, the mean gain, the noise, the seeds, and whether
    the variant learned anything (module docstring)."""
    rows = data.rows[data.rows["probe"] == PROBE]
    found = measure_of(rows) if len(rows) else None
    if found is None:
        return pd.DataFrame(columns=list(LEARNED_COLUMNS))
    measure, column = found
    table = _table(rows, (column, *measure.start, measure.noise))
    start = table[list(measure.start)].min(axis=1, skipna=True)
    value = table[column]
    gain = (value - start) if measure.higher else (start - value)
    frame = pd.DataFrame({"value": value, "start": start, "gain": gain,
                          "noise": table[measure.noise]}).dropna(subset=["gain"])
    records = []
    for variant in data.order:
        if variant not in frame.index.get_level_values(0):
            continue
        mine = frame.loc[variant]
        n = len(mine)
        spread = float(mine["gain"].std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
        own = float(mine["noise"].mean()) if mine["noise"].notna().any() else 0.0
        noise = max(own, spread if math.isfinite(spread) else 0.0)
        mean_gain = float(mine["gain"].mean())
        one_seed = bool(((mine["noise"] > 0) & (mine["gain"] > SIGMAS * mine["noise"])).any())
        records.append((variant, column, float(mine["value"].mean()),
                        float(mine["start"].mean()), mean_gain, noise, n,
                        one_seed or mean_gain > SIGMAS * noise))
    return pd.DataFrame(records, columns=list(LEARNED_COLUMNS))


def seed_learning(data: ReportData) -> pd.DataFrame:
    """Per (variant, seed): ``value`` (the measure's column), ``start``, ``gain``, ``noise``
    and ``learned``: whether that seed's gain exceeds SIGMAS times its own noise (a seed
    that diverged or left no finite value did not learn; on recall, neither did a seed left
    behind by a sibling that solved the task, :func:`_left_behind`). Empty when no seed is judged
    (no held-out number or no starting point recorded)."""
    rows = data.rows[data.rows["probe"] == PROBE]
    found = measure_of(rows) if len(rows) else None
    columns = ["variant", "seed", "metric", "value", "start", "gain", "noise", "learned"]
    if found is None:
        return pd.DataFrame(columns=columns)
    measure, column = found
    table = _table(rows, (column, *measure.start, measure.noise, "diverged"))
    start = table[list(measure.start)].min(axis=1, skipna=True)
    value = table[column]
    gain = (value - start) if measure.higher else (start - value)
    noise = table[measure.noise].fillna(0.0)
    ok = gain.map(math.isfinite) & (table["diverged"].fillna(0) < 0.5) & start.notna()
    learned = ok & (gain > SIGMAS * noise)
    if measure is RECALL:  # a recall seed left behind by a sibling that solved the task
        learned = learned & ~_left_behind(rows, table.index, value, start)
    frame = pd.DataFrame({"metric": column, "value": value, "start": start, "gain": gain,
                          "noise": noise, "learned": learned})[start.notna()]
    return frame.reset_index()[columns]


def _left_behind(rows: pd.DataFrame, index: pd.Index, value: pd.Series,
                 start: pd.Series) -> pd.Series:
    """Per (variant, seed): a seed that never solved the task (no ``steps_to_solve`` row)
    while a seed of its variant did, and whose value stayed nearer its start (chance) than
    the solved seeds' mean value (a seed at 0.26 beside two at 1.00 from chance 0.03; not
    one at 0.98 beside one at 0.99)."""
    solved = rows[(rows["metric"] == "steps_to_solve") & rows["step"].isna()
                  & rows["value"].map(lambda v: isinstance(v, float) and math.isfinite(v))]
    done = set(zip(solved["variant"], solved["seed"]))
    did = pd.Series([key in done for key in index], index=index)
    if not did.any():
        return pd.Series(False, index=index)
    top = value.where(did).groupby(level="variant").transform("mean")
    return (~did) & top.notna() & (value < (start + top) / 2)


def learned_of(data: ReportData) -> pd.DataFrame:
    """:func:`learned_frame` of ``data``, computed once per report data."""
    cached = data.__dict__.get("_learned")
    if cached is None:
        cached = data.__dict__["_learned"] = learned_frame(data)
    return cached


def nothing_learned(data: ReportData) -> bool:
    """Whether every judged variant learned nothing (False when none is judged)."""
    frame = learned_of(data)
    return bool(len(frame)) and not frame["learned"].any()


def _measure_name(column: str) -> str:
    measure = RECALL if column in RECALL.columns else LOSS
    split = ("test " if column.startswith("test_") or column == "recall_accuracy" else
             "validation " if column.startswith(("val_", "eval_")) else "final training ")
    return split + measure.label


def learned_lines(data: ReportData) -> list[str]:
    """The reading's sentences on learning: when no variant learned anything, one that says
    so (it comes first, and the report then names no best variant); else one naming the
    variants that learned nothing, when some did not."""
    frame = learned_of(data)
    if not len(frame):
        return []
    column = str(frame["metric"].iloc[0])
    measure = RECALL if column in RECALL.columns else LOSS
    what = _measure_name(column)
    stuck = frame[~frame["learned"]]
    shown = "; ".join(f"{r.variant} {fmt(r.value)} vs {fmt(r.start)}"
                      for r in stuck.head(MAX_SHOWN).itertuples())
    more = f"; and {len(stuck) - MAX_SHOWN} more" if len(stuck) > MAX_SHOWN else ""
    why = (f"{what} within {SIGMAS:g}x its noise of {measure.start_label} "
           f"({shown}{more})")
    if not frame["learned"].any():
        return [f"Nothing was learned: every variant's {why}; no variant is named best. "
                "Train longer, at other learning rates or on an easier setting."]
    if len(stuck):
        names = ", ".join(stuck["variant"].head(MAX_SHOWN)) + more
        return [f"Learned nothing: {names} (each one's {why})."]
    return []


__all__ = ["LEARNED_COLUMNS", "learned_frame", "learned_lines", "learned_of", "nothing_learned",
           "seed_learning"]
