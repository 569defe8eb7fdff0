"""The timing probe's comparisons as claims rows (``kind`` ``timing``): each variant's
time against the baseline's per timed pass, which the reading's speed sentence says
(:func:`.findings.timing_speed`, :func:`.words.speed_phrase`) and verdicts.csv holds (the
timing probe's ``claims`` piece)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..config.metrics import finite as _finite
from .claims import measured_row
from .frame import ReportData, invocations_of, split_seeds
from .headline import conditions_of
from .stats import pandas_mean

#: δ on the log of the time ratio, so "equal" means within 2% of the time
TIMING_MARGIN = math.log(1.02)
PASSES = ("backward", "step", "forward")  # timed passes, the slowest-measured first


def busy_variants(rows: pd.DataFrame, probe: str, variants: Sequence[str]) -> list[str]:
    """Of ``variants``, those a ``probe`` timing of was measured while the machine was busy
    (the timing probe's ``busy`` row, :mod:`variantlab.probes.machine`)."""
    mine = rows[(rows["probe"] == probe) & (rows["metric"] == "busy")
                & rows["variant"].isin(list(variants)) & (rows["value"] == 1)]
    return [str(v) for v in dict.fromkeys(mine["variant"])]


def timed_table(rows: pd.DataFrame, metric: str, baseline: str) -> tuple[pd.DataFrame, str]:
    """The finite model-scope values of ``metric`` of the probe that timed the baseline,
    seeds down and variants across, and that probe (empty and "" without the baseline)."""
    part = rows[(rows["metric"] == metric) & (rows["scope"] == "model")
                & rows["value"].map(_finite)]
    mine = part.loc[part["variant"] == baseline, "probe"]
    probe = str(mine.iloc[0]) if len(mine) else ""
    part = part[part["probe"] == probe]
    return (part.pivot_table(index="seed", columns="variant", values="value", aggfunc="mean"),
            probe)


def timing_rows(data: ReportData) -> list[dict[str, Any]]:
    """Each variant's time against the baseline's, per timed pass (``{pass}_median_s``),
    among the variants of the baseline's condition (a wider model is another size, not a
    slower variant): ``kind`` ``timing``, the estimate the mean over seeds of the log of the
    variant's time over the baseline's on the same seed (each timing unit is its own
    measurement, minutes apart), δ :data:`TIMING_MARGIN`; caveats ``timed on a busy machine
    (variants)``, ``timed apart (seeds)`` (the two timed by different invocations of
    ``variantlab run``) and ``timed on different machines (seeds)``."""
    rows, base = data.rows, data.baseline
    conds = conditions_of(data)
    out: list[dict[str, Any]] = []
    for key in PASSES:
        metric = f"{key}_median_s"
        table, probe = timed_table(rows, metric, base)
        if base not in table:
            continue
        busy_order = busy_variants(rows, probe, list(data.order))  # each variant once
        measured_by = invocations_of(rows, probe, metric)
        machines = invocations_of(rows, probe, metric, "machine")
        # one array for the whole table: a large grid times hundreds of variants, and a
        # DataFrame per variant cost seconds
        column = {str(v): j for j, v in enumerate(table.columns)}
        times = table.to_numpy(dtype=float)
        of_base = times[:, column[str(base)]]
        for variant in data.order:
            if variant == base or variant not in table or conds.get(variant) != conds.get(base):
                continue
            mine = times[:, column[str(variant)]]
            both = ~np.isnan(mine) & ~np.isnan(of_base) & (mine > 0) & (of_base > 0)
            logs = np.array([math.log(x) for x in mine[both] / of_base[both]], dtype=float)
            busy = [v for v in busy_order if v in (base, variant)]
            split = split_seeds(measured_by, probe, metric, base, variant)
            elsewhere = split_seeds(machines, probe, metric, base, variant)
            caveats = ([f"timed on a busy machine ({', '.join(busy)})"] if busy else []) + (
                [f"timed apart (seeds {', '.join(map(str, split))})"] if split else []) + (
                [f"timed on different machines (seeds {', '.join(map(str, elsewhere))})"]
                if elsewhere else [])
            row = measured_row(conds.get(base, ""), variant, base, metric, "timing", logs,
                               "; ".join(caveats), TIMING_MARGIN)
            row.update({"a_mean": pandas_mean(mine), "b_mean": pandas_mean(of_base)})
            out.append(row)
    return out


__all__ = ["PASSES", "TIMING_MARGIN", "busy_variants", "timed_table", "timing_rows"]
