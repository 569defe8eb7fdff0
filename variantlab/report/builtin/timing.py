"""What the report shows of the ``timing`` probe: per pass the median time (with its IQR),
throughput, MFU and compile time, peak memory, whether it ran compiled; which invocation of
``variantlab run`` timed each variant; a bar chart per pass; and which variant is faster."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ...plugin.probe import ProbeView
from ..findings import timing_speed
from ..frame import ReportData, invocation_numbers
from ..headline import conditions_of
from ..plots import Plot, label_lines, mean_by, new_axes, shown, styles
from ..tables import PASS_NAMES, MetricRows, Table, select, summary_section
from ..timing_claims import timing_rows
from .dynamics_summary import seed_rows

PROBE = "timing"
NOTE = "median per pass over repeats ± its interquartile range"


def metrics(data: ReportData) -> pd.DataFrame:
    """Per pass: median (ms, with its IQR), the speed-up over the baseline (:func:`speedups`),
    throughput, MFU (%) and compile time; then peak memory (MiB) and, once any run was
    compiled, whether it was."""
    rows, out = data.rows, MetricRows()
    for key, label in PASS_NAMES.items():
        out.add(select(rows, PROBE, f"{key}_median_s"), PROBE, f"{key}_median_s",
                f"{label} median", "ms", 1e3, iqr=select(rows, PROBE, f"{key}_iqr_s"))
        out.add(speedups(data, key), PROBE, f"{key}_speedup", f"{label} speed-up over the "
                "baseline (x)", "", ratio=False)
        out.add(select(rows, PROBE, f"{key}_tokens_per_s"), PROBE, f"{key}_tokens_per_s",
                f"{label} throughput", "tokens/s")
        out.add(select(rows, PROBE, f"{key}_mfu"), PROBE, f"{key}_mfu", f"{label} MFU", "%", 100)
        out.add(select(rows, PROBE, f"{key}_compile_s"), PROBE, f"{key}_compile_s",
                f"{label} compile time", "s")
    out.add(select(rows, PROBE, "peak_memory_bytes"), PROBE, "peak_memory_bytes",
            "peak memory", "MiB", 1 / 2**20)
    compiled = select(rows, PROBE, "compiled")  # 1: under torch.compile
    if (compiled["value"] == 1).any():
        out.add(compiled, PROBE, f"{PROBE}.compiled", "compiled (torch.compile)", "",
                ratio=False)
    return out.frame()


def speedups(data: ReportData, key: str) -> pd.DataFrame:
    """Per variant of the baseline's condition (not the baseline) and seed: the baseline's
    median time of the pass over the variant's at the same seed (above 1: faster), the
    per-seed speed-ups the reading judges (``(variant, seed, value)`` rows)."""
    part = select(data.rows, PROBE, f"{key}_median_s")
    table = part[part["value"].notna()].pivot_table(index="seed", columns="variant",
                                                    values="value", aggfunc="mean")
    if data.baseline not in table:
        return seed_rows(pd.DataFrame())
    conds = conditions_of(data)
    mine = [v for v in table if v != data.baseline
            and conds.get(str(v)) == conds.get(data.baseline)]
    return seed_rows((1 / table[mine]).mul(table[data.baseline], axis=0))


def section(data: ReportData, summary: pd.DataFrame) -> Table | None:
    """The timing table; with timings from several invocations, a column numbering them."""
    timed = invocation_numbers(data.rows, PROBE)
    if len(timed) <= 1:
        return summary_section(data, summary, PROBE, "Timing", NOTE)
    note = NOTE + (f"; these timings come from {len(timed)} invocations of `variantlab run` "
                   "(numbered in time order in the column 'timed in run', e.g. after --only "
                   "or a resume): only timings of one invocation were measured side by side")
    cells = {v: _timed_in(data.rows, v, timed) for v in data.order}
    return summary_section(data, summary, PROBE, "Timing", note, ("timed in run", cells))


def _timed_in(rows: pd.DataFrame, variant: str, numbers: dict[str, int]) -> str:
    mine = rows.loc[(rows["probe"] == PROBE) & (rows["variant"] == variant), "invocation"]
    found = sorted({numbers[i] for i in mine.dropna() if i in numbers})
    return ", ".join(f"#{n}" for n in found) or "?"


def timing_plot(data: ReportData) -> Plot:
    title = "Time per pass"
    caption = ("Median wall time per pass over repeats (mean over seeds); whiskers span the "
               "interquartile range.")
    rows = data.rows[data.rows["probe"] == PROBE]
    passes = [p for p in PASS_NAMES if (rows["metric"] == f"{p}_median_s").any()]
    if not passes:
        return Plot("timing", title, caption, skipped="no timing rows (the timing probe did "
                    "not run)")
    variants = [v for v in data.order if v in set(rows["variant"])]
    fig, axes = new_axes(1, len(passes), height=1.2 + 0.28 * label_lines(variants),
                     width=2.6 * len(passes) + 2.4)
    colors = styles(len(variants))
    for ax, key in zip(axes, passes):
        med = mean_by(rows[rows["metric"] == f"{key}_median_s"], ["variant"]).set_index("variant")
        iqr = mean_by(rows[rows["metric"] == f"{key}_iqr_s"], ["variant"]).set_index("variant")
        vals = [med["value"].get(v, float("nan")) * 1e3 for v in variants]
        errs = [iqr["value"].get(v, 0.0) * 1e3 / 2 for v in variants]
        ax.barh(range(len(variants)), vals, xerr=errs, capsize=2,
                color=[c["color"] for c in colors])
        ax.set_yticks(range(len(variants)), [shown(v) for v in variants] if ax is axes[0]
                      else [""] * len(variants))
        ax.invert_yaxis()
        ax.set_title(PASS_NAMES[key])
        ax.set_xlabel("median time (ms)")
        ax.set_ylabel("variant")
    fig.suptitle(title)
    return Plot("timing", title, caption, fig)


def plots(data: ReportData) -> list[Plot]:
    return [timing_plot(data)]


def reading(data: ReportData, summary: pd.DataFrame) -> Sequence[str | None]:
    return [timing_speed(data, summary)]


def views() -> tuple[ProbeView, ...]:
    """The timing probe's pieces, after the params section and the gradients plots."""
    return (ProbeView(metrics=metrics, section=section, plots=plots, reading=reading,
                      claims=timing_rows, rank=20),)
