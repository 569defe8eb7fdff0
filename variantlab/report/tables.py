"""Summary tables: per-seed metrics, aggregated over seeds, with ratios to the baseline."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..config.metrics import direction
from ..plugin.registry import Registry
from .frame import ReportData, differing_axes, variant_flat
from .parts import pieces

PASS_NAMES = {"forward": "forward", "backward": "forward+backward", "step": "train step"}
SLOT_ORDER = ("embedding", "positional", "attention", "feedforward", "norm", "residual",
              "activation", "head")
SUMMARY_COLUMNS = ("variant", "section", "metric", "label", "unit", "better", "mean", "spread",
                   "min", "max", "n", "nan", "iqr", "baseline_mean", "ratio")


@dataclass
class Table:
    """A rendered table: header and string cells, ready for Markdown or HTML."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    filters: list[int] = field(default_factory=list)  # columns the HTML page filters by


def select(rows: pd.DataFrame, probe: str, metric: str, scope: str = "model") -> pd.DataFrame:
    """The rows of one probe's metric at one scope."""
    return rows[(rows["probe"] == probe) & (rows["metric"] == metric) & (rows["scope"] == scope)]


PER_SEED_COLUMNS = ["variant", "seed", "value", "iqr", "section", "metric", "label", "unit",
                    "ratio", "sources"]
#: stored row metrics that are another's older name (``eval_loss`` is ``val_loss``): a
#: summary that shows one has shown the other
ALIASES = {"val_loss": "eval_loss", "recall_accuracy": "test_recall_accuracy"}
#: flags the probes' views show only once they are set (``compiled``: once any run was)
QUIET = ("compiled",)


class MetricRows:
    """A probe's per-seed summary values, added metric by metric (what a
    :class:`variantlab.plugin.probe.ProbeView`'s ``metrics`` returns, from :meth:`frame`)."""

    def __init__(self) -> None:
        self.parts: list[pd.DataFrame] = []

    def add(self, frame: pd.DataFrame, section: str, metric: str, label: str, unit: str,
            scale: float = 1.0, iqr: pd.DataFrame | None = None, ratio: bool = True) -> None:
        """One metric: ``frame``'s (variant, seed, value) rows times ``scale``; ``iqr``: rows
        of its interquartile range (shown instead of the spread over seeds); ``ratio``:
        False for a flag or a count of events, which has no ratio to the baseline."""
        if not len(frame):
            return
        part = frame[["variant", "seed", "value"]].copy()
        part["value"] = part["value"] * scale
        part["iqr"] = np.nan
        if iqr is not None and len(iqr):
            spread = iqr.set_index(["variant", "seed"])["value"] * scale
            part["iqr"] = [spread.get((v, s), np.nan) for v, s in zip(part["variant"], part["seed"])]
        part[["section", "metric", "label", "unit"]] = [section, metric, label, unit]
        part["ratio"] = ratio
        part["sources"] = " ".join(_sources(frame) + (_sources(iqr) if iqr is not None else []))
        self.parts.append(part)

    def frame(self) -> pd.DataFrame:
        """Every added metric, in order (an empty frame with the columns when none)."""
        if not self.parts:
            return pd.DataFrame(columns=PER_SEED_COLUMNS)
        return pd.concat(self.parts, ignore_index=True)


def _sources(frame: pd.DataFrame) -> list[str]:
    """``probe/metric`` of the stored rows a metric was made of (none for derived values)."""
    if not len(frame) or not {"probe", "metric"} <= set(frame.columns):
        return []
    return list(dict.fromkeys(f"{p}/{m}" for p, m in zip(frame["probe"], frame["metric"])))


def seed_metrics(data: ReportData, registry: Registry | None = None) -> pd.DataFrame:
    """One value per (variant, seed, metric): the numbers the summary aggregates, from every
    registered probe's ``metrics`` piece (``registry``: default :func:`variantlab.get_registry`),
    then every other scalar a probe recorded (:func:`other_scalars`), so that no recorded
    number is missing from the summary."""
    out = MetricRows()
    for piece in pieces(registry, "metrics"):
        part = piece(data)
        if part is not None and len(part):
            out.parts.append(part)
    extra = other_scalars(data, out.frame())
    if len(extra):  # an empty frame would make every column an object column
        out.parts.append(extra)
    return out.frame()


