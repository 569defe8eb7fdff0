"""Hostile inputs for `variantlab run` (issue 10, items 2, 3 and 7): plugins that exit or
raise, stores that are corrupt, foreign, read-only or another experiment's, --out folders
that cannot be used, a bad --rerun, a folder another run is writing.

Each case asserts the exit code, a message naming the file (and LINE:COL where the input
has one), no traceback, and, for exit 2, that no store was created (or a store that was
there is untouched)."""

import fcntl
import os
import re
import sqlite3
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from variantlab.cli.main import main
from variantlab.store import store as store_mod
from variantlab.store.store import load_run, results
from variantlab.sweep.runfolder import LOCK_FILE

NAME = "hostile"


def plugin(kind: str = "odd", on_import: str = "", in_forward: str = "return x",
           in_build: str = "") -> str:
    """A norm plugin with code run on import, in forward and in build."""
    return textwrap.dedent(f"""\
        from typing import Literal
        import sys
        from torch import nn
        import variantlab
        {on_import}

        class Spec(variantlab.ComponentSpec):
            kind: Literal["{kind}"] = "{kind}"

        class Odd(nn.Module):
            def forward(self, x):
                {in_forward}

        def build(spec, dim):
            {in_build or "pass"}
            return Odd()

        @variantlab.hookimpl
        def register_norms(register):
            register("{kind}", Spec, build)
        """)


def experiment(plugins: str = "[odd.py]", kinds: str = "[layer, odd]", name: str = NAME) -> str:
    return textwrap.dedent(f"""\
        name: {name}
        seeds: [0]
        model: {{family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
                n_layers: 2, drop_rate: 0.0}}
        plugins: {plugins}
        grid:
          norm.kind: {kinds}
        measure:
          params: {{}}
          gradients: {{batch_size: 2, seq_len: 8, batches: 1}}
        """)


class BaseExit(BaseException):
    """Not an Exception: what a careless plugin might raise."""


@dataclass
class Case:
    id: str
    code: int
    expect: list[str]  # substrings of the output ({tmp} is the test folder)
    plugin_src: str | None = None  # odd.py
    yaml: str = field(default_factory=experiment)
    args: list[str] = field(default_factory=list)
    setup: Callable[[Path, pytest.MonkeyPatch], None] | None = None
    store_before: bool = False  # the case puts a file at the store's path first


def _text_store(tmp: Path, mp) -> None:
    (tmp / "runs" / NAME).mkdir(parents=True)
    (tmp / "runs" / NAME / "results.sqlite").write_text("not a database, just text\n" * 40)


def _corrupt_store(tmp: Path, mp) -> None:
    (tmp / "runs" / NAME).mkdir(parents=True)
    path = tmp / "runs" / NAME / "results.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE units (key TEXT PRIMARY KEY, v TEXT)")
    conn.executemany("INSERT INTO units VALUES (?, ?)", [(str(i), "x" * 300) for i in range(300)])
    conn.commit()
    conn.close()
    data = bytearray(path.read_bytes())
    data[4096 + 200: 4096 * 3] = os.urandom(4096 * 3 - 4096 - 200)  # garble pages 2 and 3
    path.write_bytes(bytes(data))


def _foreign_db(tmp: Path, mp) -> None:
    (tmp / "runs" / NAME).mkdir(parents=True)
    conn = sqlite3.connect(tmp / "runs" / NAME / "results.sqlite")
    conn.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
    conn.commit()
    conn.close()


def _store_is_folder(tmp: Path, mp) -> None:
    (tmp / "runs" / NAME / "results.sqlite").mkdir(parents=True)


def _read_only_store(tmp: Path, mp) -> None:
    _other_store(tmp, "exp.yaml")
    path = tmp / "runs" / NAME / "results.sqlite"
    real = store_mod.writable
    mp.setattr(store_mod, "writable", lambda p: Path(p).resolve() != path and real(p))


def _other_store(tmp: Path, filename: str) -> None:
    """A valid store written by the experiment file ``filename`` (in ``tmp/other``)."""
    from variantlab.store.store import Store

    other = tmp / "other"
    other.mkdir(exist_ok=True)
    (other / filename).write_text(experiment())
    with Store(tmp / "runs" / NAME / "results.sqlite") as store:
        store.write_experiment({"experiment": NAME, "experiment_file": str(other / filename)},
                               [], [])


