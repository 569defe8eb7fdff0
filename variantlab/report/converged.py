"""Whether a run was still improving when it stopped, judged on the headline metric.

The training probe records ``still_improving`` from the training loss
(:func:`variantlab.probes.heldout.still_improving`). On a task whose question is another
number that can saturate, the loss says the wrong thing: a recall run at recall accuracy
1.00 keeps lowering its loss and reads "still improving". So where a run recorded the
validation curve of its headline metric (``compare_on``; ``val_M_curve`` with
``eval_every``), the report judges on that curve instead, in the metric's direction:

- a final value at the metric's best possible value (an accuracy of 1) is not improving;
- else the *gain* is how far the last evaluation is better than the best evaluation up to
  four fifths of the run's steps; the run is still improving when the gain exceeds
  ``IMPROVING_SIGMAS`` standard errors of the difference of two scores of the fixed
  validation set: for an accuracy ``p`` over ``q`` queries, sqrt(2 p (1 - p) / q) (``q``
  from the chance level ``c`` and its noise: q = c (1 - c) / recall_noise^2); for a loss,
  sqrt(2) times one training step's loss noise scaled to the validation targets,
  ``loss_noise x sqrt(tokens per step / val_tokens)``.

A curve without an evaluation up to four fifths of the steps (or no curve) keeps the
stored loss rule. The report's ``still_improving`` (summary tables, ``summary.csv``) is
this judgement; the stored row (``variantlab.results()``) stays the training loss's.
docs/fair-comparisons.md#still-improving says the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from ..config.metrics import headline_of
from .frame import ReportData

PROBE = "training"
METRIC = "still_improving"
IMPROVING_SIGMAS = 2.0  # as the loss rule's
REFERENCE = 0.8  # evaluations up to this fraction of the steps are the reference
INPUTS = ("loss_noise", "tokens", "val_tokens", "chance_recall_accuracy", "recall_noise")


def best_possible(metric: str, higher: bool) -> float | None:
    """The best value ``metric`` can take, where it has one (an accuracy: 1)."""
    return 1.0 if higher and metric.endswith("accuracy") else None


def curve_improving(points: list[tuple[float, float]], higher: bool, best: float | None,
                    unit: Mapping[str, float], steps: float) -> bool | None:
    """The judgement of the module docstring on ``points`` (step, value) of one run
    (``unit``: its scalar rows by name; ``steps``: its optimizer steps); None when the
    curve has no evaluation up to four fifths of the steps to compare with."""
    finite = sorted((s, v) for s, v in points if math.isfinite(v))
    if not finite:
        return None
    last = finite[-1][1]
    if best is not None and last >= best:
        return False
    earlier = [v for s, v in finite[:-1] if s <= REFERENCE * steps]
    if not earlier:
        return None
    ref = max(earlier) if higher else min(earlier)
    gain = (last - ref) if higher else (ref - last)
    return gain > IMPROVING_SIGMAS * _noise(higher, (last + ref) / 2, unit, steps)


def _noise(higher: bool, level: float, unit: Mapping[str, float], steps: float) -> float:
    """The standard error of the difference of two validation scores (0 when the run
    recorded nothing to measure it by)."""
    def get(name: str) -> float:
        value = unit.get(name, math.nan)
        return value if math.isfinite(value) else math.nan

    if higher:
        chance, noise = get("chance_recall_accuracy"), get("recall_noise")
        if not (noise > 0) or not (0 < chance < 1):
            return 0.0
        queries = chance * (1 - chance) / noise ** 2
        return math.sqrt(2 * max(level * (1 - level), 0.0) / queries)
    noise, tokens, val = get("loss_noise"), get("tokens"), get("val_tokens")
    if not (noise >= 0 and tokens > 0 and val > 0 and steps > 0):
        return 0.0
    return math.sqrt(2) * noise * math.sqrt(tokens / steps / val)


def judged(data: ReportData, registry: object = None) -> pd.DataFrame:
    """``variant, seed, value`` of every training unit whose headline curve decides
    (module docstring)."""
    rows = data.rows[data.rows["probe"] == PROBE]
    records = []
    for meta in data.runs:
        head = headline_of(meta, registry)
        curve = f"{head.val}_curve"
        mine = rows[rows["run"] == meta.run]
        points = mine[(mine["metric"] == curve) & mine["step"].notna()]
        if not len(points):
            continue
        scalars = mine[mine["metric"].isin(INPUTS) & mine["step"].isna()]
        inputs = scalars.pivot_table(index=["variant", "seed"], columns="metric",
                                     values="value", aggfunc="mean")
        steps = mine[(mine["metric"] == "loss") & mine["step"].notna()] \
            .groupby(["variant", "seed"])["step"].max() + 1
        higher = not head.lower_is_better
        best = best_possible(head.name, higher)
        for (variant, seed), part in points.groupby(["variant", "seed"], sort=False):
            unit = inputs.loc[(variant, seed)].to_dict() if (variant, seed) in inputs.index \
                else {}
            n = float(steps.get((variant, seed), part["step"].max()))
            said = curve_improving(list(zip(part["step"], part["value"])), higher, best,
                                   unit, n)
            if said is not None:
                records.append((variant, seed, float(said)))
    return pd.DataFrame(records, columns=["variant", "seed", "value"])


def judge_on_headline(data: ReportData, registry: object = None) -> None:
    """Replace the stored ``still_improving`` of each unit whose headline curve decides
    by that judgement, in ``data.rows`` (the stored loss rule stays for the others)."""
    found = judged(data, registry)
    if not len(found):
        return
    rows = data.rows
    where = (rows["probe"] == PROBE) & (rows["metric"] == METRIC) & rows["step"].isna()
    by = found.set_index(["variant", "seed"])["value"]
    keys = list(zip(rows.loc[where, "variant"], rows.loc[where, "seed"]))
    rows.loc[where, "value"] = [by.get(k, v) for k, v in zip(keys, rows.loc[where, "value"])]


__all__ = ["best_possible", "curve_improving", "judge_on_headline", "judged"]
