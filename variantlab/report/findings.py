"""The reading at the top of a report: short sentences computed from the numbers."""

from __future__ import annotations

import math

import pandas as pd

from .dynamics_findings import dynamics_reading
from .effects import Effects
from .frame import ReportData, split_seeds
from .sweep import grid_reading, problems
from .tables import PASS_NAMES, depth_ratios, fmt, stacks_of

MAX_LISTED = 4  # with many variants, name the extremes only
SMALL_GRID = 8  # a grid of this many variants or fewer also gets the per-variant reading


def _means(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    part = summary[(summary["metric"] == metric) & summary["mean"].notna()]
    return part.set_index("variant")


def _listing(pairs: list[tuple[str, str]]) -> str:
    if len(pairs) > MAX_LISTED:
        pairs = pairs[:2] + [("…", "")] + pairs[-2:]
    return "; ".join(f"{v}: {t}" if t else v for v, t in pairs)


def gradient_growth(data: ReportData) -> str | None:
    """How the gradient norm changes from the first to the last layer, per variant; in a
    model of several stacks, one sentence per stack (layers compared within it)."""
    ratios = depth_ratios(data.rows)
    if not len(ratios):
        return None
    out = []
    for stack in stacks_of(ratios):
        text = _growth(ratios[ratios["stack"] == stack])
        out.append(f"{stack.capitalize()}: {text[0].lower()}{text[1:]}" if stack else text)
    return " ".join(out)


def _growth(ratios: pd.DataFrame) -> str:
    names = set(ratios["name"])
    name = "feedforward" if "feedforward" in names else "all" if "all" in names else min(names)
    part = ratios[ratios["name"] == name]
    agg = part.groupby("variant", sort=False).agg(value=("value", "mean"),
                                                   first=("first_layer", "min"),
                                                   last=("last_layer", "max"))
    agg = agg.sort_values("value", ascending=False)
    what = {"all": "gradient norm", "feedforward": "FFN gradient norm"}.get(name,
                                                                          f"{name} gradient norm")
    pairs = []
    for i, (variant, rec) in enumerate(agg.iterrows()):
        value = rec["value"]
        if abs(value - 1) < 0.05:
            change = f"stays within 5% ({value:.2f}x)"
        elif value > 1:
            change = f"rises {value:.1f}x"
        else:
            change = f"falls {1 / value:.1f}x"
        if i == 0:
            change = (f"{what} {change} from layer {int(rec['first'])} "
                      f"to layer {int(rec['last'])}")
        elif value > 1 and abs(value - 1) >= 0.05:
            change = f"{value:.1f}x"
        pairs.append((variant, change))
    return _listing(pairs) + "."


def first_layer_gradient(data: ReportData, summary: pd.DataFrame) -> str | None:
    """The first layer's mean |grad| against the baseline's, when it differs by 2x or more
    (per stack in a model of several)."""
    metrics = [m for m in dict.fromkeys(summary["metric"])
               if m == "first_layer_mean_abs_grad" or m.startswith("first_layer_mean_abs_grad.")]
    out = [t for t in (_first_layer(data, summary, m) for m in metrics) if t]
    return " ".join(out) or None


def _first_layer(data: ReportData, summary: pd.DataFrame, metric: str) -> str | None:
    means = _means(summary, metric)
    if len(means) < 2 or data.baseline not in means.index:
        return None
    base = means.loc[data.baseline, "mean"]
    if not base > 0:
        return None
    ratio = (means["mean"] / base).drop(index=data.baseline)
    pairs = [(v, f"{fmt(means.loc[v, 'mean'])} ({r:,.0f}x)" if r >= 100 else
              f"{fmt(means.loc[v, 'mean'])} ({r:.3g}x)") for v, r in ratio.items()
             if r >= 2 or r <= 0.5]
    if not pairs:
        return None
    pairs.sort(key=lambda p: -ratio[p[0]])
    stack = metric.partition(".")[2]
    what = f"{stack.capitalize()} first-layer" if stack else "First-layer"
    return (f"{what} mean |grad|: {data.baseline} {fmt(base)}; " + _listing(pairs) + ".")


def timing_speed(data: ReportData, summary: pd.DataFrame) -> str | None:
    """The fastest and slowest variant against the baseline on the slowest-measured pass.

    With several seeds each timing unit is an independent measurement (its own process
    state, minutes apart), so the speed-up is judged seed by seed; with one, only against
    the timing IQR, which misses the machine's drift between units, and the text says so.
    """
    for key in ("backward", "step", "forward"):
        metric = f"{key}_median_s"
        means = _means(summary, metric)
        if len(means) < 2 or data.baseline not in means.index:
            continue
        base = means.loc[data.baseline, "mean"]
        others = means.drop(index=data.baseline)["mean"]
        per_seed = paired_ratios(data.rows, "timing", metric, data.baseline)
        parts = []
        for variant in dict.fromkeys([others.idxmin(), others.idxmax()]):
            ratio = base / others[variant]
            if math.isclose(ratio, 1.0, rel_tol=0.02):
                parts.append(f"{variant} is as fast as {data.baseline} (within 2%)")
                continue
            speed = f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"
            seeds = per_seed.get(variant, [])
            if len(seeds) >= 2:
                how = _speed_sureness(seeds, ratio > 1)
            else:
                iqr = max(_nan0(means.loc[variant, "iqr"]), _nan0(means.loc[data.baseline, "iqr"]))
                how = (" (within the timing IQR: not a clear difference)"
                       if abs(base - others[variant]) <= iqr else
                       " (one timing unit each; more seeds would show the run-to-run spread)")
            parts.append(f"{variant} is {speed} than {data.baseline}{how}"
                         + _apart(data, metric, variant))
        return f"{PASS_NAMES[key]}: " + "; ".join(parts) + "."
    return None


def _apart(data: ReportData, metric: str, variant: str) -> str:
    """Says so when the compared timings were measured by different runs."""
    seeds = split_seeds(data.rows, metric, data.baseline, variant)
    if not seeds:
        return ""
    which = ", ".join(str(s) for s in seeds)
    return (f" (but timed in different invocations of `variantlab run` on seed(s) {which}, "
            "not side by side: rerun both together to compare)")


def paired_ratios(rows: pd.DataFrame, probe: str, metric: str, baseline: str) -> dict[str, list]:
    """Per variant: the baseline's value over the variant's, seed by seed (a speed-up)."""
    table = _by_seed(rows, probe, metric, baseline)
    ratios = (1 / table).mul(table[baseline], axis=0).drop(columns=baseline)
    return {v: ratios[v].dropna().tolist() for v in ratios}


def _by_seed(rows: pd.DataFrame, probe: str, metric: str, baseline: str) -> pd.DataFrame:
    """Model-scope values, seeds down and variants across (empty without the baseline)."""
    part = rows[(rows["probe"] == probe) & (rows["metric"] == metric)
                & (rows["scope"] == "model") & rows["value"].notna()]
    table = part.pivot_table(index="seed", columns="variant", values="value", aggfunc="mean")
    return table if baseline in table else pd.DataFrame({baseline: []})


def _speed_sureness(ratios: list[float], faster: bool) -> str:
    """Speed-ups seed by seed, said in the claim's direction (slow-downs as 1/r)."""
    agree = sum(1 for r in ratios if (r > 1) == faster)
    shown = sorted(r if faster else 1 / r for r in ratios)
    return _verdict(agree, len(ratios), f"per-seed {shown[0]:.2f}x to {shown[-1]:.2f}x")


def _verdict(agree: int, n: int, span: str) -> str:
    """Whether a difference held on every seed, with its per-seed span."""
    if agree == n:
        return f" on every seed (n={n}, {span})"
    return f" on {agree} of {n} seeds ({span}): not a clear difference"


def loss_gap(data: ReportData, summary: pd.DataFrame) -> str | None:
    """Eval loss (else final training loss) of the best and worst variant against the
    baseline's, with how sure: seeds are paired (same data per seed), so the gap is judged
    by its per-seed values, not by the spread of either variant alone."""
    metric = "eval_loss" if (summary["metric"] == "eval_loss").any() else "final_loss"
    what = "eval loss" if metric == "eval_loss" else "final loss"
    means = _means(summary, metric)
    if len(means) < 2 or data.baseline not in means.index:
        return None
    base = means.loc[data.baseline]
    others = means.drop(index=data.baseline)
    per_seed = paired_gaps(data.rows, "training", metric, data.baseline)
    parts = []
    for variant in dict.fromkeys([others["mean"].idxmin(), others["mean"].idxmax()]):
        gap = others.loc[variant, "mean"] - base["mean"]
        where = "above" if gap > 0 else "below"
        parts.append(f"{variant}'s {what} is {fmt(abs(gap))} {where} "
                     f"{data.baseline}'s{_sureness(per_seed.get(variant, []))}")
    return "; ".join(parts) + "."


def paired_gaps(rows: pd.DataFrame, probe: str, metric: str, baseline: str) -> dict[str, list]:
    """Per variant: value minus the baseline's value, seed by seed (seeds both have)."""
    table = _by_seed(rows, probe, metric, baseline)
    diffs = table.sub(table[baseline], axis=0).drop(columns=baseline)
    return {v: diffs[v].dropna().tolist() for v in diffs}


def _sureness(gaps: list[float]) -> str:
    """``(every seed, n=3)``, ``(2 of 3 seeds)`` or nothing for one seed."""
    if len(gaps) < 2:
        return ""
    sign = 1 if sum(gaps) > 0 else -1
    agree = sum(1 for g in gaps if g * sign > 0)
    return _verdict(agree, len(gaps), f"per-seed gap {fmt(min(gaps))} to {fmt(max(gaps))}")


def _nan0(x: float) -> float:
    return 0.0 if x is None or math.isnan(x) else float(x)


def param_ratio(data: ReportData, summary: pd.DataFrame) -> str | None:
    means = _means(summary, "total")
    if len(means) < 2 or data.baseline not in means.index:
        return None
    ratio = (means["mean"] / means.loc[data.baseline, "mean"]).drop(index=data.baseline)
    if (ratio - 1).abs().max() < 1e-9:
        return f"All variants have {fmt(means.loc[data.baseline, 'mean'], 'count')} parameters."
    base = means.loc[data.baseline, "mean"]
    parts = []
    for v in dict.fromkeys([ratio.idxmax(), ratio.idxmin()]):
        if math.isclose(ratio[v], 1.0):
            continue
        if abs(ratio[v] - 1) < 0.05:
            diff = means.loc[v, "mean"] - base
            parts.append(f"{v} has {fmt(abs(diff), 'count')} {'more' if diff > 0 else 'fewer'}"
                         f" parameters than {data.baseline} ({abs(ratio[v] - 1):.2%})")
        else:
            parts.append(f"{v} has {ratio[v]:.2f}x the parameters of {data.baseline}")
    return "; ".join(parts) + "." if parts else None


def reading(data: ReportData, summary: pd.DataFrame, effects: Effects | None = None) -> list[str]:
    """The report's opening sentences, in order of what readers look at first: for a grid,
    what each axis does (see :mod:`.sweep`), and for a grid of at most SMALL_GRID variants
    the per-variant comparison where it fits; else the per-variant comparison. Problems are
    grouped by message either way, so the reading stays short at any size."""
    trouble = problems(data, summary)
    lines = [gradient_growth(data), first_layer_gradient(data, summary),
             timing_speed(data, summary), loss_gap(data, summary), *dynamics_reading(data)]
    if effects is not None:  # a small grid keeps its per-variant sentences where they fit
        small = len(data.order) <= SMALL_GRID
        return grid_reading(data, summary, effects, trouble,
                            [line for line in lines if line] if small else [])
    out = [line for line in lines + [param_ratio(data, summary)] if line] + trouble
    return out or ["No probe produced comparable numbers; see the tables below."]
