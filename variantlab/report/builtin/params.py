"""What the report shows of the ``params`` probe: total, trainable and non-embedding counts
and the count per slot, a stacked bar of the slots, and how the totals compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import cycle, islice

import pandas as pd

from ...plugin.probe import ProbeView
from ..findings import means
from ..frame import ReportData
from ..plots import Plot, label_lines, mean_by, new_axes, palette, shown
from ..tables import SLOT_ORDER, MetricRows, Table, fmt, select, summary_section

PROBE = "params"
NOTE = "count; per-slot columns are the parameters in each slot"


def metrics(data: ReportData) -> pd.DataFrame:
    """Total, trainable and non-embedding counts, then each slot's, in slot order."""
    rows, out = data.rows, MetricRows()
    for metric, label in (("total", "total"), ("trainable", "trainable"),
                          ("non_embedding", "non-embedding"),
                          ("active", "active per token"),  # mixtures of experts only
                          ("active_non_embedding", "active non-embedding")):
        out.add(select(rows, PROBE, metric), PROBE, metric, label, "count")
    # what a causal decoder keeps per sequence at its context length (KV cache or fixed
    # state), and its growth per token (causal decoders only)
    for metric, label in (("state_bytes", "state size"),
                          ("state_bytes_per_token", "state per token")):
        out.add(select(rows, PROBE, metric), PROBE, metric, label, "bytes")
    slots = rows[(rows["probe"] == PROBE) & (rows["scope"] == "slot")]
    present = list(dict.fromkeys(slots["name"]))
    for slot in sorted(present, key=_slot_rank):
        out.add(slots[slots["name"] == slot], PROBE, f"params.{slot}", slot, "count")
    return out.frame()


def _slot_rank(slot: str) -> tuple[int, str]:
    return (SLOT_ORDER.index(slot) if slot in SLOT_ORDER else 99, slot)


def section(data: ReportData, summary: pd.DataFrame) -> Table | None:
    return summary_section(data, summary, PROBE, "Parameters", NOTE)


def params_plot(data: ReportData) -> Plot:
    title = "Parameters by slot"
    caption = "Parameter count of each slot, stacked per variant (tied weights counted once)."
    rows = data.rows
    part = rows[(rows["probe"] == PROBE) & (rows["scope"] == "slot")]
    if not len(part):
        return Plot("params", title, caption, skipped="no per-slot parameter rows")
    mean = mean_by(part, ["variant", "name"])
    variants = [v for v in data.order if v in set(mean["variant"])]
    slots = sorted(set(mean["name"]), key=_slot_rank)
    fig, (ax,) = new_axes(height=1.4 + 0.28 * label_lines(variants))
    table = mean.pivot(index="variant", columns="name", values="value").reindex(variants)
    left = [0.0] * len(variants)
    colors = palette("tab10")
    for slot, color in zip(slots, islice(cycle(colors), len(slots))):
        vals = table[slot].fillna(0).tolist()
        ax.barh(range(len(variants)), vals, left=left, label=slot, color=color)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(variants)), [shown(v) for v in variants])
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel("parameters (count)")
    ax.set_ylabel("variant")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, title="slot",
              fontsize=8)
    return Plot("params", title, caption, fig)


def plots(data: ReportData) -> list[Plot]:
    return [params_plot(data)]


def param_ratio(data: ReportData, summary: pd.DataFrame) -> str | None:
    """How the variants' total parameter counts compare with the baseline's."""
    table = means(summary, "total")
    if len(table) < 2 or data.baseline not in table.index:
        return None
    ratio = (table["mean"] / table.loc[data.baseline, "mean"]).drop(index=data.baseline)
    if (ratio - 1).abs().max() < 1e-9:
        return f"All variants have {fmt(table.loc[data.baseline, 'mean'], 'count')} parameters."
    base = table.loc[data.baseline, "mean"]
    parts = []
    for v in dict.fromkeys([ratio.idxmax(), ratio.idxmin()]):
        if math.isclose(ratio[v], 1.0):
            continue
        if abs(ratio[v] - 1) < 0.05:
            diff = table.loc[v, "mean"] - base
            parts.append(f"{v} has {fmt(abs(diff), 'count')} {'more' if diff > 0 else 'fewer'}"
                         f" parameters than {data.baseline} ({abs(ratio[v] - 1):.2%})")
        else:
            parts.append(f"{v} has {ratio[v]:.2f}x the parameters of {data.baseline}")
    return "; ".join(parts) + "." if parts else None


def aside(data: ReportData, summary: pd.DataFrame) -> Sequence[str | None]:
    return [param_ratio(data, summary)]


def views() -> tuple[ProbeView, ...]:
    """The params probe's pieces: its section first among the probes', its plot last."""
    return (ProbeView(metrics=metrics, section=section, rank=10),
            ProbeView(plots=plots, aside=aside, rank=40))
