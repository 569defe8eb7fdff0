"""Finding the runs a report or ``results()`` reads, and keeping them apart.

A path names runs in one of three ways:

- a results store file (``results.sqlite``), or a results export (``results.json.gz``,
  :mod:`.export`: what ``variantlab export-results`` writes),
- a run folder that holds one (``runs/<experiment>``; a folder with both reads the store),
  or a report folder with its export beside it (``reports/<experiment>``),
- a folder of run folders (the ``--out`` of ``variantlab run``, ``runs`` by default): every
  run folder directly inside it, in name order.

The same store reached by several spellings (``runs/x``, ``runs/x/``, ``./runs/x``,
``runs/x/results.sqlite``, a symlink) counts once. Each run gets a label that is unique among
the runs given: its folder's name, or as many trailing path parts as it takes to tell two
folders of the same name apart (``a/runs/x`` and ``b/runs/x``). Reports prefix variant names
with this label when variants of several runs would share a name, and ``results()`` puts it
in a ``run`` column, so numbers of two runs are never pooled by accident.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .export import EXPORT_FILE, is_export, write_export
from .store import STORE_FILE

SQLITE_MAGIC = b"SQLite format 3\x00"


class RunPathError(FileNotFoundError):
    """A path that names no run; ``messages`` says which path and what to do."""

    def __init__(self, message: str, path: str | Path):
        super().__init__(message)
        self.filename = str(path)
        self.messages = [message]

    def __str__(self) -> str:
        return self.messages[0]


@dataclass(frozen=True)
class RunRef:
    """One run: its results store (resolved) and a label unique among the runs found."""

    store: Path
    label: str

    @property
    def folder(self) -> Path:
        return self.store.parent


def _is_sqlite(path: Path) -> bool:
    """Whether ``path`` is an SQLite database, asked of SQLite itself. Never with a plain
    ``open()``: closing any descriptor of a file drops every POSIX lock this process holds
    on it, the running store's writer's included, and another process that then closes its
    own connection to the store (a report, ``sqlite3`` in a shell) takes itself for the last
    one and deletes the live write-ahead log: the units stored since are lost and the run
    stops on an I/O error. SQLite shares one descriptor's locks among a process's
    connections, so its own check is safe while a run writes."""
    try:
        if path.stat().st_size < len(SQLITE_MAGIC):  # SQLite would take it for a new, empty one
            return False
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
            return True
        except sqlite3.OperationalError:  # cannot be opened or read at all
            return False
        except sqlite3.DatabaseError as exc:  # SQLite's, but damaged (truncated, malformed):
            return "not a database" not in str(exc)  # the store's own check says how
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        return False


def stores_in(path: str | Path) -> list[Path]:
    """The results stores ``path`` names (see the module docstring); RunPathError if none."""
    given = str(path)
    p = Path(path)
    if not p.exists():
        raise RunPathError(f"{given}: no results store: no such file or folder; give a run "
                           f"folder (runs/<experiment>), its {STORE_FILE}, or the --out "
                           "folder that holds run folders", given)
    if p.is_file() and is_export(p):
        return [p]
    if p.is_file() or (p / STORE_FILE).is_file():
        store = p if p.is_file() else p / STORE_FILE
        if not _is_sqlite(store):
            shown = given if p.is_file() else str(Path(given) / STORE_FILE)
            raise RunPathError(f"{shown}: not a results store (not an SQLite database nor a "
                               f"results export); give a run folder, its {STORE_FILE} as "
                               f"`variantlab run` wrote it, or the {EXPORT_FILE} of "
                               "`variantlab export-results`", shown)
        return [store]
    if is_export(p / EXPORT_FILE):
        return [p / EXPORT_FILE]
    try:
        children = sorted(c for c in p.iterdir() if c.is_dir() and (
            (c / STORE_FILE).is_file() or is_export(c / EXPORT_FILE)))
    except OSError as exc:
        raise RunPathError(f"{given}: cannot list the folder ({exc.strerror}); check its "
                           "permissions", given) from None
    if not children:
        raise RunPathError(f"{given}: no results store ({STORE_FILE}) and no run folders "
                           "in it; run an experiment first (variantlab run EXPERIMENT.yaml "
                           f"--out {given}) or give the run folder itself", given)
    return [c / STORE_FILE if (c / STORE_FILE).is_file() else c / EXPORT_FILE
            for c in children]


def export_run(store: str | Path, out: str | Path | None = None) -> Path:
    """Write the results export (:mod:`.export`) of the run at ``store`` (a run folder or
    its ``results.sqlite``) to ``out`` (default: ``results.json.gz`` in the run folder);
    the path written."""
    from .store import load_run, store_path

    target = Path(out) if out is not None else store_path(store).parent / EXPORT_FILE
    return write_export(load_run(store_path(store)), target)


def find_runs(paths: str | Path | Iterable[str | Path]) -> list[RunRef]:
    """Every run the paths name, each once, in the order given, with unique labels."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    stores: list[Path] = []
    seen: set[str] = set()
    for path in paths:
        for store in stores_in(path):
            resolved = Path(os.path.realpath(store))
            key = os.path.normcase(str(resolved))
            if key not in seen:
                seen.add(key)
                stores.append(resolved)
    if not stores:
        raise RunPathError("no runs given: pass a run folder, its results.sqlite or the "
                           "--out folder of run folders", "")
    return [RunRef(s, label) for s, label in zip(stores, unique_labels(stores))]


def unique_labels(stores: Sequence[Path]) -> list[str]:
    """Each store's folder name, lengthened by parent folders until no two are alike."""
    parts = [s.parent.parts for s in stores]
    depth = [1] * len(stores)

    def label(i: int) -> str:
        return "/".join(parts[i][-depth[i]:]) if parts[i] else str(stores[i])

    while True:
        labels = [label(i) for i in range(len(stores))]
        clashing = [i for i, lab in enumerate(labels) if labels.count(lab) > 1
                    and depth[i] < len(parts[i])]
        if not clashing:
            return labels
        for i in clashing:
            depth[i] += 1


def results(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Tidy frame of every stored row of every run the paths name, with a ``run`` column.

    ``paths``: a run folder, its ``results.sqlite`` or results export (``results.json.gz``),
    a folder of run folders, or several of
    these. Columns: :data:`variantlab.store.contract.RESULTS` and a column per axis, as
    :func:`variantlab.store.store.results` gives them, with ``run`` the run's label (see
    :func:`find_runs`), the last column.
    """
    from .store import results as store_results

    frames = []
    for ref in find_runs(paths):
        frame = store_results(ref.store)
        frame["run"] = ref.label
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
