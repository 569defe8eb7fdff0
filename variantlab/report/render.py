"""Markdown and self-contained HTML from the report's tables, reading and plots."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from ..store.contract import RunMeta
from .frame import ReportData
from .tables import Table

TEMPLATES = Path(__file__).parent / "templates"
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#~])")


def md_escape(value: Any) -> str:
    """Text safe in a Markdown table cell: HTML entities, escaped markup, one line."""
    text = str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return " ".join(text.split())


def md_table(table: Table) -> str:
    """A GitHub-flavoured Markdown table; every cell escaped."""
    if not table.rows:
        return ""
    head = "| " + " | ".join(md_escape(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" if _numeric(table, i) else "---"
                          for i in range(len(table.columns))) + "|"
    body = ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in table.rows]
    return "\n".join([head, rule, *body])


def _numeric(table: Table, i: int) -> bool:
    return all(re.match(r"^[-\d.,NaN—]", r[i] or "") for r in table.rows) and i > 0


@dataclass
class Header:
    run: str
    experiment: str
    description: str
    date: str
    variantlab_version: str
    torch_version: str
    device: str
    dtype: str
    seeds: str


def headers(data: ReportData, probes: Sequence[str] = ()) -> list[Header]:
    """One header per run: what was measured, when, on what (``probes``: the registered
    probes' names, in order; the dtype, when no row records it, is the first of their
    settings that names one)."""
    out = []
    for meta in data.runs:
        rows = data.rows[data.rows["run"] == meta.run]
        info = rows[rows["scope"] == "info"]

        def text(metric: str, info: pd.DataFrame = info) -> str:
            vals = list(dict.fromkeys(info.loc[info["metric"] == metric, "name"].astype(str)))
            return ", ".join(vals)

        device = text("device")
        units = data.units
        if not device and "device" in units.columns:
            mine = units[units["run"] == meta.run]
            device = ", ".join(dict.fromkeys(str(d) for d in mine["device"].dropna()))
        seeds = meta.seeds or sorted({int(s) for s in rows["seed"].dropna()})
        out.append(Header(
            run=meta.run or meta.experiment,
            experiment=meta.experiment,
            description=meta.description,
            date=meta.created or "unknown",
            variantlab_version=meta.variantlab_version or "unknown",
            torch_version=meta.torch_version or text("torch_version") or "unknown",
            device=device or "unknown",
            dtype=text("dtype") or _settings_dtype(meta, probes) or "float32",
            seeds=", ".join(str(s) for s in seeds),
        ))
    return out


def _settings_dtype(meta: RunMeta, probes: Sequence[str]) -> str:
    for probe in probes:
        settings = meta.measure.get(probe) or {}
        if isinstance(settings, dict) and settings.get("dtype"):
            return str(settings["dtype"])
    return ""


def unbroken_words(text: object, number: bool = False) -> Markup:
    """``text`` escaped, each of its words in a ``span.w`` that does not break, so a label
    wraps between words only, never inside ``pattern=[mamba2]`` (the browser would break
    before its bracket); a ``number`` cell's words are its value and its bracketed interval
    or ratio (``-0.68 [-0.70, -0.66]`` wraps before the bracket or not at all)."""
    words = re.split(r" (?=[\[(])", str(text).strip()) if number else str(text).split()
    return Markup(" ").join(Markup('<span class="w">{}</span>').format(w) for w in words)


def _env(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                             autoescape=autoescape, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_escape
    env.filters["md_table"] = md_table
    env.filters["words"] = unbroken_words
    env.tests["number"] = is_number
    return env


#: a cell that reads as a number: ``3.4``, ``-0.01``, ``1,024``, ``2.9 ± 0.1 (×1.02)``,
#: ``[0.1, 0.3]``, ``2/3``, ``NaN``, ``—``, and the yes/no of a "clear" column
NUMBER_CELL = re.compile(r"^(\[?[-+]?\.?\d|NaN\b|-?inf\b|—|yes$|no$)", re.IGNORECASE)


def is_number(cell: object) -> bool:
    """Whether a table cell reads as a number (kept on one line, right-aligned in HTML)."""
    return bool(NUMBER_CELL.match(str(cell)))


#: columns that carry a table's answer: in HTML they follow the label columns (issue 40.3)
ANSWER_COLUMNS = ("rank", "group", "verdict", "clear", "at edge", "diverged", "still improving",
                  "improving", "across conditions", "across sizes", "across")
#: the first column that measures (a label column never does): the labels end before it
_MEASURE = re.compile(r"^(effect|interaction|95% interval|n seeds|lr sensitivity|(val|test)[_ ].*"
                      r"|.* \(chose\))$")
#: short HTML headers; the table's legend spells each shortened one out
SHORT_NAMES = {"95% interval": "95% CI", "n seeds": "n", "still improving": "improving",
               "lr sensitivity": "lr sens.", "across conditions": "across", "across sizes": "across"}


def is_answer(column: str) -> bool:
    """Whether a column carries the table's answer: a rank, a verdict word, a flag, or a
    difference against the baseline (``vs NAME``)."""
    return column in ANSWER_COLUMNS or column.startswith("vs ")


def short_name(column: str, columns: Sequence[str]) -> str:
    """A header of at most a few characters' width: a dotted axis by its last key (when no
    other column ends in it), the chosen-on and reported metrics as ``val`` and ``test``, a
    baseline difference as ``vs base``, a few long words cut (:data:`SHORT_NAMES`)."""
    if column in SHORT_NAMES:
        return SHORT_NAMES[column]
    if column.startswith("vs "):
        return "vs base"
    if column.endswith(" (chose)"):
        return column.split("_", 1)[0].split(" ", 1)[0] + " (chose)"
    if re.fullmatch(r"(val|test)_\w+", column):
        return column.split("_", 1)[0]
    last = column.rsplit(".", 1)[-1]
    if re.fullmatch(r"\w+(\.\w+)+", column) and sum(c.rsplit(".", 1)[-1] == last
                                                  for c in columns) == 1:
        return last
    return column


@dataclass
class Fitted:
    """A table laid out for a page: its answer columns beside its labels, short headers, and
    a legend that spells out each shortened one."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str
    legend: str