def other_scalars(data: ReportData, shown: pd.DataFrame) -> pd.DataFrame:
    """Per-seed values of every model-scope scalar (a row without a step) that no probe's
    ``metrics`` piece summarised: a held-out metric, a count, any plugin probe's result. Each
    goes in its probe's section under its stored name (``probe.metric`` where that name is
    taken), labelled with its words, in its stored unit."""
    covered = {s for text in shown.get("sources", pd.Series(dtype=str)).dropna()
               for s in str(text).split()}
    covered |= {f"{p}/{m}" for p, m in zip(shown.get("section", []), shown.get("metric", []))}
    taken = set(shown.get("metric", []))
    rows = data.rows
    scalars = rows[(rows["scope"] == "model") & rows["step"].isna()]
    out = MetricRows()
    for (probe, metric), part in scalars.groupby(["probe", "metric"], sort=False):
        probe, metric = str(probe), str(metric)
        alias = ALIASES.get(metric)
        if f"{probe}/{metric}" in covered or (alias and f"{probe}/{alias}" in covered) \
                or metric in QUIET:
            continue
        units = part["unit"].dropna() if "unit" in part else pd.Series(dtype=str)
        unit = str(units.iloc[0]) if len(units) else ""
        name = metric if metric not in taken else f"{probe}.{metric}"
        taken.add(name)
        out.add(part, probe, name, metric.replace("_", " "), unit,
                ratio=unit not in ("fraction", "flag"))
    return out.frame()


def stacks_of(frame: pd.DataFrame) -> list[str]:
    """The stacks in a frame's ``stack`` column, in order of appearance ("" for a model of
    one stack)."""
    if "stack" not in frame.columns:
        return [""] if len(frame) else []
    return list(dict.fromkeys(frame["stack"].fillna("")))


def _with_stack(frame: pd.DataFrame) -> pd.DataFrame:
    if "stack" not in frame.columns:
        frame = frame.assign(stack="")
    return frame.assign(stack=frame["stack"].fillna(""))


def first_layer(rows: pd.DataFrame, metric: str, probe: str) -> pd.DataFrame:
    """Per (variant, seed, stack): a layer metric of the probe's rows at the stack's
    lowest-numbered layer, over its weight matrices (the seeds' measure) where the rows have
    them, else over all its parameters. An encoder's first layer and a decoder's are two
    results, never one."""
    layer = _with_stack(rows[(rows["probe"] == probe) & (rows["scope"] == "layer")
                             & (rows["metric"] == metric) & rows["layer"].notna()])
    weights = layer[layer["name"] == "weights"]
    has_weights = layer["variant"].isin(set(weights["variant"]))
    layer = pd.concat([weights, layer[~has_weights & (layer["name"] == "all")]])
    if not len(layer):
        return layer
    low = layer.groupby(["variant", "seed", "stack"])["layer"].transform("min")
    return layer[layer["layer"] == low]


def depth_ratios(rows: pd.DataFrame, metric: str = "grad_norm",
                 probe: str = "gradients") -> pd.DataFrame:
    """Per (variant, seed, stack, slot name): last-layer over first-layer value of a probe's
    layer metric, within one stack (an encoder's layers are never compared with a
    decoder's)."""
    layer = _with_stack(rows[(rows["probe"] == probe) & (rows["scope"] == "layer")
                             & (rows["metric"] == metric) & rows["layer"].notna()
                             & (rows["name"] != "weights")])
    cols = ["variant", "seed", "stack", "name", "value", "first_layer", "last_layer"]
    if not len(layer):
        return pd.DataFrame(columns=cols)
    keys = ["variant", "seed", "stack", "name"]
    ordered = layer.sort_values("layer", kind="stable").groupby(keys, sort=False)
    ends = ordered.agg(first=("value", "first"), last=("value", "last"),
                       first_layer=("layer", "first"), last_layer=("layer", "last"),
                       count=("value", "size")).reset_index()
    order = layer.drop_duplicates(keys)[keys]  # groups in order of first appearance
    ends = order.merge(ends, on=keys, how="left")
    ends = ends[(ends["count"] > 1) & (ends["first"] > 0)]
    out = ends.assign(value=ends["last"] / ends["first"],
                      first_layer=ends["first_layer"].astype(int),
                      last_layer=ends["last_layer"].astype(int))
    return out[cols].reset_index(drop=True)


