"""The findings table (``variantlab findings reports/``): one row per committed report,
rendered from its files, never written by hand.

Each row holds the experiment's ``question:`` (its YAML in the experiments folder), the
verdicts of its ``verdicts.csv`` on the headline test metric per condition (each clear
verdict with its estimate, 95% interval and caveats; pairs that are not clearly different
listed by name), the sizes and the budget (steps, batch, seeds, learning rates) from the
experiment file, the running time from the results export beside the report
(:mod:`variantlab.store.export`; a dash without one) and the YAML's hand-written ``note:``.
A report folder without ``verdicts.csv`` gets a row that says it was not yet regenerated
with verdict rows, and no numbers (its note waits too); one whose report compares nothing
(a pilot: every axis a condition) gets the headline test metric per condition from its
``seeds.csv`` instead (:func:`values_cell`). A ``note:`` may quote only numbers that the
report's CSVs hold (:func:`unquoted_numbers`); the command refuses one that quotes another.

README.md and docs/findings.md hold the table between :data:`START` and :data:`END`
(:func:`replace_table`); tests/test_findings_table.py fails when either differs from it.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..config.yamlio import YamlDoc, load_yaml, read_text
from ..errors import InputError
from ..store.export import EXPORT_FILE
from .render import md_escape

VERDICTS_FILE = "verdicts.csv"
SEEDS_FILE = "seeds.csv"
RESTATED = ("lead", "ranking")  # row kinds the findings table leaves out
#: a grid's main effects averaged over its other axes: descriptions, not verdicts on any one
#: condition; the cell gives them only when a report has no per-condition rows
AVERAGE = "average"
#: the pairs again on the headline scored at other lengths (eval_lengths): after its rows
LENGTH = "length"
NOT_YET = "not yet regenerated with verdict rows"
START, END = "<!-- findings:start -->", "<!-- findings:end -->"
COLUMNS = ["experiment", "question", "verdicts (headline test metric, per condition)", "sizes",
           "budget", "running time"]
#: verdict words that carry an estimate and an interval worth showing
CLEAR = ("lower", "higher", "equal")
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", re.IGNORECASE)
BACKTICKED = re.compile(r"`[^`]*`")


@dataclass(frozen=True)
class Finding:
    """One row of the table, its cells as plain text."""

    name: str
    question: str
    verdicts: str
    sizes: str
    budget: str
    running: str

    def cells(self) -> list[str]:
        return [self.name, self.question, self.verdicts, self.sizes, self.budget, self.running]


def short(value: float) -> str:
    """Three significant digits, no exponent above 1e-4 ("0.0871", "-1.29", "350")."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.2e}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


# -- the experiment file -------------------------------------------------------------------
def experiment_doc(path: Path) -> YamlDoc:
    """The experiment file as data with positions (YamlError, an InputError's kin, else)."""
    return load_yaml(read_text(path), str(path))


def _values(axis: Any) -> tuple[list[Any], int]:
    """A grid axis's values and its edge extensions (``{values: [...], extend: N}``, a named
    mapping ``{name: value}``, or a list)."""
    if isinstance(axis, dict) and "values" in axis:
        extend = axis.get("extend", 0)
        return list(axis["values"]), 3 if extend is True else int(extend or 0)
    if isinstance(axis, dict):
        return list(axis.values()), 0
    return list(axis) if isinstance(axis, list) else [axis], 0


def sizes(doc: dict[str, Any]) -> str:
    """Width and depth of the model: every value of ``emb_dim`` and ``n_layers`` the model,
    the grid or a named variant gives."""
    model = doc.get("model") or {}
    parts = []
    for key, word in (("emb_dim", "width"), ("n_layers", "layers")):
        values = [v for v in _all_values(doc, key, model.get(key)) if v is not None]
        if values:
            shown = ", ".join(str(v) for v in values)
            parts.append(f"{word} {shown}" if key == "emb_dim" else f"{shown} {word}")
    if not parts and model.get("layer_sizes"):
        parts.append("MLP " + "-".join(str(v) for v in model["layer_sizes"]))
    return "; ".join(parts) or "-"


def _all_values(doc: dict[str, Any], key: str, base: Any) -> list[Any]:
    """Every value ``key`` takes in the experiment: the base, the grid's, the variants'
    (``set:``), in that order, once each."""
    values = [base] if base is not None else []
    grid = doc.get("grid") or {}
    if key in grid:
        values = _values(grid[key])[0]
    for variant in doc.get("variants") or []:
        if isinstance(variant, dict) and isinstance(variant.get("set"), dict) \
                and key in variant["set"]:
            values.append(variant["set"][key])
    return list(dict.fromkeys(values))