def fitted(table: Table) -> Fitted:
    """``table`` for report.html: the label columns (those before the first answer or
    measuring column), then the answer columns (:func:`is_answer`), then the rest, each
    header shortened (:func:`short_name`)."""
    cols = table.columns
    end = next((i for i, c in enumerate(cols) if is_answer(c) or _MEASURE.match(c)), len(cols))
    end = max(end, 1)
    order = [*range(end), *[i for i in range(end, len(cols)) if is_answer(cols[i])],
             *[i for i in range(end, len(cols)) if not is_answer(cols[i])]]
    names = [short_name(cols[i], cols) for i in order]
    legend = "; ".join(f"{s}: {cols[i]}" for s, i in zip(names, order) if s != cols[i])
    return Fitted(table.title, names, [[row[i] for i in order] for row in table.rows],
                  table.note, legend)


def render_markdown(context: dict[str, Any]) -> str:
    """report.md; plots are linked as SVG files beside it."""
    return _env(False).get_template("report.md.j2").render(**context)


def render_html(context: dict[str, Any], svgs: dict[str, str]) -> str:
    """report.html: one file, inline CSS, SVG and script, no external references."""
    inline = {k: Markup(v) for k, v in svgs.items()}  # matplotlib escapes the text it writes
    laid_out = {"effects": context["effects"] and fitted(context["effects"]),
                "interactions": context["interactions"] and fitted(context["interactions"]),
                "fair": [fitted(t) for t in context["fair"]]}
    return _env(True).get_template("report.html.j2").render(**{**context, **laid_out},
                                                            svgs=inline,
                                                            script=Markup(browse_script()))


def table_html(table: Table | Fitted, cls: str, baseline: str,
               legend: str | None = None) -> Markup:
    """One table as report.html writes it (templates/table.html.j2): ``legend`` is a fitted
    table's (its words then never break), None for a table shown as it is."""
    module = _env(True).get_template("table.html.j2").make_module({"baseline": baseline})
    return Markup(module.table(table, cls, legend))  # type: ignore[attr-defined]  # the macro


def style_sheet() -> str:
    """report.html's ``<style>`` element, as the template writes it."""
    text = (TEMPLATES / "report.html.j2").read_text(encoding="utf-8")
    return text[text.index("<style>"):text.index("</style>") + len("</style>")]


def browse_script() -> str:
    """The page's one script (templates/browse.js): sorts and filters the variant table."""
    return (TEMPLATES / "browse.js").read_text(encoding="utf-8").strip()


def title_of(data: ReportData) -> str:
    names = list(dict.fromkeys(m.experiment for m in data.runs))
    runs = f" ({len(data.runs)} runs)" if len(data.runs) > len(names) else ""
    return "variantlab report: " + " + ".join(names) + runs