def _other_experiment(tmp: Path, mp) -> None:
    _other_store(tmp, "exp.yaml")


def _out_is_file(tmp: Path, mp) -> None:
    (tmp / "runs").write_text("a file")


def _out_under_file(tmp: Path, mp) -> None:
    (tmp / "afile").write_text("a file")


def _run_dir_is_file(tmp: Path, mp) -> None:
    (tmp / "runs").mkdir()
    (tmp / "runs" / NAME).write_text("a file where the run folder goes")


def _out_unwritable(tmp: Path, mp) -> None:
    (tmp / "locked").mkdir()
    real = store_mod.writable
    mp.setattr(store_mod, "writable", lambda p: "locked" not in str(p) and real(p))


_HELD: list[int] = []


def _lock_held(tmp: Path, mp) -> None:
    """Another writer: the lock of the run folder held (by this process, pid 424242 in it)."""
    (tmp / "runs" / NAME).mkdir(parents=True)
    fd = os.open(tmp / "runs" / NAME / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"424242\n")
    _HELD.append(fd)


STORE = "runs/" + NAME + "/results.sqlite"
EXIT_IMPORT = "odd.py' could not be loaded"
CASES = [
    # -- plugins that end the process on import: load errors at the YAML's plugins entry
    Case("import-sys-exit-0", 2, ["exp.yaml:5:11", EXIT_IMPORT, "sys.exit(0)"],
         plugin(on_import="sys.exit(0)")),
    Case("import-sys-exit-3", 2, ["exp.yaml:5:11", EXIT_IMPORT, "sys.exit(3)"],
         plugin(on_import="sys.exit(3)")),
    Case("import-raise-systemexit-msg", 2, ["exp.yaml:5:11", EXIT_IMPORT, "sys.exit('bye')"],
         plugin(on_import="raise SystemExit('bye')")),
    Case("import-base-exception", 2, ["exp.yaml:5:11", EXIT_IMPORT, "BaseException: nope"],
         plugin(on_import="raise BaseException('nope')")),
    Case("import-generator-exit", 2, ["exp.yaml:5:11", EXIT_IMPORT, "GeneratorExit"],
         plugin(on_import="raise GeneratorExit")),
    Case("import-runtime-error", 2, ["exp.yaml:5:11", EXIT_IMPORT, "RuntimeError: no import"],
         plugin(on_import="raise RuntimeError('no import')")),
    Case("import-syntax-error", 2, ["exp.yaml:5:11", EXIT_IMPORT, "SyntaxError", "line 5"],
         plugin(on_import="def (:")),
    Case("missing-plugin-file", 2, ["exp.yaml:5:11", "plugin file 'odd.py' does not exist"],
         None),
    Case("cli-plugin-exits", 2, ["--plugin", "exits.py", "sys.exit(0)"], None,
         yaml=experiment(plugins="[]", kinds="[layer]"), args=["--plugin", "exits.py"],
         setup=lambda tmp, mp: (tmp / "exits.py").write_text("import sys\nsys.exit(0)\n")),
    # -- plugin code that exits while a unit runs: that unit fails, the rest is done
    Case("forward-sys-exit", 1, ["SystemExit", "sys.exit(0)", "failed"],
         plugin(in_forward="sys.exit(0)")),
    Case("forward-raise-systemexit", 1, ["SystemExit", "sys.exit('stop')"],
         plugin(in_forward="raise SystemExit('stop')")),
    Case("forward-base-exception", 1, ["BaseExit: deep"],
         plugin(on_import="class BaseExit(BaseException): pass",
                in_forward="raise BaseExit('deep')")),
    # a build that exits is found by validate's meta build before anything runs (issue 38)
    Case("build-sys-exit", 2, ["grid.norm.kind[1]", "norm 'odd' (registered by odd.py) cannot "
                               "be built: SystemExit: 4"], plugin(in_build="sys.exit(4)")),
    # -- stores
    Case("store-is-text", 2, [STORE, "not a usable variantlab results store",
                              "file is not a database", "another --out"],
         setup=_text_store, store_before=True, yaml=experiment("[]", "[layer]")),
    Case("store-corrupt", 2, [STORE, "another --out"],
         setup=_corrupt_store, store_before=True, yaml=experiment("[]", "[layer]")),
    Case("store-foreign-db", 2, [STORE, "not a variantlab results store"],
         setup=_foreign_db, store_before=True, yaml=experiment("[]", "[layer]")),
    Case("store-is-folder", 2, [STORE, "is a folder"],
         setup=_store_is_folder, yaml=experiment("[]", "[layer]")),
    Case("store-read-only", 2, [STORE, "is read-only", "--out"],
         setup=_read_only_store, store_before=True, yaml=experiment("[]", "[layer]")),
    Case("store-other-experiment", 2, [STORE, "{tmp}/other/exp.yaml", "{tmp}/exp.yaml",
                                       "use another --out or rename"],
         setup=_other_experiment, store_before=True, yaml=experiment("[]", "[layer]")),
    # -- folders
    Case("out-is-file", 2, ["runs is a file", "choose another --out"],
         setup=_out_is_file, yaml=experiment("[]", "[layer]")),
    Case("out-under-file", 2, ["afile is a file", "choose another --out"],
         setup=_out_under_file, args=["--out", "afile/sub"], yaml=experiment("[]", "[layer]")),
    Case("run-dir-is-file", 2, ["runs/" + NAME + " is a file", "choose another --out"],
         setup=_run_dir_is_file, yaml=experiment("[]", "[layer]")),
    Case("out-unwritable", 2, ["locked/" + NAME + " is not writable", "--out"],
         setup=_out_unwritable, args=["--out", "locked"], yaml=experiment("[]", "[layer]")),
    # -- options and other runs
    Case("rerun-unknown-probe", 2, ["--rerun", "'timing' is not a probe",
                                    "all, params, gradients"],
         args=["--rerun", "timing"], yaml=experiment("[]", "[layer]")),
    Case("concurrent-writer", 2, ["runs/" + NAME + " is being written", "another variantlab run (pid 424242)",
                                  "another --out"],
         setup=_lock_held, yaml=experiment("[]", "[layer]")),
]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    while _HELD:
        os.close(_HELD.pop())


