"""``run --workers N`` starts its workers while it checks the experiment, only when it has
units for them, and ends them when the run is over or refused."""

import sys
import time

import pytest
from conftest import invoke, stored, write_exp

from variantlab.config.experiment import load_experiment
from variantlab.executors import pool
from variantlab.executors.base import ExperimentSource
from variantlab.executors.runner import pool_work_pending, run_experiment

TIMING_ONLY = ("measure:\n  timing: {batch_size: 2, seq_len: 16, passes: [forward], "
               "warmup: 0, repeats: 1, device: cpu}\n")


def test_pool_work_is_pending_until_every_pooled_unit_is_stored(tmp_path):
    path = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    exp = load_experiment(path)
    out = tmp_path / "runs"
    assert pool_work_pending(exp, out)
    assert invoke("run", path, "--out", out, "--no-report").exit_code == 0
    assert not pool_work_pending(exp, out)
    assert pool_work_pending(exp, out, rerun="gradients")
    assert not pool_work_pending(exp, out, rerun="training")  # no such units here
    assert not pool_work_pending(exp, out, only=["norm.kind=rms"])
    (tmp_path / "t").mkdir()
    timing = load_experiment(write_exp(tmp_path / "t", "  norm.kind: [layer]\n",
                                       measure=TIMING_ONLY))
    assert not pool_work_pending(timing, out)  # timing runs in the driver, never the pool


