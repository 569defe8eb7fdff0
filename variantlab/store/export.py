"""A run's results as one compact file that a report reads instead of the store.

``variantlab export-results RUN`` writes ``RUN/results.json.gz``
(:func:`variantlab.store.runs.export_run`): the run's
:class:`~variantlab.store.contract.RunData` (meta, variants, units and the current rows, as
:func:`variantlab.store.store.load_run` reads them) as gzipped JSON, one list per column.
Committed beside an example's report (``reports/<name>/results.json.gz``), it lets
``variantlab report reports/<name> --out reports/<name>`` write the same report again without
rerunning anything: :func:`read_export` gives back the frames the store gave, value for value
(floats are written in Python's shortest round-trip form).

The file holds what the report reads and nothing the report derives: units of an older
version of the experiment file (not ``current``) stay out, and ``experiment``,
``label`` and ``run`` of each row come from the meta and the variants table on reading, as
the store's reader fills them. It is deterministic (sorted meta keys, no timestamp in the
gzip header), so exporting a run that did not change writes the same bytes.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .contract import RESULTS, UNITS, VARIANTS, Column, ContractError, RunData, RunMeta, conform

if TYPE_CHECKING:
    import pandas as pd

EXPORT_FILE = "results.json.gz"
FORMAT = "variantlab-results"
VERSION = 1
GZIP_MAGIC = b"\x1f\x8b"
#: row columns the reader fills again (from the meta and the variants table)
DERIVED = ("experiment", "label", "run")


def is_export(path: Path) -> bool:
    """Whether ``path`` is a file named like an export that starts as gzip does."""
    if not path.name.endswith(".json.gz") or not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _cell(value: Any, kind: str) -> Any:
    """One value as JSON holds it: missing (None, NaN, NA) as null."""
    if kind == "data":
        return value
    if value is None or (not isinstance(value, str) and _missing(value)):
        return None
    if kind == "float":
        return float(value)
    if kind == "int":
        return int(value)
    if kind == "bool":
        return bool(value)
    return str(value)


def _missing(value: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or a dict is not missing
        return False


def _columns(frame: pd.DataFrame, columns: tuple[Column, ...],
             skip: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    return {c.name: [_cell(v, c.kind) for v in frame[c.name].tolist()]
            for c in columns if c.name not in skip}


def export_text(run: RunData) -> bytes:
    """``run`` as the export's bytes (gzipped JSON; the module docstring)."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "run": run.meta.run,
        "meta": run.meta.stored(),
        "variants": _columns(run.variants, VARIANTS),
        "units": _columns(run.units[run.units["current"]], UNITS),
        "rows": _columns(run.rows, RESULTS, DERIVED),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def write_export(run: RunData, target: str | Path) -> Path:
    """Write ``run``'s export to ``target`` (to a temporary name first, then moved into
    place, so a failed write leaves no half file); the path written."""
    target = Path(target)
    data = export_text(run)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


#: units columns an export written before them lacks: read as missing, as a store's are
ADDED_EXPORT_COLUMNS = ("machine",)


def _frame(doc: dict[str, Any], key: str, columns: tuple[Column, ...],
           skip: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> pd.DataFrame:
    import pandas as pd

    part = doc.get(key)
    if not isinstance(part, dict):
        raise ContractError(f"{key!r} is not a mapping of columns")
    lengths = {len(v) for v in part.values() if isinstance(v, list)}
    if len(lengths) > 1 or any(not isinstance(v, list) for v in part.values()):
        raise ContractError(f"{key!r}: its columns are not lists of one length")
    data: dict[str, Any] = {}
    for col in columns:
        if col.name in skip:
            continue
        if col.name not in part and col.name in optional:
            data[col.name] = pd.Series([None] * next(iter(lengths), 0), dtype=object)
            continue
        if col.name not in part:
            raise ContractError(f"{key!r} lacks the column {col.name!r}")
        values = part[col.name]
        if col.kind == "float":
            values = [math.nan if v is None else v for v in values]
        data[col.name] = pd.Series(values, dtype=object if col.kind == "data" else None)
    return pd.DataFrame(data)


def read_export(path: str | Path) -> RunData:
    """The :class:`RunData` an export holds (what ``load_run`` gave when it was written);
    ContractError when the file is not one."""
    path = Path(path)
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
    except (OSError, EOFError, ValueError) as exc:
        raise ContractError(f"not a results export ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ContractError(f"not a results export (no \"format\": {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ContractError(f"export version {doc.get('version')!r}; this variantlab reads "
                            f"version {VERSION}: export the run again with this version")
    meta = RunMeta.decode(doc.get("meta") or {}, run=str(doc.get("run") or ""))
    variants = conform(_frame(doc, "variants", VARIANTS), VARIANTS, "the variants table")
    units = conform(_frame(doc, "units", UNITS, optional=ADDED_EXPORT_COLUMNS), UNITS,
                    "the units table")
    rows = _frame(doc, "rows", RESULTS, DERIVED)
    labels = dict(zip(variants["name"], variants["label"]))
    rows["label"] = rows["variant"].map(labels).fillna(rows["variant"])
    rows["experiment"] = meta.experiment
    rows["run"] = meta.run
    return RunData(meta=meta, variants=variants, units=units,
                   rows=conform(rows, RESULTS, "the rows table"))


__all__ = ["EXPORT_FILE", "export_text", "is_export", "read_export", "write_export"]