def _snapshot(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_run(case: Case, in_tmp: Path, monkeypatch):
    tmp = in_tmp
    (tmp / "exp.yaml").write_text(case.yaml)
    if case.plugin_src is not None:
        (tmp / "odd.py").write_text(case.plugin_src)
    if case.setup is not None:
        case.setup(tmp, monkeypatch)
    out = "runs"
    if "--out" in case.args:
        out = case.args[case.args.index("--out") + 1]
    db = tmp / out / NAME / "results.sqlite"
    before = _snapshot(db)
    assert (before is not None) == case.store_before
    args = ["run", "exp.yaml", *case.args] + ([] if "--out" in case.args else ["--out", out])
    result = CliRunner().invoke(main, args + ["--no-report"])
    output = result.output
    assert not (result.exception and not isinstance(result.exception, SystemExit)), output
    assert result.exit_code == case.code, output
    assert "Traceback (most recent call last)" not in output
    for text in case.expect:
        assert text.format(tmp=tmp) in output, (text, output)
    if case.code == 2:
        assert _snapshot(db) == before  # no store created, a store there untouched
        assert "computed" not in output  # refused before any compute
    else:
        frame = results(tmp / out / NAME)
        failed = frame[frame.status == "failed"]
        assert set(failed.variant) == {"norm.kind=odd"}
        # the other variant and the odd one's params (no forward) are done
        ok = frame[frame.status == "ok"]
        assert set(ok[ok.variant == "base"].probe) == {"params", "gradients"}
        if "build" not in case.id:
            assert set(ok[ok.variant == "norm.kind=odd"].probe) == {"params"}
            assert set(failed.probe) == {"gradients"}
        assert failed.error.str.contains(re.escape(case.expect[0])).all()
        units = load_run(tmp / out / NAME).units
        for tb in units[units.status == "failed"].traceback:  # stored with its traceback
            assert "Traceback (most recent call last)" in tb and "odd.py" in tb


def test_read_only_store_can_still_be_read_and_reported(in_tmp, monkeypatch):
    tmp = in_tmp
    (tmp / "exp.yaml").write_text(experiment("[]", "[layer, rms]"))
    first = CliRunner().invoke(main, ["run", "exp.yaml", "--out", "runs", "--no-report"])
    assert first.exit_code == 0, first.output
    path = tmp / "runs" / NAME / "results.sqlite"
    frame = results(tmp / "runs" / NAME)
    before = path.read_bytes()
    real = store_mod.writable
    monkeypatch.setattr(store_mod, "writable", lambda p: Path(p).name != path.name and real(p))
    opened = []
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect",
                        lambda db, *a, **k: opened.append(str(db)) or connect(db, *a, **k))
    again = results(tmp / "runs" / NAME)
    assert all(o.endswith("results.sqlite?mode=ro") for o in opened), opened
    assert again.equals(frame)
    report = CliRunner().invoke(main, ["report", "runs/" + NAME, "--out", "elsewhere"])
    assert report.exit_code == 0, report.output
    assert (tmp / "elsewhere" / "report.md").is_file()
    rerun = CliRunner().invoke(main, ["run", "exp.yaml", "--out", "runs", "--no-report"])
    assert rerun.exit_code == 2 and "is read-only" in rerun.output
    assert path.read_bytes() == before


