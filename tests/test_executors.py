"""``variantlab run --workers N``: the process pool gives the in-process results, bit for bit;
timing units run in the driver after the pool; failures, dead workers, SIGTERM, resume."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest
from conftest import ALL_PROBES, BROKEN_PLUGIN, FAST_PROBES, invoke, stored, write_exp

from variantlab.store.store import load_run

# norm "killer" kills the worker process that runs it (the driver never runs it here)
KILLER_PLUGIN = '''
import multiprocessing
import os
import signal
from typing import Literal

from torch import nn

import variantlab


class KillerSpec(variantlab.ComponentSpec):
    kind: Literal["killer"] = "killer"


class Killer(nn.Module):
    def forward(self, x):
        if multiprocessing.parent_process() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return x


@variantlab.hookimpl
def register_norms(register):
    register("killer", KillerSpec, lambda spec, dim: Killer())
'''

@pytest.mark.slow  # two worker processes, each importing torch: 10-16 s
def test_pool_stores_the_in_process_results_and_times_after_it(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n", measure=ALL_PROBES)
    one, two = tmp_path / "one", tmp_path / "two"
    assert invoke("run", exp, "--out", one, "--no-report").exit_code == 0
    result = invoke("run", exp, "--out", two, "--no-report", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "8 unit(s), 2 worker processes" in result.output
    assert "8 unit(s): 8 computed, 0 stored already, 0 failed" in result.output
    units_1, rows_1 = stored(one / "pooltest")
    units_2, rows_2 = stored(two / "pooltest")
    assert len(units_2) == 8 and set(units_2.status) == {"ok"}
    assert set(rows_2.probe) == {"params", "gradients", "training", "timing"}
    pd.testing.assert_frame_equal(units_1, units_2)
    pd.testing.assert_frame_equal(rows_1, rows_2)  # float values bit for bit

    # timing units: reported last, started after every pool unit had finished, one at a time
    lines = [x for x in result.output.splitlines() if x.startswith("[")]
    assert [("timing" in x) for x in lines] == [False] * 6 + [True] * 2
    units = load_run(two / "pooltest").units
    timing, pooled = units[units.probe == "timing"], units[units.probe != "timing"]
    assert timing.started_at.min() >= pooled.finished_at.max()
    first, second = timing.sort_values("started_at").itertuples()
    assert second.started_at >= first.finished_at

    again = invoke("run", exp, "--out", two, "--no-report", "--workers", "2")
    assert again.exit_code == 0
    assert "8 unit(s): 0 computed, 8 stored already, 0 failed" in again.output
    pd.testing.assert_frame_equal(stored(two / "pooltest")[1], rows_2)


@pytest.mark.slow  # two worker processes, each importing torch: 10-16 s
def test_failing_component_fails_only_its_units_in_the_pool(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [broken, layer]\n", seeds="[0, 1]",
                    plugin=BROKEN_PLUGIN)
    out = tmp_path / "runs"
    result = invoke("run", exp, "--out", out, "--no-report", "--workers", "2", "--fail-fast")
    assert result.exit_code == 1, result.output
    # the first failure stops new units; the one running beside it may fail too
    assert re.search(r"8 unit\(s\): \d computed, 0 stored already, [12] failed, \d not run",
                     result.output), result.output
    assert "broken norm: forward is not implemented" in result.output

    result = invoke("run", exp, "--out", out, "--no-report", "--workers", "2")
    assert result.exit_code == 1, result.output
    assert "stored already, 2 failed" in result.output
    run = load_run(out / "pooltest")
    failed = run.units[run.units.status == "failed"]
    assert sorted(zip(failed.variant, failed.probe)) == [("norm.kind=broken", "gradients")] * 2
    assert all("RuntimeError: broken norm" in tb and "bad_norm.py" in tb
               for tb in failed.traceback)  # the worker's own traceback
    assert len(run.units) == 8 and (run.units.status == "ok").sum() == 6


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_dead_worker_fails_the_units_in_flight_and_keeps_the_rest(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [layer, killer]\n", seeds="[0, 1]",
                    plugin=KILLER_PLUGIN)
    out = tmp_path / "runs"
    assert invoke("run", exp, "--out", out, "--no-report", "--only", "base").exit_code == 0
    result = invoke("run", exp, "--out", out, "--no-report", "--workers", "2")
    assert result.exit_code == 1, result.output
    assert "worker process died (pid " in result.output, result.output
    units = load_run(out / "pooltest").units
    died = units[units.error.fillna("").str.startswith("worker process died")]
    assert len(died) >= 1 and all("killed by SIGKILL" in e for e in died.error)
    assert "Run again to retry" in died.traceback.iloc[0]
    # the units in flight failed; those finished before, and the base variant's, are kept
    killer = units[units.variant == "norm.kind=killer"]
    assert set(killer[killer.probe == "gradients"].key) <= set(died.key)
    assert set(units[units.variant == "base"].status) == {"ok"}


def test_workers_must_be_positive(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    result = invoke("run", exp, "--out", tmp_path / "runs", "--workers", "0")
    assert result.exit_code == 2
    assert "--workers: 0 is not a number of processes" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


def _children(pid: int) -> set[int]:
    """The process's descendants: its children (the forkserver, the resource tracker) and
    theirs (the workers, forked by the server)."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        kids = {int(c) for t in tasks for c in (t / "children").read_text().split()}
    except OSError:
        return set()
    return kids.union(*(_children(kid) for kid in kids))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_sigterm_stops_the_pool_and_keeps_finished_units(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n  residual.kind: [pre_norm, post_norm]\n",
                    seeds="[0, 1, 2]", measure=FAST_PROBES.replace("batches: 1", "batches: 8"))
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "variantlab", "run", str(exp), "--out", str(out),
           "--no-report", "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    db = out / "pooltest" / "results.sqlite"
    deadline, count, workers = time.monotonic() + 60, 0, set()
    while time.monotonic() < deadline and proc.poll() is None and count < 2:
        workers |= _children(proc.pid)
        try:
            with closing(sqlite3.connect(db)) as conn:
                count = conn.execute("SELECT COUNT(*) FROM units").fetchone()[0]
        except sqlite3.OperationalError:
            pass
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be stopped; make it longer"
    workers |= _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 130, output
    assert "interrupted: finished units are stored" in output
    deadline = time.monotonic() + 10  # the workers (and multiprocessing's resource tracker)
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) >= 3 and not [_cmdline(pid) for pid in workers if _alive(pid)]
    with closing(sqlite3.connect(db)) as conn:
        kept = conn.execute("SELECT COUNT(*) FROM units WHERE status = 'ok'").fetchone()[0]
    assert 2 <= kept < 24
    result = invoke("run", exp, "--out", out, "--no-report", "--workers", "2")
    assert result.exit_code == 0
    assert f"24 unit(s): {24 - kept} computed, {kept} stored already, 0 failed" in result.output


