"""The SQLite results store: one file per experiment run folder, written by the driver only.

``<out>/<experiment>/results.sqlite`` holds four tables (``meta``, ``variants``, ``units``,
``rows``) plus ``plan``, the unit keys of the experiment as last run, so that units left
behind by an older version of the YAML stay in the file but not in :func:`results` (the
tables, their migration and the query of the current rows: :mod:`.schema`).

Each unit records ``invocation``, the id of the :class:`Store` session (one ``variantlab
run``) that wrote it, so that a report can tell timings measured side by side from timings
measured by different runs; stores written before the column existed get it added (empty)
when opened (a read-only one is read as it is).

A unit's rows and its status are written in one transaction: a process killed at any point
leaves either the whole unit or none of it. A failed unit stored again (a retry) replaces
the old attempt; nothing is ever doubled.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .contract import RESULTS, UNITS, VARIANTS, ContractError, RunData, RunMeta, conform, describe
from .schema import ADDED_UNIT_COLUMNS, ROWS_SQL, SCHEMA, add_missing_columns
from .writes import write_problem

if TYPE_CHECKING:  # pandas is imported when a run is read, not by the commands that only write
    import pandas as pd

STORE_FILE = "results.sqlite"

def store_path(path: str | Path) -> Path:
    """``results.sqlite`` itself, or the one inside a run folder."""
    path = Path(path)
    return path / STORE_FILE if path.is_dir() or path.suffix != ".sqlite" else path


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _value(v: Any) -> float | None:
    """SQLite has no NaN (it reads back as NULL); NULL in ``value`` means NaN."""
    v = float(v) if v is not None else math.nan
    return None if math.isnan(v) else v


@dataclass(frozen=True)
class UnitRecord:
    """Everything stored about one unit apart from its rows."""

    key: str
    variant: str
    seed: int
    probe: str
    settings_json: str
    status: str  # ok | failed
    error: str | None = None
    traceback: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    version: str | None = None
    device: str | None = None
    invocation: str | None = None  # which opening of the store wrote it (Store.invocation)
    cpu_s: float | None = None  # the computing process's CPU time (all its threads)
    load_start: float | None = None  # 1-minute load average when the unit started ...
    load_end: float | None = None  # ... and when it ended
    torch_threads: int | None = None  # torch's intra-op threads while it ran
    cores: int | None = None  # the CPUs the computing process may use
    machine: str | None = None  # the processor (and GPU) it ran on (executors.hardware)
    #: warnings of the unit for the run's output (a checkpoint set aside); not stored
    notes: tuple[str, ...] = field(default=(), compare=False, metadata={"stored": False})


_OPENED = itertools.count(1)


def new_invocation() -> str:
    """An id for one session of writing a store: its start time (UTC, so ids sort in time
    order), the process id and a count of the stores this process opened."""
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    return f"{now} pid {os.getpid()} #{next(_OPENED)}"


class StoreError(ValueError):
    """A results store or run folder that cannot be used: one sentence naming the file and
    what to do (exit code 2 in the CLI)."""

    def __init__(self, message: str):
        self.messages = [message]
        super().__init__(message)


class StoreWriteError(StoreError):
    """The store cannot take a write now (a full disk, a quota, a file or folder made
    read-only during the run): the transaction was rolled back, what was stored is intact."""


def writable(path: str | Path) -> bool:
    """Whether this process may write ``path`` (a seam for tests: root may write anything)."""
    return os.access(path, os.W_OK)


def _not_a_store(path: Path, exc: BaseException) -> StoreError:
    return StoreError(f"{path} is not a usable variantlab results store (sqlite: {exc}); "
                      "move it away or use another --out")


class Store:
    """A connection to one results file. Use as a context manager, or call :meth:`close`.

    ``create=False`` opens an existing store read-only, to read it (beside a run writing
    it: WAL mode); ``writer=True`` refuses, with a :class:`StoreError`, a file that is
    read-only, not an SQLite database, damaged, or a database of something else.
    """

    def __init__(self, path: str | Path, *, create: bool = True, writer: bool = False) -> None:
        self.path = store_path(path)
        if not create and not self.path.is_file():
            raise FileNotFoundError(f"no results store at {str(self.path)!r}; run the experiment first")
        exists = self.path.exists()
        read_only = exists and not (writable(self.path) and writable(self.path.parent))
        if not create and not writer:
            read_only = True  # a reader never writes (the run may be writing it now)
        elif read_only:
            raise StoreError(f"{self.path} is read-only; it can still be reported "
                             "(variantlab report RUN --out ELSEWHERE), but to run use another "
                             "--out or make it writable")
        if not exists:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn: sqlite3.Connection | None = None
        #: written into every unit this Store saves without one: the units of one
        #: ``variantlab run`` share it, so timings from different runs can be told apart
        self.invocation = new_invocation()
        try:
            self.conn = self._connect(read_only, writer)
        except (sqlite3.DatabaseError, OSError) as exc:
            self.close()
            problem = write_problem(exc)
            if problem is not None:
                raise StoreWriteError(f"cannot write {self.path}: {problem}") from None
            if isinstance(exc, OSError):
                raise
            raise _not_a_store(self.path, exc) from None
        except BaseException:
            self.close()
            raise

    def _connect(self, read_only: bool, check: bool) -> sqlite3.Connection:
        if read_only:
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30.0)
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return conn
        # autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        self.conn = conn
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "units" not in tables:
            raise StoreError(f"{self.path} is an SQLite database but not a variantlab results "
                             "store; move it away or use another --out")
        if check:  # before anything is written to it
            self._check_integrity()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        add_missing_columns(conn)
        return conn

    def _check_integrity(self) -> None:
        problems = [r[0] for r in self.db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise StoreError(f"{self.path} is damaged (sqlite: {'; '.join(problems)}); move it "
                             "away (the run starts afresh) or use another --out")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def db(self) -> sqlite3.Connection:
        """The open connection; a closed store says so instead of failing on None."""
        if self.conn is None:
            raise StoreError(f"{self.path} is closed; open the Store again to use it")
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # -- writing ------------------------------------------------------------------------
    def _transaction(self, statements: Iterable[tuple[str, Sequence[Any], bool]]) -> None:
        """Run ``(sql, args, many)`` statements as one transaction (all or nothing); a write
        the disk or the file refuses raises :class:`StoreWriteError` (rolled back)."""
        cur = self.db.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                for sql, args, many in statements:
                    if many:
                        cur.executemany(sql, args)
                    else:
                        cur.execute(sql, args)
                cur.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    cur.execute("ROLLBACK")
                raise
        except (sqlite3.OperationalError, OSError) as exc:
            problem = write_problem(exc)
            if problem is None:
                raise
            raise StoreWriteError(f"cannot write {self.path}: {problem}") from None

    def write_experiment(
        self,
        meta: RunMeta | Mapping[str, Any],
        variants: Sequence[Mapping[str, Any]],
        plan: Sequence[tuple[str, str, int, str]],
        keep_stored: bool = False,
    ) -> None:
        """Meta (values stored as text; non-strings as JSON), the experiment's variants and
        its unit plan ``(key, variant, seed, probe)``, replacing those of an earlier run.

        ``keep_stored``: the earlier run's variants that ``variants`` does not name, and its
        planned units of a (variant, seed, probe) that ``plan`` does not have, stay after
        the new ones. A resumed run whose feed re-adds what it added before (edge
        extensions, a tuned sweep's test units) writes so first, so that a store read before
        the feed has answered (a run killed meanwhile) still reports those units; the feed's
        first answer writes the exact tables."""
        created = self.meta().get("created")
        meta = meta.stored() if isinstance(meta, RunMeta) else dict(meta)
        if created is not None:
            meta["created"] = created  # first run's time; "updated" says the latest
        meta_rows = [(k, v if isinstance(v, str) else _json(v)) for k, v in meta.items()]
        variant_rows = [
            (v["name"], v["label"], i, _json(v["spec"]), _json(v.get("overrides", {})),
             _json(list(v.get("warnings", []))))
            for i, v in enumerate(variants)
        ]
        plan_rows = [(k, var, seed, probe, i) for i, (k, var, seed, probe) in enumerate(plan)]
        if keep_stored:
            variant_rows, plan_rows = self._with_stored(variant_rows, plan_rows)
        self._transaction([
            ("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", meta_rows, True),
            ("DELETE FROM variants", (), False),
            ("INSERT INTO variants VALUES (?, ?, ?, ?, ?, ?)", variant_rows, True),
            ("DELETE FROM plan", (), False),
            ("INSERT INTO plan VALUES (?, ?, ?, ?, ?)", plan_rows, True),
        ])

    def _with_stored(self, variant_rows: list[tuple], plan_rows: list[tuple]
                     ) -> tuple[list[tuple], list[tuple]]:
        """``variant_rows`` and ``plan_rows`` followed by the stored ones they leave out
        (:meth:`write_experiment`'s ``keep_stored``), positions continued."""
        named = {r[0] for r in variant_rows}
        old = [r for r in self.db.execute(
            "SELECT name, label, position, spec_json, overrides_json, warnings_json "
            "FROM variants ORDER BY position") if r[0] not in named]
        variant_rows = [*variant_rows, *((name, label, len(variant_rows) + i, *rest)
                                         for i, (name, label, _, *rest) in enumerate(old))]
        planned = {(var, seed, probe) for _, var, seed, probe, _ in plan_rows}
        earlier = [r for r in self.db.execute(
            "SELECT key, variant, seed, probe FROM plan ORDER BY position")
            if (r[1], r[2], r[3]) not in planned]
        plan_rows = [*plan_rows, *((*r, len(plan_rows) + i) for i, r in enumerate(earlier))]
        return variant_rows, plan_rows

    def save_unit(self, unit: UnitRecord, rows: Sequence[Mapping[str, Any]] = ()) -> None:
        """Store a unit and its rows in one transaction, replacing any earlier attempt."""
        row_tuples = [
            (unit.key, r["probe"], r["metric"], r.get("scope", "model"), r.get("name", ""),
             r.get("layer"), r.get("step"), _value(r.get("value")), r.get("unit", ""))
            for r in rows
        ]
        if unit.invocation is None:
            unit = replace(unit, invocation=self.invocation)
        names = [name for name, f in UnitRecord.__dataclass_fields__.items()
                 if f.metadata.get("stored", True)]
        fields = [getattr(unit, f) for f in names]
        self._transaction([
            ("DELETE FROM rows WHERE unit_key = ?", (unit.key,), False),
            (f"INSERT OR REPLACE INTO units ({', '.join(names)}) "
             f"VALUES ({', '.join('?' * len(fields))})", fields, False),
            ("INSERT INTO rows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row_tuples, True),
        ])

    # -- reading ------------------------------------------------------------------------
    def meta(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT key, value FROM meta"))

    def statuses(self) -> dict[str, str]:
        """Unit key -> ``ok`` or ``failed`` for every stored unit."""
        return dict(self.db.execute("SELECT key, status FROM units"))

    def machines(self) -> dict[str, str]:
        """Unit key -> the machine that computed it, for every unit stored ok with one
        recorded (none in a store older than the record)."""
        if "machine" not in {r[1] for r in self.db.execute("PRAGMA table_info(units)")}:
            return {}
        return dict(self.db.execute(
            "SELECT key, machine FROM units WHERE status = 'ok' AND machine IS NOT NULL"))

    def count_rows(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM rows").fetchone()[0]


# -- reading a run -------------------------------------------------------------------------
def _frames(path: str | Path) -> RunData:
    import pandas as pd

    try:
        return _read_frames(path)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
        raise _not_a_store(store_path(path), exc) from None
    except ContractError as exc:
        raise StoreError(f"{store_path(path)}: {exc}; the file was not written by variantlab "
                         "run (or is damaged): run the experiment again into a fresh --out"
                         ) from None


def _read_frames(path: str | Path) -> RunData:
    import pandas as pd

    run = store_path(path).resolve().parent.name  # runs.find_runs may lengthen it
    with closing(Store(path, create=False)) as store:
        meta = RunMeta.decode(store.meta(), run=run)
        conn = store.db
        variants = pd.read_sql_query("SELECT * FROM variants ORDER BY position", conn)
        has_plan = conn.execute("SELECT COUNT(*) FROM plan").fetchone()[0] > 0
        # a planned unit is shown under each (variant, seed) that plans it: two variants with
        # the same resolved spec share one computed unit
        units = pd.read_sql_query(
            "SELECT u.*, (SELECT MIN(position) FROM plan p WHERE p.key = u.key) AS _pos "
            "FROM units u ORDER BY COALESCE(_pos, 1e18), u.rowid",
            conn,
        )
        rows = pd.read_sql_query(ROWS_SQL.format(current="p.key IS NOT NULL" if has_plan
                                                  else "1"), conn)
    units["current"] = units["_pos"].notna() if has_plan else True
    for name in ADDED_UNIT_COLUMNS:  # a read-only store older than the column
        if name not in units.columns:
            units[name] = None
    return RunData(meta=meta, variants=_decoded_variants(variants),
                   units=conform(units, UNITS, "the units table"),
                   rows=_results_frame(rows, meta, variants))


def _decoded(name: str, text: Any, what: str, default: Any) -> Any:
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return default
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        raise ContractError(f"variant {name!r}: {what} is not JSON ({str(text)[:60]!r})"
                            ) from None
    if not isinstance(value, type(default)):
        raise ContractError(f"variant {name!r}: {what} is not a {type(default).__name__}")
    return value


def _decoded_variants(frame: pd.DataFrame) -> pd.DataFrame:
    """The variants table with its JSON columns decoded (spec, overrides, warnings)."""
    import pandas as pd

    for col, default in (("spec", {}), ("overrides", {}), ("warnings", [])):
        frame[col] = pd.Series([_decoded(n, t, f"{col}_json", default) for n, t in
                                zip(frame["name"], frame[f"{col}_json"])], dtype=object)
    return conform(frame, VARIANTS, "the variants table")


def _results_frame(rows: pd.DataFrame, meta: RunMeta, variants: pd.DataFrame) -> pd.DataFrame:
    labels = dict(zip(variants["name"], variants["label"]))
    rows["label"] = rows["variant"].map(labels).fillna(rows["variant"])
    rows["experiment"] = meta.experiment
    rows["run"] = meta.run
    for col in ("name", "unit"):
        rows[col] = rows[col].fillna("")
    return conform(rows, RESULTS, "the rows table")


def results(path: str | Path) -> pd.DataFrame:
    """Tidy frame of every stored row (``path`` = results.sqlite, its run folder, or a
    results export: :func:`load_run`).

    A failed unit is one row with status ``failed``, metric ``error``, value NaN and its
    message in ``error``. The columns (:data:`variantlab.store.contract.RESULTS`), in order:

    {columns}

    A run with a grid or named variants has one more column per axis (every path its grid
    or a variant's ``set:`` varies: model keys such as ``norm.kind``, ``data.*`` and probe
    settings ``measure.<probe>.<key>``), named by its path, holding the value each row's
    variant ran with (:func:`axis_columns`).
    """
    run = load_run(path)
    return axis_columns(run.rows, run.variants, run.meta)


def axis_columns(rows: pd.DataFrame, variants: pd.DataFrame, meta: RunMeta) -> pd.DataFrame:
    """``rows`` with a column per axis of the run (a ``grid:`` path, or an override path of
    any variant: model keys, ``data.*`` and ``measure.<probe>.<key>``), named by its path:
    the value the row's variant ran with. A variant that does not set the path has the
    experiment's own value: its ``measure:`` or ``data:`` setting, or its model spec's. A
    path that would shadow a column of the rows is left out; ``run`` stays the last column."""
    paths = list(dict.fromkeys([*(meta.grid or {}),
                                *(p for over in variants["overrides"] for p in (over or {}))]))
    paths = [p for p in paths if p not in rows.columns]
    if not paths:
        return rows
    import pandas as pd

    rows = rows.copy()
    for path in paths:
        values = {n: (o or {}).get(path, axis_default(path, meta, spec))
                  for n, o, spec in zip(variants["name"], variants["overrides"], variants["spec"])}
        rows[path] = pd.Series([values.get(v) for v in rows["variant"]],
                               index=rows.index, dtype=object).infer_objects()
    last = ["run"] if "run" in rows.columns else []
    return rows[[c for c in rows.columns if c not in last] + last]  # the run's label last


def axis_default(path: str, meta: RunMeta, spec: Any) -> Any:
    """The value of ``path`` for a variant that does not override it."""
    if path.startswith("measure."):
        _, probe, key = (path.split(".", 2) + ["", ""])[:3]
        return (meta.measure.get(probe) or {}).get(key)
    node: Any = meta.data if path.startswith("data.") else spec
    for part in path.removeprefix("data.").split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


#: the name results() used before model axes had columns too
setting_columns = axis_columns


if results.__doc__:  # None under python -OO
    results.__doc__ = results.__doc__.format(columns=describe(RESULTS).replace("\n", "\n    "))


def load_run(path: str | Path) -> RunData:
    """Meta (decoded: :class:`variantlab.store.contract.RunMeta`), variants (spec, overrides and
    warnings decoded), units and rows: see :mod:`variantlab.store.contract`. ``path`` may also
    be a results export (:mod:`.export`), which gives the frames the store gave."""
    from .export import is_export, read_export

    if is_export(Path(path)):
        try:
            return read_export(path)
        except ContractError as exc:
            raise StoreError(f"{path}: {exc}; write it again with variantlab export-results "
                             "RUN") from None
    return _frames(path)
