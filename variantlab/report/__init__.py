"""Reports: variants side by side in Markdown, one self-contained HTML page and CSV.

``write_report(runs, out_dir, baseline=None)`` reads one or more results stores (or
``RunData`` objects) and writes ``report.md`` with SVG plots beside it, ``report.html``
(inline CSS, SVG and one small script that sorts and filters the variant table; no external
references), ``summary.csv``, ``effects.csv`` (a grid's effects; see :mod:`.effects`),
``verdicts.csv`` (every comparison the report makes, one row each, and the only source of
its verdict words; :mod:`.claims`, rendered by :mod:`.words`), ``seeds.csv`` (per variant
and seed),
and for sweeps over probe settings or model size ``tuned.csv`` and ``effects_by_size.csv``
(:mod:`.fair`). Both pages open with the experiment's question and one verdict card per
condition (:mod:`.cards`); the run's date, versions, device and seeds follow them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .writer import ReportData, ReportFiles, build_context, gather, write_report

__all__ = ["ReportData", "ReportFiles", "build_context", "gather", "write_report"]


def __getattr__(name: str) -> Any:
    """The writer's names (:mod:`.writer`), imported on first use, so that importing a
    submodule (``variantlab.report.fair.extension``) does not import all of them; any
    other name is not an attribute (a submodule's is set when it is imported)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(".writer", __name__), name)
