"""Reports: variants side by side in Markdown, one self-contained HTML page and CSV.

``write_report(runs, out_dir, baseline=None)`` reads one or more results stores (or
``RunData`` objects) and writes ``report.md`` with SVG plots beside it, ``report.html``
(inline CSS and SVG, no scripts, no external references) and ``summary.csv``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .findings import reading
from .frame import ReportData, gather
from .plots import Plot, build_plots, inline_svg, to_svg
from .probeviews import probe_views
from .render import headers, render_html, render_markdown, title_of
from .tables import (section_tables, summarize, summary_csv, failure_table, variant_table,
                     warning_table)

__all__ = ["ReportData", "ReportFiles", "build_context", "gather", "write_report"]


@dataclass(frozen=True)
class ReportFiles:
    """Paths of what ``write_report`` wrote."""

    markdown: Path
    html: Path
    csv: Path
    plots: tuple[Path, ...] = ()


def build_context(data: ReportData, registry: Any = None) -> tuple[dict[str, Any], list[Plot]]:
    """Everything the templates show, and the plots (figures not yet rendered); probes
    beyond the core sections show their views from ``registry`` (default: the default
    registry) or a generic table."""
    summary = summarize(data)
    extra_tables, extra_plots = probe_views(data, registry)
    plots = build_plots(data) + extra_plots
    context = {
        "title": title_of(data),
        "headers": headers(data),
        "reading": reading(data, summary),
        "baseline": data.baseline,
        "variants": variant_table(data),
        "sections": section_tables(data, summary) + extra_tables,
        "warnings": warning_table(data, summary),
        "failures": failure_table(data),
        "plots": plots,
        "summary": summary,
    }
    return context, plots


def write_report(runs: Sequence[Any], out_dir: Path, baseline: str | None = None,
                 registry: Any = None) -> ReportFiles:
    """Write report.md (+ SVG files), report.html and summary.csv into ``out_dir``.

    ``runs``: results stores (``results.sqlite``, its run folder, or a folder of run
    folders; see :mod:`variantlab.runs`) or ``RunData`` objects; one store named twice is
    read once; several runs put their variants in one report, prefixed by their run's label
    (``RUN/variant``) where names clash, so runs are never pooled.
    ``baseline``: the variant the ratios compare against (default: the first run's
    baseline, else its first variant). Raises ValueError for an unknown baseline.
    """
    if isinstance(runs, (str, Path)):
        runs = [runs]
    data = gather(list(runs), baseline)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    context, plots = build_context(data, registry)
    svgs: dict[str, str] = {}
    written = []
    for plot in plots:
        svg_path = out / f"{plot.key}.svg"
        if plot.figure is None:
            svg_path.unlink(missing_ok=True)
            continue
        svg = to_svg(plot.figure)
        svg_path.write_text(svg, encoding="utf-8")
        written.append(svg_path)
        svgs[plot.key] = inline_svg(svg, f"p-{plot.key}")
    md = out / "report.md"
    md.write_text(render_markdown(context), encoding="utf-8")
    html = out / "report.html"
    html.write_text(render_html(context, svgs), encoding="utf-8")
    csv = out / "summary.csv"
    csv.write_text(summary_csv(context["summary"]), encoding="utf-8")
    return ReportFiles(md, html, csv, tuple(written))
