"""Reading sentences from the dynamics probe's rows, judged seed by seed against the baseline:
how the largest attention logit grows over training, how the residual-stream RMS grows with
depth, and the eval loss after the dynamics run."""

from __future__ import annotations

import math

import pandas as pd

from ..frame import ReportData
from ..tables import fmt

PROBE = "dynamics"


def dynamics_reading(data: ReportData) -> list[str]:
    """The dynamics probe's sentences (none without its rows)."""
    rows = data.rows
    if not len(rows) or not (rows["probe"] == PROBE).any():
        return []
    found = [attention_logit_growth(data), residual_depth_growth(data), dynamics_loss(data)]
    return [line for line in found if line]


def _layer_table(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The metric's per-layer rows of the dynamics probe, with int ``step`` and ``layer``."""
    part = rows[(rows["probe"] == PROBE) & (rows["metric"] == metric) & (rows["scope"] == "layer")
                & rows["step"].notna() & rows["layer"].notna() & rows["value"].notna()]
    part = part.astype({"step": int, "layer": int})
    return part[["variant", "seed", "name", "layer", "step", "value"]]


def at_step_max(rows: pd.DataFrame, metric: str, last: bool) -> pd.DataFrame:
    """Per seed (down) and variant (across): the metric's largest value over layers at each
    variant's first or last recorded step."""
    part = _layer_table(rows, metric)
    if not len(part):
        return pd.DataFrame()
    ends = part.groupby("variant")["step"].transform("max" if last else "min")
    part = part[part["step"] == ends]
    return part.pivot_table(index="seed", columns="variant", values="value", aggfunc="max")


def depth_ratio(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per seed and variant: the metric at the last layer over the first, at the last
    recorded step (the first stack of a model of several)."""
    part = _layer_table(rows, metric)
    if not len(part):
        return pd.DataFrame()
    part = part[part["name"] == part["name"].iloc[0]]
    part = part[part["step"] == part.groupby("variant")["step"].transform("max")]
    first = part["layer"] == part.groupby("variant")["layer"].transform("min")
    last = part["layer"] == part.groupby("variant")["layer"].transform("max")
    table = [part[sel].pivot_table(index="seed", columns="variant", values="value")
             for sel in (last, first)]
    return table[0] / table[1]


def _last_step(rows: pd.DataFrame, metric: str) -> int:
    return int(_layer_table(rows, metric)["step"].max())


def _span(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return fmt(lo) if math.isclose(lo, hi) else f"{fmt(lo)} to {fmt(hi)}"


def _versus(table: pd.DataFrame, baseline: str, what: str, ratio: bool = True) -> str:
    """Each variant against the baseline seed by seed: lower or higher on every seed (with the
    per-seed ratio, or difference when ``ratio`` is false), or not a clear difference."""
    if baseline not in table or table.shape[1] < 2:
        return ""
    out = []
    for variant in table.columns.drop(baseline):
        pair = table[[baseline, variant]].dropna()
        if not len(pair):
            continue
        lower = int((pair[variant] < pair[baseline]).sum())
        higher = int((pair[variant] > pair[baseline]).sum())
        n = len(pair)
        change = (pair[variant] / pair[baseline] if ratio else pair[variant] - pair[baseline])
        span = f"per-seed {'ratio' if ratio else 'difference'} {_span(change)}"
        if lower == n or higher == n:
            side = "lower" if lower == n else "higher"
            seeds = "on every seed" if n > 1 else "on its one seed"
            out.append(f"{variant}'s {what} is {side} than {baseline}'s {seeds} (n={n}, {span})")
        else:
            out.append(f"{variant}'s {what} is lower than {baseline}'s on {lower} of {n} seeds "
                       f"({span}): not a clear difference")
    return " " + "; ".join(out) + "." if out else ""


def attention_logit_growth(data: ReportData) -> str | None:
    """The largest attention logit (over layers) at the first and last recorded step, per
    variant, and its growth; each variant's last value against the baseline's, per seed."""
    start = at_step_max(data.rows, "max_attn_logit", last=False)
    end = at_step_max(data.rows, "max_attn_logit", last=True)
    if end.empty:
        return None
    parts = []
    for variant in [v for v in data.order if v in end]:
        growth = (end[variant] / start[variant]).dropna()
        parts.append(f"{variant} {fmt(start[variant].mean())} → {fmt(end[variant].mean())} "
                     f"({_span(growth)}x per seed)")
    step = _last_step(data.rows, "max_attn_logit")
    text = (f"Max attention logit (largest over layers, mean over seeds) from the first "
            f"recorded step to step {step}: " + "; ".join(parts) + ".")
    return text + _versus(end, data.baseline, f"step-{step} max attention logit")


def last_layer_at(rows: pd.DataFrame, metric: str, last: bool) -> pd.DataFrame:
    """Per seed and variant: the metric at the last layer (of the first stack) at each
    variant's first or last recorded step."""
    part = _layer_table(rows, metric)
    if not len(part):
        return pd.DataFrame()
    part = part[part["name"] == part["name"].iloc[0]]
    part = part[part["step"] == part.groupby("variant")["step"].transform("max" if last else "min")]
    part = part[part["layer"] == part.groupby("variant")["layer"].transform("max")]
    return part.pivot_table(index="seed", columns="variant", values="value")


def residual_depth_growth(data: ReportData) -> str | None:
    """Residual-stream RMS after the last layer at the first and last recorded step, and at
    the last step the RMS after the last layer over that after the first, per variant; each
    variant's last-layer RMS against the baseline's, per seed."""
    ratio = depth_ratio(data.rows, "residual_rms")
    if ratio.empty:
        return None
    start = last_layer_at(data.rows, "residual_rms", last=False)
    end = last_layer_at(data.rows, "residual_rms", last=True)
    step = _last_step(data.rows, "residual_rms")
    size = [f"{v} {fmt(start[v].mean())} → {fmt(end[v].mean())}" for v in data.order if v in end]
    depth = [f"{v} {fmt(ratio[v].mean())}x ({_span(ratio[v].dropna())} per seed)"
             for v in data.order if v in ratio]
    return (f"Residual-stream RMS after the last layer (mean over seeds) from the first recorded "
            f"step to step {step}: " + "; ".join(size) + "."
            + _versus(end, data.baseline, f"step-{step} last-layer RMS")
            + f" At step {step}, the RMS after the last layer over that after the first: "
            + "; ".join(depth) + ".")


def dynamics_loss(data: ReportData) -> str | None:
    """The eval loss after the dynamics run, per variant; each against the baseline's per seed
    (the training probe's loss sentence covers the training probe only)."""
    rows = data.rows
    part = rows[(rows["probe"] == PROBE) & (rows["metric"] == "eval_loss")
                & (rows["scope"] == "model") & rows["value"].notna()]
    if not len(part):
        return None
    table = part.pivot_table(index="seed", columns="variant", values="value")
    parts = [f"{v} {fmt(table[v].mean())}" for v in data.order if v in table]
    rates = {run.measure.get(PROBE, {}).get("lr") for run in data.runs}
    at = f" at lr {fmt(rates.pop())}" if len(rates) == 1 and None not in rates else ""
    return (f"Eval loss after the dynamics run{at} (mean over seeds): " + "; ".join(parts) + "."
            + _versus(table, data.baseline, "dynamics eval loss", ratio=False))


__all__ = ["at_step_max", "depth_ratio", "dynamics_reading", "last_layer_at"]