def summarize(data: ReportData, per_seed: pd.DataFrame | None = None,
              registry: Registry | None = None) -> pd.DataFrame:
    """Mean, spread (sample std), min, max and n over seeds; ratio of means to the baseline
    (``per_seed``: :func:`seed_metrics` of ``data`` when already computed); ``better``: which
    way the metric is better, ``lower`` or ``higher`` ('' for a count or a gradient norm;
    :func:`variantlab.config.metrics.direction`, plugin probes' declared metrics from
    ``registry``)."""
    per_seed = seed_metrics(data) if per_seed is None else per_seed
    if not len(per_seed):
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    keys = ["variant", "section", "metric", "label", "unit"]
    grouped = per_seed.groupby(keys, sort=False)
    summary = grouped["value"].agg(mean="mean", spread="std", min="min", max="max",
                                   n="count", rows="size").reset_index()
    summary["iqr"] = grouped["iqr"].mean().to_numpy()
    summary["nan"] = (summary.pop("rows") - summary["n"]).astype(int)  # NaN values per group
    ways = {m: direction(str(m), registry) or "" for m in summary["metric"].unique()}
    summary["better"] = summary["metric"].map(ways)
    base = summary[summary["variant"] == data.baseline].set_index("metric")["mean"]
    summary["baseline_mean"] = summary["metric"].map(base)
    with np.errstate(divide="ignore", invalid="ignore"):
        summary["ratio"] = summary["mean"] / summary["baseline_mean"]
    if "ratio" in per_seed.columns:  # flags and event counts have no ratio
        flags = set(per_seed.loc[per_seed["ratio"] == False, "metric"])  # noqa: E712
        summary.loc[summary["metric"].isin(flags), "ratio"] = np.nan
    rank = {v: i for i, v in enumerate(data.order)}
    summary["_rank"] = summary["variant"].map(rank)
    summary = summary.sort_values(["_rank"], kind="stable").drop(columns="_rank")
    return summary[list(SUMMARY_COLUMNS)].reset_index(drop=True)


# -- formatting ----------------------------------------------------------------------------
def fmt(value: float, unit: str = "") -> str:
    """Four significant digits; counts with thousands separators; NaN as 'NaN'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if unit == "count" or abs(value) >= 1e3:
        return f"{value:,.0f}"
    if value == 0:
        return "0"
    if abs(value) < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4g}"


def apart(a: float, b: float, unit: str = "") -> tuple[str, str]:
    """``a`` and ``b`` as :func:`fmt` writes them, with more significant digits (up to 8)
    while two different numbers would print the same."""
    x, y = fmt(a, unit), fmt(b, unit)
    if x != y or a == b or not (math.isfinite(a) and math.isfinite(b)):
        return x, y
    for digits in range(5, 9):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            break
    return x, y


def cell(rec: Mapping[str, Any]) -> str:
    """``mean ± spread (×ratio)``; a metric with an IQR (a timing) shows it instead, a
    single seed shows no spread."""
    text = fmt(rec["mean"], rec["unit"])
    if rec["metric"] == "diverged":
        return f"{int(rec['mean'] * rec['n'] + 0.5)}/{rec['n']}" if rec["n"] else "NaN"
    if not math.isnan(rec["iqr"]):
        text += f" ± {fmt(rec['iqr'])} IQR"
    elif rec["n"] > 1 and not math.isnan(rec["spread"]) and rec["spread"] > 0:
        text += f" ± {fmt(rec['spread'])}"
    if not math.isnan(rec["ratio"]):
        r = rec["ratio"]
        text += f" (×{r:.3f})" if r != 1 and abs(r - 1) < 0.01 else f" (×{r:.2f})"
    if rec["nan"]:
        text += f" [{int(rec['nan'])} NaN]"
    return text


def section_tables(data: ReportData, summary: pd.DataFrame,
                   registry: Registry | None = None) -> list[Table]:
    """Every registered probe's section table (its ``section`` piece), in rank order."""
    tables = [piece(data, summary) for piece in pieces(registry, "section")]
    return [t for t in tables if t is not None]


def summary_section(data: ReportData, summary: pd.DataFrame, section: str, title: str,
                    note: str, column: tuple[str, Mapping[str, str]] | None = None
                    ) -> Table | None:
    """A section's table (None when the summary has none of it): variants down, its metrics
    across, each ``mean ± spread (×ratio to the baseline)``; ``column``: a header and a cell
    per variant shown after ``n``."""
    part = summary[summary["section"] == section]
    if not len(part):
        return None
    metrics = beside_val(list(dict.fromkeys(zip(part["metric"], part["label"], part["unit"]))))
    columns = ["variant", "n"] + ([column[0]] if column else []) + [
        f"{label} ({unit})" if unit not in ("", "x", "count") else label
        for _, label, unit in metrics]
    body = []
    recs: dict[str, dict[str, dict]] = {}
    for rec in part.to_dict("records"):
        recs.setdefault(rec["variant"], {})[rec["metric"]] = rec
    for variant in data.order:
        if variant not in recs:
            continue
        mine = recs[variant]
        cells = [variant, str(int(max(r["n"] for r in mine.values())))]
        if column:
            cells.append(column[1].get(variant, ""))
        cells += [cell(mine[m]) if m in mine else "—" for m, _, _ in metrics]
        body.append(cells)
    return Table(title, columns, body,
                 f"{note}; (×r) is the ratio to the baseline {data.baseline}.")


