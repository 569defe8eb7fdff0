"""The dynamics probe's numbers in the summary (and so in ``summary.csv``): every quantity a
reading or a findings row quotes from the dynamics run, one value per variant and seed, so
that the summary's mean, min and max (the per-seed range) are the numbers cited.

- the largest attention logit (over layers) at the first and the last recorded step, and
  its growth, last over first, per seed;
- the residual-stream RMS after the last layer at the first and the last recorded step,
  and at the last step the RMS after the last layer over that after the first;
- at the last recorded step, the mean over layers of the attention on the first token, on
  the sink (attention with sinks), and of the routing quantities of a mixture of experts
  (load imbalance, router entropy, dropped share).

The logit and RMS lines follow :mod:`.dynamics_findings` (the reading's sentences), so the
summary and the reading quote one number. A name the training probe also records (its
routing summaries: ``final_load_imbalance``, ``final_router_entropy``, ...) is written
``dynamics.<name>``.
"""

from __future__ import annotations

import pandas as pd

from ...probes.metricnames import ROUTING_METRICS
from ..frame import ReportData
from ..tables import MetricRows
from .dynamics_findings import PROBE, at_step_max, depth_ratio, last_layer_at

#: (recorded metric, label) of the quantities averaged over layers at the last step
LAST_STEP_MEANS = (("first_token_mass", "attention on the first token"),
                   ("sink_mass", "attention on the sink"),
                   ("load_imbalance", "load imbalance (max / mean expert load)"),
                   ("router_entropy", "router entropy (nats)"),
                   ("dropped_fraction", "dropped assignments (share)"))
#: names the training probe records too (its routing rows): the dynamics probe's get a prefix
TRAINING_NAMES = tuple(f"final_{metric}" for metric in ROUTING_METRICS)


def seed_rows(table: pd.DataFrame) -> pd.DataFrame:
    """A seeds-down, variants-across table as ``(variant, seed, value)`` rows, NaN left out."""
    if table.empty:
        return pd.DataFrame(columns=["variant", "seed", "value"])
    out = table.rename_axis(index="seed", columns="variant").stack().rename("value")
    return out.reset_index().dropna(subset=["value"])[["variant", "seed", "value"]]


def last_step_mean(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per variant and seed: the metric's mean over layers at the variant's last recorded
    step (``(variant, seed, value)`` rows)."""
    part = rows[(rows["probe"] == PROBE) & (rows["metric"] == metric) & (rows["scope"] == "layer")
                & rows["step"].notna() & rows["value"].notna()]
    if not len(part):
        return pd.DataFrame(columns=["variant", "seed", "value"])
    part = part[part["step"] == part.groupby("variant")["step"].transform("max")]
    return part.groupby(["variant", "seed"], sort=False)["value"].mean().reset_index()


def dynamics_metrics(data: ReportData) -> pd.DataFrame:
    """The dynamics probe's per-seed summary values (module docstring); none without its
    rows."""
    rows, out = data.rows, MetricRows()
    if not len(rows) or not (rows["probe"] == PROBE).any():
        return out.frame()
    first = at_step_max(rows, "max_attn_logit", last=False)
    last = at_step_max(rows, "max_attn_logit", last=True)
    if not last.empty:
        out.add(seed_rows(first), PROBE, "first_max_attn_logit", "max attention logit, first step", "")
        out.add(seed_rows(last), PROBE, "final_max_attn_logit", "max attention logit, last step", "")
        out.add(seed_rows(last / first), PROBE, "max_attn_logit_growth",
                "max attention logit growth (last / first step)", "")
    start = last_layer_at(rows, "residual_rms", last=False)
    end = last_layer_at(rows, "residual_rms", last=True)
    if not end.empty:
        out.add(seed_rows(start), PROBE, "first_residual_rms", "last-layer residual RMS, first step",
                "")
        out.add(seed_rows(end), PROBE, "final_residual_rms", "last-layer residual RMS, last step", "")
        out.add(seed_rows(depth_ratio(rows, "residual_rms")), PROBE, "residual_rms_depth_ratio",
                "residual RMS, last layer / first layer (last step)", "")
    for metric, label in LAST_STEP_MEANS:
        name = f"final_{metric}"
        name = f"{PROBE}.{name}" if name in TRAINING_NAMES else name
        out.add(last_step_mean(rows, metric), PROBE, name, f"{label}, last step", "")
    return out.frame()


__all__ = ["dynamics_metrics", "last_step_mean", "seed_rows"]