def budget(doc: dict[str, Any]) -> str:
    """Steps (every value a grid axis or a variant gives them) and batch of the probe that
    trains (training, else dynamics), the seeds, and the learning rates: the tuned ones of
    the grid, else the one rate."""
    measure, grid = doc.get("measure") or {}, doc.get("grid") or {}
    seeds = len(doc.get("seeds") or [0])
    parts = []
    probe = next((p for p in ("training", "dynamics") if p in measure), None)
    if probe is None:
        probes = ", ".join(measure) or "params"
        return f"{probes} at initialisation; {seeds} seed{'s' * (seeds != 1)}"
    settings = measure.get(probe) or {}
    steps, batch = _all_values(doc, f"measure.{probe}.steps", settings.get("steps")), \
        settings.get("batch_size")
    parts.append(f"{', '.join(str(v) for v in steps) if steps else 'default'} steps"
                 + (f" of batch {batch}" if batch is not None else ""))
    parts.append(f"{seeds} seed{'s' * (seeds != 1)}")
    axis = f"measure.{probe}.lr"
    if axis in grid:
        rates, extend = _values(grid[axis])
        parts.append("lr " + ", ".join(f"{r:g}" for r in rates) + " tuned"
                     + (f" (+{extend} beyond an edge)" if extend else ""))
    elif len(rates := _all_values(doc, axis, settings.get("lr"))) > 1:
        parts.append("lr " + ", ".join(f"{r:g}" for r in rates) + " (named variants)")
    elif rates:
        parts.append(f"lr {rates[0]:g} (one rate, not tuned)")
    return "; ".join(parts)


# -- the report's files --------------------------------------------------------------------
def running_time(folder: Path) -> str:
    """From the export beside the report: per ``variantlab run`` invocation, its first unit's
    start to its last unit's end, summed; "-" without an export."""
    path = folder / EXPORT_FILE
    if not path.is_file():
        return "-"
    spans: dict[str, list[datetime]] = {}
    try:
        units = json.loads(gzip.decompress(path.read_bytes()))["units"]
        for inv, start, end in zip(units["invocation"], units["started_at"],
                                   units["finished_at"]):
            if start and end:
                times = spans.setdefault(str(inv), [])
                times += [datetime.fromisoformat(start), datetime.fromisoformat(end)]
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise InputError([f"{path}: not a results export ({exc}); write it again with "
                          "variantlab export-results RUN"]) from None
    seconds = sum((max(t) - min(t)).total_seconds() for t in spans.values())
    if not spans:
        return "-"
    return duration(seconds)


def duration(seconds: float) -> str:
    """A running time as the findings table gives it: minutes from one minute on, seconds
    below, "under 1 s" where a rounded 0 would read as nothing run."""
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{round(seconds)} s" if round(seconds) >= 1 else "under 1 s"


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _headline(rows: list[dict[str, Any]], compare_on: str) -> list[dict[str, Any]]:
    """The rows of the headline test metric, else of the headline metric, else all."""
    for metric in (f"test_{compare_on}", compare_on):
        mine = [r for r in rows if _text(r.get("metric")) == metric]
        if mine:
            return mine
    return rows


def _caveats(row: dict[str, Any], shared: Sequence[str] = ()) -> str:
    """The row's caveats less those every row of its condition carries (said once)."""
    return "; ".join(c for c in _text(row.get("caveats")).split("; ") if c and c not in shared)


