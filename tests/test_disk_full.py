"""A full disk (issue 21.4): a run whose store cannot take the next unit stops with one
clear line and exit code 3, every unit stored before is intact, and a rerun computes only
the missing units; a report that cannot be written leaves no file half written (an earlier
report stays whole). The disk fills for real inside SQLite (``PRAGMA max_page_count``: the
same SQLITE_FULL a full disk gives) or as an OSError(ENOSPC) in the middle of a write."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import write_exp

from variantlab.cli.main import main
from variantlab.store import store as store_mod
from variantlab.store.store import Store, StoreWriteError, load_run, write_problem

GRID = "  norm.kind: [layer, rms]\n"
PARAMS = "measure:\n  params: {}\n"  # with seeds [0, 1]: 4 units


def invoke(*args: object):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.output
    assert "Traceback" not in result.output
    return result


def fill_after(monkeypatch, units: int, how: str) -> dict[str, list]:
    """The disk fills once ``units`` units are stored: the next write fails (sqlite: the
    first that needs a new page of the file).
    Returns the rows handed to the store by unit key, those stored and the one refused."""
    saved: dict[str, list] = {}
    real = Store.save_unit

    def save_unit(self, unit, rows=()):
        if len(saved) == units:
            if how == "sqlite":  # no page beyond those the file has now: SQLITE_FULL
                pages = self.db.execute("PRAGMA page_count").fetchone()[0]
                self.db.execute(f"PRAGMA max_page_count = {pages}")
            else:  # the OS refuses a write halfway through the transaction
                real_tx = self._transaction

                def transaction(statements):
                    def failing():
                        yield next(iter(statements))
                        raise OSError(errno.ENOSPC, "No space left on device")
                    self._transaction = real_tx
                    return real_tx(failing())
                self._transaction = transaction
        saved[unit.key] = list(rows)
        real(self, unit, rows)

    monkeypatch.setattr(Store, "save_unit", save_unit)
    return saved


@pytest.mark.parametrize("how", ["sqlite", "oserror"])
def test_a_full_disk_stops_the_run_keeps_what_was_stored_and_a_rerun_resumes(
        tmp_path, monkeypatch, how):
    exp = write_exp(tmp_path, GRID, seeds="[0, 1]", measure=PARAMS)
    with monkeypatch.context() as mp:
        handed = fill_after(mp, 2, how)
        full = invoke("run", exp, "--out", tmp_path / "runs")  # the report is not attempted
    assert full.exit_code == 3, full.output
    db = tmp_path / "runs" / "pooltest" / "results.sqlite"
    stopped = [x for x in full.output.splitlines() if x.startswith("stopped: ")]
    assert len(stopped) == 1, full.output
    problem = "the disk is full (sqlite: database or disk is full)" if how == "sqlite" \
        else "No space left on device"
    assert stopped[0].startswith(f"stopped: cannot write {db}: {problem}; the units stored "
                                 "before are intact."), stopped
    assert "only the missing units are computed" in stopped[0]
    # sqlite: the page limit bites when a write needs a new page (the 3rd unit's or a later)
    n = len(handed) - 1
    assert (n == 2) if how == "oserror" else (2 <= n < 4), n
    assert f"4 unit(s): {n} computed, 0 stored already, 0 failed, {4 - n} not run" \
        in full.output, full.output
    assert not (tmp_path / "runs" / "pooltest" / "report").exists()

    # what was stored is whole: the database checks out; the units and every row handed to
    # the store for them are there, nothing of the refused one
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    got = load_run(tmp_path / "runs" / "pooltest")
    *kept, refused = handed
    assert len(got.units) == n and set(got.units.status) == {"ok"}
    assert set(got.units.key) == set(kept)
    for key in kept:
        stored = got.rows[got.rows.unit_key == key]
        want = pd.DataFrame(handed[key])
        assert len(stored) == len(want) > 0
        assert sorted(zip(stored.metric, stored.value.round(12))) == \
            sorted(zip(want.metric, want.value.astype(float).round(12)))
    assert refused not in set(got.rows.unit_key)

    again = invoke("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert again.exit_code == 0, again.output
    assert f"4 unit(s): {4 - n} computed, {n} stored already, 0 failed" in again.output


@pytest.mark.slow
def test_a_full_disk_stops_a_pool_run_too(tmp_path, monkeypatch):
    exp = write_exp(tmp_path, GRID, seeds="[0, 1, 2]", measure=PARAMS)
    with monkeypatch.context() as mp:
        handed = fill_after(mp, 2, "oserror")  # the driver writes: the pool's results too
        full = invoke("run", exp, "--out", tmp_path / "runs", "--workers", "2", "--no-report")
    assert full.exit_code == 3, full.output
    assert "stopped: cannot write" in full.output and "No space left on device" in full.output
    assert "6 unit(s): 2 computed, 0 stored already, 0 failed, 4 not run" in full.output
    units = load_run(tmp_path / "runs" / "pooltest").units
    assert set(units.key) == set(list(handed)[:2]) and set(units.status) == {"ok"}
    again = invoke("run", exp, "--out", tmp_path / "runs", "--workers", "2", "--no-report")
    assert again.exit_code == 0, again.output
    assert "6 unit(s): 4 computed, 2 stored already, 0 failed" in again.output


def test_write_problems_are_told_apart_from_other_errors():
    assert write_problem(OSError(errno.ENOSPC, "No space left on device")) == \
        "No space left on device"
    assert write_problem(OSError(errno.EDQUOT, "Disk quota exceeded")) == "Disk quota exceeded"
    assert write_problem(OSError(errno.ENOENT, "No such file")) is None
    assert write_problem(sqlite3.OperationalError("database or disk is full")) is not None
    assert write_problem(sqlite3.OperationalError("no such table: units")) is None
    assert write_problem(ValueError("disk is full")) is None
    assert issubclass(StoreWriteError, store_mod.StoreError)


def test_a_store_that_cannot_be_created_on_a_full_disk_says_so(tmp_path, monkeypatch):
    exp = write_exp(tmp_path, GRID)
    real = Store._connect

    def connect(self, read_only, check):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "_connect", connect)
    result = invoke("run", exp, "--out", tmp_path / "runs", "--no-report")
    monkeypatch.setattr(Store, "_connect", real)
    assert result.exit_code == 3, result.output
    assert "stopped: cannot write" in result.output and "the disk is full" in result.output
    assert "not a usable variantlab results store" not in result.output


def _report_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_report_that_cannot_be_written_leaves_no_half_written_file(tmp_path, monkeypatch):
    exp = write_exp(tmp_path, GRID, measure=PARAMS)
    run = invoke("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert run.exit_code == 0, run.output
    rep = tmp_path / "runs" / "pooltest"
    good = invoke("report", rep, "--out", tmp_path / "old")
    assert good.exit_code == 0, good.output
    before = _report_files(tmp_path / "old")
    assert {"report.md", "report.html", "summary.csv", "effects.csv"} <= set(before)

    calls: list[Path] = []
    real = Path.write_text

    def write_text(self, data, *args, **kwargs):
        calls.append(self)
        if len(calls) == 3:  # the disk fills after two files, halfway through the third
            real(self, data[: len(data) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data, *args, **kwargs)

    for out in (tmp_path / "old", tmp_path / "new"):
        calls.clear()
        with monkeypatch.context() as mp:
            mp.setattr(Path, "write_text", write_text)
            result = invoke("report", rep, "--out", out)
        assert result.exit_code == 3, result.output
        line = " ".join(result.output.split())
        assert "report: cannot write " in line and ": No space left on device; no report " \
            "file was written or changed" in line, line
        assert ".tmp" not in line  # it names the report's file, not a temporary
        assert len(calls) == 3
    assert _report_files(tmp_path / "old") == before  # the earlier report, whole
    assert list((tmp_path / "new").iterdir()) == []  # nothing presented as a report