def test_run_warms_the_pool_only_with_units_for_it_and_always_closes_it(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(pool.PoolExecutor, "warm",
                        lambda self, source, threads=None: calls.append("warm"))
    monkeypatch.setattr(pool.PoolExecutor, "close", lambda self: calls.append("close"))
    path = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    out = tmp_path / "runs"
    refused = invoke("run", path, "--out", out, "--no-report", "--workers", "2",
                     "--only", "nope")
    assert refused.exit_code == 2 and calls == ["close"]  # a bad --only: no workers started
    calls.clear()
    ran = invoke("run", path, "--out", out, "--no-report", "--workers", "2")
    assert ran.exit_code == 0, ran.output
    assert calls[0] == "warm" and calls[-1] == "close"
    calls.clear()
    again = invoke("run", path, "--out", out, "--no-report", "--workers", "2")
    assert "0 computed, 4 stored already" in again.output
    assert "warm" not in calls and calls[-1] == "close"


def alive(executor: pool.PoolExecutor) -> list:
    warm = executor._warm
    return [p for p in (getattr(warm, "_processes", None) or {}).values() if p.is_alive()]


@pytest.mark.slow  # a worker process importing torch: 3-6 s
def test_warm_workers_compute_the_run_and_are_ended_after_it(tmp_path):
    path = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    exp = load_experiment(path)
    executor = pool.PoolExecutor(pool.PoolOptions(workers=1))
    executor.warm(ExperimentSource.of(exp))
    deadline = time.monotonic() + 60
    while not alive(executor) and time.monotonic() < deadline:
        time.sleep(0.05)
    (worker,) = alive(executor)
    executor.close()  # a run that never came: the worker is ended, not left behind
    assert not worker.is_alive() and executor._warm is None
    executor.warm(ExperimentSource.of(exp))
    deadline = time.monotonic() + 60
    while not alive(executor) and time.monotonic() < deadline:
        time.sleep(0.05)
    (worker,) = alive(executor)
    summary = run_experiment(exp, tmp_path / "runs", executor=executor)
    assert (summary.done, summary.failed) == (4, [])
    assert executor._warm is None and not worker.is_alive()  # it ran the units, then ended


def test_an_executor_that_starts_nothing_never_reads_the_store_first(tmp_path, monkeypatch):
    from variantlab.executors import runner

    asked: list[str] = []
    monkeypatch.setattr(runner, "pool_work_pending", lambda *a, **k: asked.append("x") or True)
    path = write_exp(tmp_path, "  norm.kind: [layer]\n")
    result = invoke("run", path, "--out", tmp_path / "runs", "--no-report")
    assert result.exit_code == 0, result.output
    assert asked == []  # in process: nothing to warm, so the store is not read twice


def _deaf_to_sigterm(ready) -> None:
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as if inherited so
    ready.set()
    time.sleep(60)


class _Pool:
    """What ``_terminate`` reads of a ProcessPoolExecutor."""

    def __init__(self, processes: list) -> None:
        self._processes = {p.pid: p for p in processes}
        self.shut = False

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self.shut = True


def test_a_worker_that_does_not_end_on_sigterm_is_killed(monkeypatch):
    import multiprocessing
    import signal

    monkeypatch.setattr(pool, "TERMINATE_GRACE_S", 0.5)
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    deaf = context.Process(target=_deaf_to_sigterm, args=(ready,))
    deaf.start()
    try:
        assert ready.wait(30)
        fake = _Pool([deaf])
        t0 = time.monotonic()
        pool._terminate(fake)  # type: ignore[arg-type]
        assert fake.shut and not deaf.is_alive()
        assert deaf.exitcode == -signal.SIGKILL  # SIGTERM was held back: it took SIGKILL
        assert time.monotonic() - t0 < 10
    finally:
        if deaf.is_alive():
            deaf.kill()


def _leave_a_finalizer(marker: str) -> int:
    """In a worker: a multiprocessing finalizer, as inductor's compile pool registers one
    (its shutdown), that writes ``marker`` when the worker exits by itself."""
    import multiprocessing.util
    import os
    import sys
    from pathlib import Path

    multiprocessing.util.Finalize(None, Path(marker).write_text, args=("ran",),
                                  exitpriority=sys.maxsize)
    return os.getpid()


@pytest.mark.parametrize("grace", [0.0, 5.0])
def test_a_normal_end_lets_the_workers_exit_by_themselves(tmp_path, grace):
    # at a run's end the workers are told to stop and given EXIT_GRACE_S: their exit runs
    # multiprocessing's finalizers (inductor shuts its compile pool there; SIGTERM skipped
    # that, and the resource tracker warned of leaked semaphores after compiled runs).
    # Ctrl-C (grace 0) still stops them at once
    import multiprocessing
    import signal
    from concurrent.futures import ProcessPoolExecutor

    marker = tmp_path / "finalized"
    executor = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    pid = executor.submit(_leave_a_finalizer, str(marker)).result(timeout=30)
    (worker,) = executor._processes.values()  # type: ignore[attr-defined]
    assert worker.pid == pid
    if not grace:  # Ctrl-C comes during a unit: the worker is busy, not waiting for work
        started = tmp_path / "started"
        executor.submit(_busy, str(started))
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    t0 = time.monotonic()
    pool._terminate(executor, grace)
    assert not worker.is_alive()
    if grace:
        assert worker.exitcode == 0 and marker.read_text() == "ran"
    else:
        assert worker.exitcode == -signal.SIGTERM and not marker.exists()
        assert time.monotonic() - t0 < pool.TERMINATE_GRACE_S


def _busy(started: str) -> None:
    from pathlib import Path

    Path(started).write_text("yes")
    time.sleep(60)


def _environment_probe(probe, spec, settings, **kwargs):
    """A probe_fn that reports the worker's view: the marker variables, its parent and
    whether torch._dynamo was imported before this unit (nothing here imports it)."""
    import os
    import sys

    from variantlab.plugin.rows import row

    return [row(probe, "mark", float(os.environ.get("VL_POOL_MARK", "nan"))),
            row(probe, "gone", float("VL_POOL_GONE" in os.environ)),
            row(probe, "parent", float(os.getppid())),
            row(probe, "dynamo", float("torch._dynamo" in sys.modules))]


@pytest.mark.slow  # a forkserver importing torch: 3-6 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver on Linux only")
def test_workers_fork_from_a_preloaded_server_and_take_the_drivers_environment(
        tmp_path, monkeypatch):
    """On Linux the workers are forked from a forkserver that imported torch (and
    torch._dynamo) and variantlab: they are not the driver's children, and each unit runs in
    the driver's environment of the moment it was handed out, not the one the workers (or
    the server) started with."""
    import os

    from variantlab.executors import starting

    assert starting.start_method() == "forkserver"
    assert {"torch", "torch._dynamo", "variantlab_plugins.attentions"} <= set(starting.PRELOAD)
    monkeypatch.setenv("VL_POOL_GONE", "1")
    monkeypatch.delenv("VL_POOL_MARK", raising=False)
    exp = load_experiment(write_exp(tmp_path, "  norm.kind: [layer]\n"))
    executor = pool.PoolExecutor(pool.PoolOptions(workers=1))
    executor.warm(ExperimentSource.of(exp))
    deadline = time.monotonic() + 60
    while not alive(executor) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(executor)
    monkeypatch.setenv("VL_POOL_MARK", "7.5")  # after the worker started
    monkeypatch.delenv("VL_POOL_GONE")
    summary = run_experiment(exp, tmp_path / "runs", executor=executor,
                             probe_fn=_environment_probe)
    assert summary.failed == [] and summary.done == 2
    _, rows = stored(tmp_path / "runs" / "pooltest")
    values = rows.groupby("metric")["value"].agg(set)
    assert values["mark"] == {7.5} and values["gone"] == {0.0}
    assert values["dynamo"] == {1.0}  # imported by the server, before any unit
    assert values["parent"] != {float(os.getpid())}  # forked by the server, not by us


DRIVER = '''
import os, sys
from concurrent.futures import ProcessPoolExecutor
from variantlab.executors import starting

starting.PRELOAD = tuple(sys.argv[1:])  # the marker module, then serverexit or not
starting.start_server()
with ProcessPoolExecutor(1, mp_context=starting.context()) as pool:
    assert pool.submit(os.getpid).result() != os.getpid()
from multiprocessing import forkserver
print(forkserver._forkserver._forkserver_pid)
'''

MARKER = '''
import atexit, os
atexit.register(lambda: open(os.environ["VL_TEARDOWN_MARK"], "w").write("torn down"))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver on Linux only")
@pytest.mark.parametrize("quick", [True, False])
def test_the_forkserver_exits_without_teardown_when_its_driver_has_gone(tmp_path, quick):
    """With variantlab.executors.serverexit preloaded last, the server's exit skips the
    interpreter's teardown (here: an atexit handler preloaded before it never runs);
    without it, the teardown runs. The driver's own exit is untouched."""
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "vl_exit_marker.py").write_text(MARKER)
    mark = tmp_path / "mark.txt"
    env = {**os.environ, "VL_TEARDOWN_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    modules = ["vl_exit_marker"] + (["variantlab.executors.serverexit"] if quick else [])
    done = subprocess.run([sys.executable, "-c", DRIVER, *modules], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    server = int(done.stdout.split()[-1])

    def running() -> bool:  # an orphan now: a zombie until init reaps it, if it does
        try:
            return Path(f"/proc/{server}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 30
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()
    assert mark.exists() is not quick


def test_serverexit_does_nothing_imported_elsewhere():
    import atexit
    import importlib

    from variantlab.executors import serverexit

    before = atexit._ncallbacks()
    importlib.reload(serverexit)
    assert atexit._ncallbacks() == before and not serverexit._imported_by_the_forkserver()