def beside_val(metrics: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """``metrics`` (name first) with each ``test_X`` right after its ``val_X`` (or
    ``eval_X``): where the columns stand does not depend on whether the test split was
    scored in the training unit or in a test unit after it (a tuned sweep's chosen
    settings, which the first variant may not be)."""
    names = {m[0] for m in metrics}

    def twin(name: str) -> str | None:
        rest = name.removeprefix("test_")
        return next((p + rest for p in ("val_", "eval_") if p + rest in names), None) \
            if name.startswith("test_") else None

    after: dict[str, list[tuple[str, str, str]]] = {}
    for m in metrics:
        lead = twin(m[0])
        if lead is not None:
            after.setdefault(lead, []).append(m)
    out: list[tuple[str, str, str]] = []
    for m in metrics:
        if twin(m[0]) is None:
            out += [m, *after.get(m[0], [])]
    return out


def variant_table(data: ReportData) -> Table:
    """The variants with only the axes that differ between them."""
    axes = differing_axes(data)
    v = data.variants
    multi = v["experiment"].nunique() > 1
    runs = "run" in v.columns and v["run"].nunique() > 1 and (v["run"] != v["experiment"]).any()
    extra = (["run"] if runs else []) + (["experiment"] if multi else [])
    columns = ["variant"] + extra + axes
    body = []
    for _, rec in v.iterrows():
        flat = variant_flat(rec["spec"], rec["overrides"])
        name = rec["variant"] + (" (baseline)" if rec["variant"] == data.baseline else "")
        cells = [name] + [str(rec[c]) for c in extra]
        cells += [cell_text(flat.get(axis, "")) for axis in axes]
        body.append(cells)
    note = "" if axes else "All variants share one model spec."
    return Table("Variants", columns, body, note)


def cell_text(value: object) -> str:
    """A table cell of an axis value: booleans as YAML writes them, floats as :func:`fmt`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return fmt(value)
    return "" if value is None else str(value)


def warning_table(data: ReportData, summary: pd.DataFrame,
                  registry: Registry | None = None) -> Table:
    """Variant warnings, the probes' warnings (``warnings`` pieces: a diverged training
    run) and NaN values."""
    body: list[list[str]] = []
    for _, rec in data.variants.iterrows():
        for text in rec["warnings"] or []:
            body.append([rec["variant"], "spec", str(text)])
    for piece in pieces(registry, "warnings"):
        body.extend([str(c) for c in line] for line in piece(data))
    nan = data.rows[data.rows["value"].isna() & (data.rows["scope"] != "info")]
    for (variant, seed, probe), group in nan.groupby(["variant", "seed", "probe"], sort=False):
        metrics = ", ".join(dict.fromkeys(group["metric"]))
        body.append([variant, probe, f"seed {int(seed)}: NaN in {metrics}"])
    rank = {v: i for i, v in enumerate(data.order)}
    body.sort(key=lambda r: rank.get(r[0], len(rank)))
    return Table("Warnings", ["variant", "source", "warning"], body)


def failure_table(data: ReportData) -> Table:
    """Units that failed, with their error messages."""
    units = data.units
    body = []
    if "status" in units.columns and len(units):
        failed = units[units["status"] == "failed"]
        for _, rec in failed.iterrows():
            seed = rec.get("seed")
            body.append([str(rec.get("variant", "")), str(rec.get("probe", "")),
                         "" if seed is None or pd.isna(seed) else str(int(seed)),
                         str(rec.get("error", "") or "")])
    return Table("Failed units", ["variant", "probe", "seed", "error"], body)


#: A text cell starting with one of these is a formula to a spreadsheet (CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def csv_text(value: object) -> object:
    """A text cell safe to open in a spreadsheet: one that a spreadsheet would read as a
    formula gets a leading single quote; numbers (negative ones too) and other text pass.
    A carriage return becomes a newline (which the CSV writer quotes; a bare CR it would
    not, and readers would split the row there)."""
    if not isinstance(value, str):
        return value
    if value.startswith(FORMULA_START) and not _NUMBER.fullmatch(value):
        value = "'" + value
    return value.replace("\r\n", "\n").replace("\r", "\n")


def csv_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell passed through :func:`csv_text`; numeric columns
    are left as they are."""
    out = frame.copy()
    for col in out.columns:
        if not pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].map(csv_text)
    out.columns = [csv_text(c) for c in out.columns]
    return out


def summary_csv(summary: pd.DataFrame) -> str:
    """The long summary as CSV text (one line per variant and metric), safe to open in a
    spreadsheet (see :func:`csv_safe`)."""
    return csv_safe(summary).to_csv(index=False, float_format="%.6g", lineterminator="\n")
