"""Reading sentences from the dynamics probe's rows: how the largest attention logit grows
over training, how the residual-stream RMS grows with depth, and the eval loss after the
dynamics run.

Each number is described per variant (mean over seeds, with its per-seed range), and each
variant is compared only with the baseline *of its own condition*
(:mod:`variantlab.config.roles`: ``data.*``, ``emb_dim``, ``n_layers`` and ``conditions:``
keys; a tuned axis that the dynamics probe runs with, ``measure.dynamics.*`` or a model key
under ``tune:``, separates comparisons too, while another probe's setting such as
``measure.training.lr`` leaves the dynamics run alone). Each comparison is a claims row
(``kind`` ``dynamics``, :func:`dynamics_rows`, in verdicts.csv) and its sentence is rendered
from the row (:func:`..words.dynamics_phrase`): "higher" or "lower" only when the paired 95%
t-interval over seeds excludes 0, on the log of the per-seed ratio for the logit and the
RMS (quantities that grow manyfold) and on the per-seed difference for the loss; else "not
clearly different" with that interval; one seed gives the numbers and no verdict.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from ...config.roles import COMPARED, CONDITION, TUNED
from ..claims import measured_row, verdict_of
from ..frame import ReportData
from ..headline import conditions_of
from ..tables import fmt
from ..words import dynamics_phrase, span_text

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


def _dynamic(axis: str, role: str) -> bool:
    """Whether ``axis`` sets how the dynamics run goes: a condition, or a tuned axis that is
    not another probe's setting."""
    other = axis.startswith("measure.") and not axis.startswith(f"measure.{PROBE}.")
    return role == CONDITION or (role == TUNED and not other)


def cells(data: ReportData, variants: list[str]) -> dict[str, list[str]]:
    """The variants compared together (module docstring): condition (and dynamics setting)
    -> its variants in the order given; of those that differ only in another probe's
    setting (one dynamics run), the first alone."""
    where = conditions_of(data, _dynamic)
    what = _compared(data)
    out: dict[str, list[str]] = {}
    for variant in variants:
        mine = out.setdefault(where.get(variant, ""), [])
        if all(what.get(v, v) != what.get(variant, variant) for v in mine):
            mine.append(variant)
    return out


def _compared(data: ReportData) -> dict[str, str]:
    """Variant -> its compared axes' values (runs without compared axes: none)."""
    return conditions_of(data, lambda axis, role: role == COMPARED)


def _pairs(data: ReportData, table: pd.DataFrame) -> Iterator[tuple[str, str, str]]:
    """``(cell, variant, its cell's baseline)`` for each variant of ``table`` (seeds down,
    variants across) in a cell that has the baseline's counterpart: the variant with the
    baseline's compared values."""
    what = _compared(data)
    base = what.get(data.baseline, data.baseline)
    for cell, mine in cells(data, [v for v in data.order if v in table]).items():
        ref = next((v for v in mine if what.get(v, v) == base), None)
        yield from ((cell, v, ref) for v in mine if ref is not None and v != ref)


def dynamics_row(table: pd.DataFrame, variant: str, base: str, metric: str, cell: str = "",
                 ratio: bool = True) -> tuple[dict[str, Any], pd.Series] | None:
    """``variant``'s ``metric`` against ``base``'s over their paired seeds as a claims row
    (``kind`` ``dynamics``, :func:`..claims.measured_row`; module docstring): on the log of
    the per-seed ratio (``ratio``, positive numbers only; the row's metric is then
    ``log <metric>``) or on the per-seed difference; with those per-seed values."""
    pair = table[[base, variant]].dropna()
    if not len(pair):
        return None
    ratio = ratio and bool((pair > 0).all().all())  # a ratio of positive numbers only
    diffs = np.log(pair[variant]) - np.log(pair[base]) if ratio else pair[variant] - pair[base]
    row = measured_row(cell, variant, base, f"log {metric}" if ratio else metric, "dynamics",
                       diffs)
    row["verdict"] = verdict_of(row)
    row.update({"a_mean": float(pair[variant].mean()), "b_mean": float(pair[base].mean())})
    return row, diffs


def versus(table: pd.DataFrame, variant: str, base: str, what: str, ratio: bool = True,
           metric: str = "") -> str:
    """``variant``'s ``what`` against ``base``'s over their paired seeds (module docstring):
    its row (:func:`dynamics_row`) said by :func:`..words.dynamics_phrase`."""
    found = dynamics_row(table, variant, base, metric or what, "", ratio)
    if found is None:
        return ""
    row, diffs = found
    return dynamics_phrase(pd.Series(row), what, diffs)


def comparisons(data: ReportData, table: pd.DataFrame, metric: str, ratio: bool = True
                ) -> list[tuple[str, dict[str, Any], pd.Series]]:
    """``(cell, row, per-seed values)`` for each variant against the baseline of its cell
    (:func:`cells`, :func:`dynamics_row`)."""
    out = []
    for cell, variant, base in _pairs(data, table):
        found = dynamics_row(table, variant, base, metric, cell, ratio)
        if found is not None:
            out.append((cell, *found))
    return out