def _shared(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The caveats that each of two or more rows carries, in the first row's order."""
    if len(rows) < 2:
        return []
    each = [set(_text(r.get("caveats")).split("; ")) - {""} for r in rows]
    common = set.intersection(*each)
    return [c for c in _text(rows[0].get("caveats")).split("; ") if c in common]


def _clear_part(row: dict[str, Any], metric: bool, shared: Sequence[str] = ()) -> str:
    verdict = _text(row["verdict"])
    text = f"{row['a']} vs {row['b']}"
    text += f" ({row['metric']})" if metric else ""
    text += f": {verdict}"
    numbers = [row.get(k) for k in ("estimate", "low", "high")]
    if all(isinstance(v, float) and math.isfinite(v) for v in numbers):
        est, low, high = (short(float(v)) for v in numbers)  # type: ignore[arg-type]
        text += f" {est} [{low}, {high}]"
    caveats = _caveats(row, shared)
    return text + (f" ({caveats})" if caveats else "")


def verdict_cell(rows: Sequence[dict[str, Any]], compare_on: str) -> str:
    """Per condition (in the order the rows give them): each clear verdict with its numbers
    and caveats, then the pairs whose verdict is not clear, by name (with their caveats).
    Averages over a grid's other axes are left out where the report has per-condition
    verdicts (they are in its own Averages section). The pairs again at other lengths
    (``length`` rows, eval_lengths) follow the headline's, each part naming its metric. A
    caveat that every row of a condition carries is said once, after them."""
    # lead and ranking rows restate pairs (the leader on the mean, a rate's ranking): the
    # pair rows already carry their verdicts
    kept = [r for r in rows if _text(r.get("kind")) not in RESTATED]
    verdicts = [r for r in kept if _text(r.get("kind")) not in (AVERAGE, LENGTH)]
    chosen = _headline(verdicts or kept, compare_on)
    chosen += [r for r in kept if _text(r.get("kind")) == LENGTH]  # the same pairs, longer
    several = len({_text(r.get("metric")) for r in chosen}) > 1
    conditions = list(dict.fromkeys(_text(r.get("condition")) for r in chosen))
    out = []
    for condition in conditions:
        mine = [r for r in chosen if _text(r.get("condition")) == condition]
        shared = _shared(mine)
        clear = [_clear_part(r, several, shared) for r in mine
                 if _text(r["verdict"]).startswith(CLEAR)]
        rest: dict[str, list[str]] = {}
        for r in mine:
            verdict = _text(r["verdict"])
            if not verdict.startswith(CLEAR):
                caveats = _caveats(r, shared)
                label = f"{verdict} ({r['metric']})" if several else verdict
                rest.setdefault(label, []).append(
                    f"{r['a']} vs {r['b']}" + (f" ({caveats})" if caveats else ""))
        parts = clear + [f"{verdict}: {', '.join(pairs)}" for verdict, pairs in rest.items()]
        every = f" (every pair: {'; '.join(shared)})" if shared else ""
        out.append((f"{condition}: " if condition else "") + "; ".join(parts) + every)
    return " — ".join(out) or "no verdict rows"


def values_cell(path: Path, compare_on: str) -> str:
    """For a report that compares nothing (no pair rows: every axis a condition, a pilot;
    its grid averages, if any, are no verdict on a condition), the headline held-out test
    metric per condition from its seeds.csv (the chosen setting's seeds): the mean over
    seeds and, where some did not learn, how many and their values.
    No verdict: "nothing compared" says so. '' without seeds.csv or a test metric (a run
    that measured at initialisation only)."""
    import pandas as pd

    if not path.is_file():
        return ""
    seeds = pd.read_csv(path, keep_default_na=False, na_values=[""])
    metric = f"test_{compare_on}"  # held-out scores only: runs that trained
    if metric not in seeds.columns or seeds.empty:
        return ""
    missing = [c for c in ("variant", "condition") if c not in seeds.columns]
    if missing:
        raise InputError([f"{path}: no column {', '.join(missing)}; regenerate the report "
                          "with this variantlab (variantlab report)"])
    if "chosen" in seeds.columns:
        seeds = seeds[seeds["chosen"].astype(str) == "True"]
    by = "condition" if seeds["condition"].notna().any() else "variant"
    out = []
    for name, mine in seeds.groupby(by, sort=False):
        values = pd.to_numeric(mine[metric], errors="coerce")
        n = len(values)
        text = f"{name}: {metric} {short(float(values.mean()))} over {n} seed{'s' * (n != 1)}"
        if "learned" in mine.columns:
            failed = mine[mine["learned"].astype(str) == "False"]
            if not failed.empty:
                shown = ", ".join(short(float(v)) for v in failed[metric])
                text += f" ({len(failed)} of {len(mine)} did not learn: {shown})"
        out.append(text)
    return "nothing compared; " + " — ".join(out) if out else ""


def read_verdicts(path: Path) -> list[dict[str, Any]]:
    """The rows of a verdicts.csv; InputError naming the file when it lacks a column."""
    import pandas as pd

    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    missing = [c for c in ("condition", "a", "b", "metric", "estimate", "low", "high",
                           "verdict", "caveats") if c not in frame.columns]
    if missing:
        raise InputError([f"{path}: no column {', '.join(missing)}; regenerate the report "
                          "with this variantlab (variantlab report)"])
    for col in ("estimate", "low", "high"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    return frame.to_dict("records")


def csv_numbers(folder: Path) -> list[float]:
    """Every number written anywhere in the report's CSVs (cells and names alike)."""
    found = []
    for path in sorted(folder.glob("*.csv")):
        found += [_number(m) for m in NUMBER.findall(path.read_text(encoding="utf-8"))]
    return found


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def _decimals(text: str) -> int:
    mantissa = text.lower().split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def quoted(text: str) -> list[str]:
    """The numbers ``text`` quotes, outside backticks (a name in backticks is no number)."""
    return NUMBER.findall(BACKTICKED.sub(" ", text))


def unquoted_numbers(text: str, numbers: Iterable[float]) -> list[str]:
    """The numbers of ``text`` (:func:`quoted`) that no value of ``numbers`` rounds to at
    the digits written (``0.087`` matches 0.08712; ``350`` matches 349.6)."""
    values = sorted(set(numbers))
    missing = []
    for shown in quoted(text):
        x, places = _number(shown), _decimals(shown)
        if "e" in shown.lower():
            ok = any(math.isclose(x, v, rel_tol=0.05) for v in values)
        else:
            half = 0.5 * 10 ** -places + 1e-12
            ok = any(abs(abs(v) - abs(x)) <= half for v in values)
        if not ok:
            missing.append(shown)
    return missing


# -- the table ----------------------------------------------------------------------------
def finding(folder: Path, experiments: Path) -> Finding:
    """The row of one report folder (module docstring); InputError for an experiment file
    that is missing or unreadable, or a note that quotes a number no CSV holds."""
    path = experiments / f"{folder.name}.yaml"
    if not path.is_file():
        raise InputError([f"{folder}: no experiment file {path}; give --experiments the "
                          "folder of the experiment YAML files"])
    doc = experiment_doc(path)
    data = doc.data if isinstance(doc.data, dict) else {}
    question = " ".join(_text(data.get("question")).split()) or "(no question: in the YAML)"
    note = " ".join(_text(data.get("note")).split())
    if note:
        missing = unquoted_numbers(note, csv_numbers(folder))
        if missing:
            pos = doc.values.get(("note",))
            where = f"{path}:{pos.line}:{pos.col}" if pos else str(path)
            raise InputError([f"{where}: note: quotes {', '.join(missing)}, which no CSV of "
                              f"{folder} holds; quote only numbers the report computed (or "
                              "put a name in backticks)"])
    verdicts = folder / VERDICTS_FILE
    if not verdicts.is_file():
        return Finding(folder.name, question, NOT_YET, "-", "-", "-")  # no numbers, note too
    compare_on = _text(data.get("compare_on")) or "loss"
    rows = read_verdicts(verdicts)
    cell = verdict_cell(rows, compare_on)
    kinds = {_text(r.get("kind")) or "pair" for r in rows}
    if not kinds & {"pair", LENGTH}:  # no verdict on any condition: a pilot's values
        cell = values_cell(folder / SEEDS_FILE, compare_on) or cell
    return Finding(folder.name, question, cell + (f". Note: {note}" if note else ""),
                   sizes(data), budget(data), running_time(folder))


def report_folders(reports: Path) -> list[Path]:
    """The report folders directly in ``reports`` (each holds a summary.csv), by name."""
    if not reports.is_dir():
        raise InputError([f"{reports}: not a folder; give the folder of committed reports "
                          "(reports/)"])
    found = sorted(p for p in reports.iterdir() if (p / "summary.csv").is_file())
    if not found:
        raise InputError([f"{reports}: no report folders (NAME/summary.csv) in it; give the "
                          "folder of committed reports (reports/)"])
    return found


def findings(reports: str | Path, experiments: str | Path | None = None) -> list[Finding]:
    """One row per report folder of ``reports``; ``experiments``: the folder of their YAML
    files (default: ``experiments/`` beside ``reports``)."""
    reports = Path(reports)
    exps = Path(experiments) if experiments is not None else reports.resolve().parent / "experiments"
    return [finding(folder, exps) for folder in report_folders(reports)]


def findings_markdown(rows: Sequence[Finding]) -> str:
    """The rows as one Markdown table, every cell escaped."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(md_escape(c) for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def replace_table(text: str, table: str, where: str = "the file") -> str:
    """``text`` with what lies between :data:`START` and :data:`END` replaced by ``table``;
    InputError when the markers are missing or out of order."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise InputError([f"{where}: no {START} ... {END} markers; add them where the "
                          "findings table goes"])
    return text[:start + len(START)] + "\n" + table + text[end:]


def table_in(text: str) -> str:
    """What lies between the markers of ``text`` ('' without them)."""
    start, end = text.find(START), text.find(END)
    return text[start + len(START):end].strip("\n") + "\n" if 0 <= start < end else ""


__all__ = ["END", "NOT_YET", "START", "Finding", "budget", "csv_numbers", "findings", "values_cell",
           "findings_markdown", "quoted", "replace_table", "short", "sizes", "table_in",
           "unquoted_numbers", "verdict_cell"]