def test_same_experiment_file_edited_may_write_its_folder(in_tmp):
    tmp = in_tmp
    (tmp / "exp.yaml").write_text(experiment("[]", "[layer]"))
    assert CliRunner().invoke(main, ["run", "exp.yaml", "--no-report"]).exit_code == 0
    (tmp / "exp.yaml").write_text(experiment("[]", "[layer, rms]"))
    second = CliRunner().invoke(main, ["run", "exp.yaml", "--no-report"])
    assert second.exit_code == 0, second.output
    assert "2 stored already" in second.output
    # the same name from another file is refused, and says which file wrote it
    (tmp / "copy").mkdir()
    (tmp / "copy" / "exp.yaml").write_text(experiment("[]", "[layer]"))
    third = CliRunner().invoke(main, ["run", "copy/exp.yaml", "--no-report"])
    assert third.exit_code == 2 and f"written by the experiment file {tmp}/exp.yaml" in third.output


def test_lock_is_released_after_a_run_and_holds_the_pid_while_running(in_tmp):
    from variantlab.store.store import StoreError
    from variantlab.sweep.runfolder import RunLock

    folder = in_tmp / "f"
    folder.mkdir()
    lock = RunLock(folder)
    lock.acquire()
    assert (folder / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(StoreError, match=f"pid {os.getpid()}"):
        RunLock(folder).acquire()
    lock.release()
    other = RunLock(folder)
    other.acquire()  # free again
    other.release()


@pytest.mark.slow
def test_system_exit_in_a_pool_worker_fails_only_that_unit(in_tmp):
    tmp = in_tmp
    (tmp / "exp.yaml").write_text(experiment().replace("seeds: [0]", "seeds: [0, 1]"))
    (tmp / "odd.py").write_text(plugin(in_forward="sys.exit(0)"))
    result = CliRunner().invoke(main, ["run", "exp.yaml", "--workers", "2", "--no-report"])
    assert result.exit_code == 1, result.output
    assert "Traceback (most recent call last)" not in result.output
    assert "8 unit(s): 6 computed, 0 stored already, 2 failed" in result.output
    frame = results(tmp / "runs" / NAME)
    failed = frame[frame.status == "failed"]
    assert set(failed.variant) == {"norm.kind=odd"} and set(failed.probe) == {"gradients"}
    assert sorted(failed.seed) == [0, 1] and failed.error.str.contains("sys.exit").all()
    ok = frame[frame.status == "ok"]
    assert set(ok[ok.variant == "base"].seed) == {0, 1}
    assert set(ok[ok.variant == "base"].probe) == {"params", "gradients"}


@pytest.mark.parametrize("setup", [_text_store, _corrupt_store, _foreign_db],
                         ids=["text", "corrupt", "foreign-db"])
def test_reading_a_bad_store_is_one_clear_error(setup, in_tmp, monkeypatch):
    from variantlab.store.store import StoreError

    setup(in_tmp, monkeypatch)
    path = in_tmp / "runs" / NAME / "results.sqlite"
    before = path.read_bytes()
    result = CliRunner().invoke(main, ["report", f"runs/{NAME}", "--out", "rep"])
    assert result.exit_code == 2, result.output
    assert f"runs/{NAME}/results.sqlite" in result.output
    assert re.search(r"not a (usable )?(variantlab )?results store|damaged", result.output)
    assert "Traceback (most recent call last)" not in result.output
    with pytest.raises(StoreError, match="results.sqlite is .*variantlab results store"):
        results(path)
    assert path.read_bytes() == before