def _versus(data: ReportData, table: pd.DataFrame, what: str, metric: str,
            ratio: bool = True) -> str:
    """Each variant against the baseline of its cell, said from its row, prefixed by its
    cell where there are several."""
    several = len(cells(data, [v for v in data.order if v in table])) > 1
    out = [(f"{cell}: " if several and cell else "") + dynamics_phrase(pd.Series(row), what, diffs)
           for cell, row, diffs in comparisons(data, table, metric, ratio)]
    return " " + "; ".join(out) + "." if out else ""


def dynamics_rows(data: ReportData) -> list[dict[str, Any]]:
    """The dynamics probe's comparisons as claims rows (verdicts.csv): the step-end largest
    attention logit and last-layer residual RMS (log ratios) and the eval loss after the
    dynamics run (differences), each variant against its cell's baseline."""
    rows = data.rows
    if not len(rows) or not (rows["probe"] == PROBE).any():
        return []
    tables = [("max_attn_logit", at_step_max(rows, "max_attn_logit", last=True), True),
              ("residual_rms", last_layer_at(rows, "residual_rms", last=True), True),
              ("eval_loss", _loss_table(rows), False)]
    return [row for metric, table, ratio in tables if not table.empty
            for _, row, _ in comparisons(data, table, metric, ratio)]


def _by_cell(data: ReportData, parts: dict[str, str]) -> str:
    """``parts`` (variant -> its description) in report order, one variant per dynamics
    run (:func:`cells`), each cell named before its variants where there are several."""
    groups = cells(data, [v for v in data.order if v in parts])
    several = len(groups) > 1
    return "; ".join((f"{cell}: " if several and cell else "") + "; ".join(parts[v] for v in mine)
                     for cell, mine in groups.items())


def attention_logit_growth(data: ReportData) -> str | None:
    """The largest attention logit (over layers) at the first and last recorded step, per
    variant, and its growth per seed; each variant's last value against its cell's
    baseline's (module docstring)."""
    start = at_step_max(data.rows, "max_attn_logit", last=False)
    end = at_step_max(data.rows, "max_attn_logit", last=True)
    if end.empty:
        return None
    parts = {v: f"{v} {fmt(start[v].mean())} → {fmt(end[v].mean())} "
                f"({span_text((end[v] / start[v]).dropna())}x per seed)" for v in end}
    step = _last_step(data.rows, "max_attn_logit")
    text = (f"Max attention logit (largest over layers, mean over seeds) from the first "
            f"recorded step to step {step}: " + _by_cell(data, parts) + ".")
    return text + _versus(data, end, f"step-{step} max attention logit", "max_attn_logit")


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
    variant's last-layer RMS against its cell's baseline's (module docstring)."""
    ratio = depth_ratio(data.rows, "residual_rms")
    if ratio.empty:
        return None
    start = last_layer_at(data.rows, "residual_rms", last=False)
    end = last_layer_at(data.rows, "residual_rms", last=True)
    step = _last_step(data.rows, "residual_rms")
    size = {v: f"{v} {fmt(start[v].mean())} → {fmt(end[v].mean())}" for v in end}
    depth = {v: f"{v} {fmt(ratio[v].mean())}x ({span_text(ratio[v].dropna())} per seed)"
             for v in ratio}
    return (f"Residual-stream RMS after the last layer (mean over seeds) from the first recorded "
            f"step to step {step}: " + _by_cell(data, size) + "."
            + _versus(data, end, f"step-{step} last-layer RMS", "residual_rms")
            + f" At step {step}, the RMS after the last layer over that after the first: "
            + _by_cell(data, depth) + ".")


def dynamics_loss(data: ReportData) -> str | None:
    """The eval loss after the dynamics run, per variant; each against its cell's baseline's
    (module docstring; the training probe's loss sentence covers the training probe only)."""
    table = _loss_table(data.rows)
    if table.empty:
        return None
    parts = {v: f"{v} {fmt(table[v].mean())}" for v in table}
    rates = {run.measure.get(PROBE, {}).get("lr") for run in data.runs}
    at = f" at lr {fmt(rates.pop())}" if len(rates) == 1 and None not in rates else ""
    return (f"Eval loss after the dynamics run{at} (mean over seeds): " + _by_cell(data, parts)
            + "." + _versus(data, table, "dynamics eval loss", "eval_loss", ratio=False))


def _loss_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The eval loss after the dynamics run, seeds down and variants across."""
    part = rows[(rows["probe"] == PROBE) & (rows["metric"] == "eval_loss")
                & (rows["scope"] == "model") & rows["value"].notna()]
    if not len(part):
        return pd.DataFrame()
    return part.pivot_table(index="seed", columns="variant", values="value")


__all__ = ["at_step_max", "cells", "comparisons", "depth_ratio", "dynamics_reading", "dynamics_row",
           "dynamics_rows", "last_layer_at", "versus"]
