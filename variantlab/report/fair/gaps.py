"""A compared group's per-seed values at its chosen setting (or at one learning rate), for
the sentences that compare two groups (:func:`.compare.ranking_flips`). Every pair's verdict
against the baseline and the others is a row of the claims (:mod:`..claims`)."""

from __future__ import annotations

import pandas as pd

from .tuned import Sweep, choose

MIN_COMPARED = 3  # compared variants in a condition before this sentence adds anything


def group_values(sweep: Sweep, group: str, column: str = "test", lr: float | None = None
                 ) -> pd.DataFrame:
    """``variant`` (= ``group``), ``seed``, ``value``: ``column`` (``test``: the reported
    metric, ``val``: the choice metric) per seed at the group's chosen setting, or at
    learning rate ``lr`` with its other settings as chosen."""
    chosen = choose(sweep, group)
    mine = sweep.per_seed[sweep.per_seed["arch"] == group]
    if chosen is None:
        mine = mine.iloc[0:0]
    elif lr is None:
        mine = mine[mine["variant"] == chosen["variant"]]
    else:
        for axis in sweep.setting_axes:
            mine = mine[mine[axis] == (lr if axis == sweep.lr_axis else chosen[axis])]
    return pd.DataFrame({"variant": group, "seed": mine["seed"], "value": mine[column]})


__all__ = ["group_values"]
