"""A store read from outside while a run writes it (a report, ``sqlite3`` in a shell, a
notebook) loses nothing. A run's own process must never open the store with a plain
``open()``: closing that descriptor drops every POSIX lock the process holds on the file,
the writer's included, and the next outside reader to close its connection then takes
itself for the last one and deletes the live write-ahead log (on 2026-11-30 a tuned sweep's
run lost 6 stored units this way and stopped on "disk I/O error"; its chooser looked for the
store with ``stores_in``, which read the SQLite header with ``open()``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from variantlab.store.runs import RunPathError, _is_sqlite, stores_in
from variantlab.store.store import STORE_FILE, Store, UnitRecord

READ_AND_CLOSE = ("import sqlite3, sys\n"
                  "c = sqlite3.connect(sys.argv[1])\n"
                  "print(c.execute('SELECT COUNT(*) FROM units').fetchone()[0])\n"
                  "c.close()\n")


def unit(key: str) -> UnitRecord:
    return UnitRecord(key=key, variant="a", seed=0, probe="params", settings_json="{}",
                      status="ok")


def test_a_reader_in_another_process_while_the_run_looks_for_its_store(tmp_path):
    path = tmp_path / STORE_FILE
    with Store(path) as store:
        store.save_unit(unit("first"), [{"probe": "params", "metric": "total", "value": 1.0}])
        assert stores_in(tmp_path) == [path]  # what the tuned sweep's chooser does mid-run
        seen = subprocess.run([sys.executable, "-c", READ_AND_CLOSE, str(path)],
                              capture_output=True, text=True, timeout=60, check=True)
        assert seen.stdout.strip() == "1"
        assert path.with_name(STORE_FILE + "-wal").exists()  # the live log is still there
        store.save_unit(unit("second"), [{"probe": "params", "metric": "total", "value": 2.0}])
    with Store(path, create=False) as again:
        assert again.statuses() == {"first": "ok", "second": "ok"}
        assert again.count_rows() == 2


@pytest.mark.parametrize("content, expected", [
    (b"SQLite format 3\x00", False),  # the header alone is no database
    (b"", False), (b"not a database at all, just some text\n" * 20, False)])
def test_only_a_database_counts_as_a_store(tmp_path, content, expected):
    path = tmp_path / "x.sqlite"
    path.write_bytes(content)
    assert _is_sqlite(path) is expected
    with Store(tmp_path / STORE_FILE) as store:
        store.save_unit(unit("k"), [])
    assert _is_sqlite(tmp_path / STORE_FILE)
    assert not _is_sqlite(tmp_path / "absent.sqlite")


def test_a_folder_whose_store_is_not_a_database_is_refused(tmp_path):
    (tmp_path / STORE_FILE).write_bytes(b"garbage" * 100)
    with pytest.raises(RunPathError, match="results.sqlite: not a results store .not an SQLite "
                       "database nor a results export"):
        stores_in(tmp_path)
    assert Path(tmp_path / STORE_FILE).read_bytes() == b"garbage" * 100