def test_run_experiment_checks_workers_and_probe_fn(tmp_path):
    from variantlab.config.experiment import load_experiment
    from variantlab.executors.runner import run_experiment

    exp = load_experiment(write_exp(tmp_path, "  norm.kind: [layer, rms]\n"))
    with pytest.raises(ValueError, match="workers must be 1 or more"):
        run_experiment(exp, tmp_path, workers=0)
    with pytest.raises(TypeError, match="probe_fn .*must be picklable"):
        run_experiment(exp, tmp_path, workers=2, probe_fn=lambda *a, **k: [])


# an executor from a plugin file: the units in reverse order, in this process
REVERSE_EXECUTOR = '''
import variantlab
from variantlab.executors.base import Executor
from variantlab.executors.inprocess import run_in_process


class ReverseOptions(variantlab.ProbeSettings):
    label: str = "reverse"


class Reverse(Executor):
    def __init__(self, options):
        self.options = options

    def describe(self):
        return f"{self.options.label} order"

    def run(self, sink, units, experiment, context):
        return run_in_process(sink, list(reversed(units)), experiment, context.probe_fn,
                              context.fail_fast)


@variantlab.hookimpl
def register_executors(register):
    register("reverse", ReverseOptions, Reverse)
'''


def test_an_executor_from_a_plugin_runs_the_experiment(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    (tmp_path / "reverse.py").write_text(REVERSE_EXECUTOR)
    plugin = str(tmp_path / "reverse.py")
    one, two = tmp_path / "one", tmp_path / "two"
    assert invoke("run", exp, "--out", one, "--no-report").exit_code == 0
    result = invoke("run", exp, "--out", two, "--no-report", "--plugin", plugin,
                    "--executor", "reverse", "--executor-option", "label=backwards")
    assert result.exit_code == 0, result.output
    assert "4 unit(s), backwards order" in result.output
    lines = [x for x in result.output.splitlines() if x.startswith("[")]
    assert [x.split("]")[0] for x in lines] == ["[4/4", "[3/4", "[2/4", "[1/4"]
    pd.testing.assert_frame_equal(stored(one / "pooltest")[1], stored(two / "pooltest")[1])

    bad = invoke("run", exp, "--out", tmp_path / "three", "--plugin", plugin,
                 "--executor", "reverse", "--executor-option", "lable=x", "--workers", "2")
    assert bad.exit_code == 2, bad.output
    out = " ".join(bad.output.split())
    assert "--executor-option lable: the reverse executor does not take it " \
           "(it takes: --executor-option label)" in out
    assert "--workers: the reverse executor does not take it" in out
    assert not (tmp_path / "three").exists()


@pytest.mark.slow  # two workers compile a tiny model: about a minute on 2 cores
def test_a_compiled_run_in_the_pool_ends_without_leaked_semaphores(tmp_path):
    # inductor's compile pool in each worker registers its shutdown as a multiprocessing
    # finalizer; workers stopped by SIGTERM at the run's end skipped it, and every compiled
    # run printed the resource tracker's "leaked semaphore objects" warning at exit
    training = "  training: {steps: 3, lr: 1.0e-3, batch_size: 2, seq_len: 16, compile: true}\n"
    exp = write_exp(tmp_path, "  norm.kind: [layer]\n", seeds="[0, 1]",
                    measure=FAST_PROBES + training)
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "variantlab", "run", str(exp), "--out", str(out),
           "--no-report", "--workers", "2"]
    # a cold inductor cache: a warm one loads the compiled code and starts no compile pool
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    with closing(sqlite3.connect(out / "pooltest" / "results.sqlite")) as conn:
        compiled = conn.execute("SELECT value FROM rows WHERE probe = 'training' AND "
                                "metric = 'compiled'").fetchall()
    assert sorted(compiled) == [(1.0,), (1.0,)]  # both seeds' units ran compiled
    assert "leaked" not in done.stderr, done.stderr
