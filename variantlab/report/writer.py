"""Writing a report (:func:`write_report`), the body of :mod:`variantlab.report`, which
imports this module on first use of one of its names: a process that only needs a
part of the report package (the tuned-sweep chooser of ``variantlab run``, say) does
not import pandas' plotting, the templates and every view to get it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..plugin.registry import Registry
from .cards import verdict_cards
from .claims import COLUMNS as CLAIM_COLUMNS
from .claims import claims_table, csv_text, seeds_frame
from .converged import judge_on_headline
from .effects import compute_effects, effects_csv
from .fair.compare import FairParts, fair_of
from .findings import reading
from .frame import ReportData, gather
from .grid import browse_table, cross_run_table, effect_plots, effects_table, focus, interaction_table
from .guard import Failure, attempt, collecting, run_part
from .learned import learned_lines
from .parts import using
from .plots import Plot, build_plots, draw_all, inline_svg, to_svg
from .probeviews import probe_views
from .render import headers, render_html, render_markdown, title_of
from .tables import (
    SUMMARY_COLUMNS,
    MetricRows,
    Table,
    csv_safe,
    failure_table,
    section_tables,
    seed_metrics,
    summarize,
    summary_csv,
    variant_table,
    warning_table,
)
from .words import MAX_READING, compose, question_of

__all__ = ["ReportData", "ReportFiles", "build_context", "gather", "write_report"]


@dataclass(frozen=True)
class ReportFiles:
    """Paths of what ``write_report`` wrote."""

    markdown: Path
    html: Path
    csv: Path
    plots: tuple[Path, ...] = ()
    effects: Path | None = None
    tuned: Path | None = None  # a run with setting axes: report/tuned.csv
    by_size: Path | None = None  # a grid over size: report/effects_by_size.csv
    by_condition: Path | None = None  # a run with conditions: effects_by_condition.csv
    failed: tuple[Failure, ...] = ()  # parts that raised, each a notice in the report
    verdicts: Path | None = None  # verdicts.csv: one row per comparison (:mod:`.claims`)
    seeds: Path | None = None  # seeds.csv: one row per variant and seed


def build_context(data: ReportData, registry: Registry) -> tuple[dict[str, Any], list[Plot]]:
    """Everything the templates show, and the plots (figures not yet rendered). Every
    probe's part comes from ``registry``: the pieces of its views (summary metrics,
    section, plots, reading, warnings, fair comparisons; :mod:`.parts`), then its own
    tables and plots, or, for a probe with rows and no views, a generic table
    (:mod:`.probeviews`). A grid's effects come first (``effects``: None without a grid).

    Inside :func:`.guard.collecting` each part that raises gives its neutral value and a
    notice (``failed``: the :class:`.guard.Failure` list); outside it, errors propagate."""
    with collecting() as failed, using(registry):
        context, plots = _context(data, registry)
    context["failed"] = list(failed)
    return context, plots


def _none(failure: Failure) -> None:
    return None


def _empty(failure: Failure) -> list:
    return []


def _notice(title: str) -> Any:
    """A table in place of a failed one: its title and the notice."""
    return lambda failure: Table(title, ["failed"], [[failure.notice()]])


def _context(data: ReportData, registry: Registry) -> tuple[dict[str, Any], list[Plot]]:
    run_part("convergence", judge_on_headline, data, registry, default=_none)
    per_seed = run_part("summary metrics", seed_metrics, data, registry,
                        default=lambda f: MetricRows().frame())
    summary = run_part("summary", summarize, data, per_seed, registry,
                       default=lambda f: pd.DataFrame(columns=list(SUMMARY_COLUMNS)))
    effects = run_part("effects", compute_effects, data, per_seed, default=_none)
    lost: list[Failure] = []  # the claims' failure: the cards say so

    def no_claims(failure: Failure) -> pd.DataFrame:
        lost.append(failure)
        return pd.DataFrame(columns=list(CLAIM_COLUMNS))

    claims = run_part("claims", claims_table, data, effects, default=no_claims)
    seeds = run_part("seeds", seeds_frame, data, default=lambda f: pd.DataFrame())
    extra_tables, extra_plots = run_part("probe views", probe_views, data, registry,
                                         default=lambda f: ([], []))
    chosen, why = run_part("plot focus", focus, data, summary, effects,
                           default=lambda f: (None, ""))
    fair = run_part("fair comparisons", fair_of, data, registry, default=lambda f: FairParts())
    if fair.claims:  # the ranking rows of the fair comparison (:func:`.fair.compare.ranking_rows`)
        claims = pd.concat([claims, pd.DataFrame(fair.claims, columns=list(CLAIM_COLUMNS))],
                           ignore_index=True)
    plots = (run_part("effect plots", effect_plots, effects, default=_empty) + fair.plots
             + run_part("plots", build_plots, data, chosen, why, registry, default=_empty)
             + extra_plots)
    lines = run_part("reading", reading, data, summary, effects, registry, default=_empty)
    first = run_part("learned", learned_lines, data, default=_empty)
    said = run_part("verdicts", compose, data, claims, lines + fair.lines, first,
                    default=lambda f: (lines + fair.lines)[:MAX_READING])
    grid = effects is not None
    n_seeds = int(data.rows["seed"].dropna().nunique()) if "seed" in data.rows else 0
    context = {
        "title": title_of(data),
        "question": run_part("question", question_of, data, default=lambda f: ""),
        "cards": run_part("verdict cards", verdict_cards, claims, list(data.order), n_seeds,
                          failed=bool(lost), default=_empty),
        "headers": run_part("headers", headers, data, registry.probe_names(), default=_empty),
        "reading": said,
        "fair": fair.tables,
        "baseline": data.baseline,
        "effects": run_part("effects table", effects_table, effects, default=_notice(
            "Effects")) if grid else None,
        "interactions": run_part("interactions table", interaction_table, effects,
                                 default=_notice("Interactions"))
        if effects is not None and len(effects.pairs) else None,
        "across": run_part("runs table", cross_run_table, data, summary, default=_none),
        "variants": run_part("variants table", variant_table, data, default=_notice("Variants")),
        "browse": run_part("variant browser", browse_table, data, summary,
                           default=_notice("Variants")),
        "sections": run_part("sections", section_tables, data, summary, registry,
                             default=_empty) + extra_tables,
        "warnings": run_part("warnings table", warning_table, data, summary, registry,
                             default=_notice("Warnings")),
        "failures": run_part("failed units table", failure_table, data,
                             default=_notice("Failed units")),
        "plots": plots,
        "summary": summary,
        "effects_frame": effects,
        "fair_parts": fair,
        "claims": claims,
        "seeds": seeds,
    }
    return context, plots


def write_all(texts: dict[Path, str]) -> None:
    """Write every file or none: each to a hidden temporary name beside it, then all moved
    into place (renames need no space). A write that fails (a full disk) removes the
    temporaries and raises, leaving the folder as it was: an earlier report stays whole."""
    temps: list[Path] = []
    path = None
    try:
        for path, text in texts.items():
            temps.append(path.with_name(f".{path.name}.{os.getpid()}.tmp"))
            temps[-1].write_text(text, encoding="utf-8")
    except BaseException as exc:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and path is not None:
            exc.filename = str(path)  # the file the report could not write, not its temporary
        raise
    for path, tmp in zip(texts, temps):
        os.replace(tmp, path)


def write_report(runs: Sequence[Any], out_dir: Path, baseline: str | None = None, *,
                 registry: Registry | None = None) -> ReportFiles:
    """Write report.md (+ SVG files), report.html, summary.csv and effects.csv into
    ``out_dir``, all or none (:func:`write_all`).

    ``runs``: results stores (``results.sqlite``, its run folder, or a folder of run
    folders; see :mod:`variantlab.store.runs`) or ``RunData`` objects; one store named twice is
    read once; several runs put their variants in one report, prefixed by their run's label
    (``RUN/variant``) where names clash, so runs are never pooled.
    ``baseline``: the variant the ratios compare against (default: the first run's
    baseline, else its first variant). Raises ValueError for an unknown baseline.
    ``registry`` (default :func:`variantlab.get_registry`, or one with the run's ``--plugin``
    modules) gives the probes' report views.
    """
    if registry is None:
        from ..plugin.registry import get_registry

        registry = get_registry()
    if isinstance(runs, (str, Path)):
        runs = [runs]
    data = gather(list(runs), baseline)  # bad input (a ValueError) stops here
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with collecting() as failed:
        context, plots = build_context(data, registry)
        svgs: dict[str, str] = {}
        texts: dict[Path, str] = {}
        keys = {plot.key for plot in plots}
        stale = [old for old in out.glob("heatmap*.svg") if old.stem not in keys]
        drawn = [plot for plot in plots if plot.figure is not None]
        figures = [plot.figure for plot in drawn if plot.figure is not None]
        why: dict[int, Failure] = {}  # a drawing that raised, by its index in drawn

        def draw(i: int) -> str | None:  # a failure is said below, in plot order
            svg, failure = attempt(f"plot {drawn[i].key}: drawing", to_svg, figures[i])
            if failure is not None:
                why[i] = failure
            return svg

        drawings = draw_all(figures, draw)
        failed.extend(why[i] for i in sorted(why))
        index = {id(plot): i for i, plot in enumerate(drawn)}
        for plot in plots:
            svg_path = out / f"{plot.key}.svg"
            i = index.get(id(plot))
            svg = None if i is None else drawings[i]
            if svg is None:
                if i is not None:  # the drawing failed: a notice in its place
                    plot.figure, plot.skipped = None, why[i].notice()
                stale.append(svg_path)
                continue
            texts[svg_path] = svg
            svgs[plot.key] = inline_svg(svg, f"p-{plot.key}")
        context["failed"] = list(failed)
    written = list(texts)
    md, html, csv, effects = (out / n for n in ("report.md", "report.html", "summary.csv",
                                                 "effects.csv"))
    texts[md] = render_markdown(context)
    texts[html] = render_html(context, svgs)
    texts[csv] = summary_csv(context["summary"])
    texts[effects] = effects_csv(context["effects_frame"])
    verdicts, seeds = out / "verdicts.csv", out / "seeds.csv"
    texts[verdicts] = csv_text(context["claims"])
    texts[seeds] = csv_text(context["seeds"])
    fair = context["fair_parts"]
    tuned = out / "tuned.csv" if fair.tuned is not None else None
    by_size = out / "effects_by_size.csv" if fair.by_size is not None else None
    by_condition = out / "effects_by_condition.csv" if fair.by_condition is not None else None
    for path, frame in ((tuned, fair.tuned), (by_size, fair.by_size),
                        (by_condition, fair.by_condition)):
        if path is not None:
            texts[path] = csv_safe(frame).to_csv(index=False, float_format="%.6g",
                                                 lineterminator="\n")
    write_all(texts)
    for path in stale:  # an earlier report's plots that are not this one's
        path.unlink(missing_ok=True)
    for name, path in (("tuned.csv", tuned), ("effects_by_size.csv", by_size),
                       ("effects_by_condition.csv", by_condition)):
        if path is None:  # an earlier report's file is not this one's
            (out / name).unlink(missing_ok=True)
    return ReportFiles(md, html, csv, tuple(written), effects, tuned, by_size,
                       by_condition, tuple(failed), verdicts, seeds)
