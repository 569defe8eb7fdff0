"""The process-pool executor: ``variantlab run --workers N`` (``--executor pool``).

Units other than ``timing`` are computed in ``N`` worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`). A worker is never a fork of the driver
(a forked child of a process that holds CUDA or torch's thread pools can hang or crash): on
Linux it is forked from a ``forkserver`` process that has imported torch (and
``torch._dynamo``, which torch.optim imports) and variantlab once for all workers
(:mod:`.starting`: about 2.5 s of each worker's CPU time otherwise, benchmarks/throughput.md)
and has computed nothing; elsewhere it is ``spawn``-ed. Each unit takes the driver's
environment at the moment it is handed out (a forked worker would otherwise keep the
server's, from when that started).
Nothing built from plugins crosses the process boundary: each worker rebuilds the experiment
from its YAML text and path (the same ``--plugin`` modules; plugin files are loaded from
disk again), looks the unit up by its key in its own
:func:`~variantlab.sweep.units.plan_units` and sends back plain data, the
:class:`~variantlab.store.store.UnitRecord` and the rows. A unit whose code raises
``SystemExit`` (``sys.exit()`` in a plugin) or another ``BaseException`` fails alone, in a
worker as in process; the worker and the pool go on. Each worker uses one torch thread
(:mod:`variantlab.executors.threads`: ``--threads`` or the user's ``OMP_NUM_THREADS`` wins;
``N`` is the pool's size, no more units at a time than there are to compute; the threads go
with each unit). Every unit seeds torch itself, so on CPU the rows are the in-process ones
bit for bit (``tests/test_executors.py``).

``variantlab run --workers N`` starts the forkserver before it imports torch itself
(:func:`~variantlab.executors.starting.start_server`), and the workers as soon as it has read
the experiment and found units to compute (:meth:`PoolExecutor.warm`, from a thread): they
import torch and rebuild the experiment while the driver checks it and sizes its variants,
and are ended if a check refuses. The workers
are ended as soon as the last unit is stored, not waited for.

The driver alone writes the store, one transaction per unit as results arrive, and emits
the same progress events as the in-process executor (``start`` when a unit is handed to a
worker; at most ``N`` units are in flight, so it is running). Resume, ``--only``, failure
isolation and ``--fail-fast`` behave as in process; with ``--fail-fast`` the units already
running finish and are stored, nothing new starts.

A run that adds units as it goes (edge extension, a tuned sweep's test units:
:class:`~variantlab.executors.runner.Growing`) asks its feed after each stored unit. The
feed reads the store (about 0.5 s for a tuned sweep's group), so the driver hands the freed
workers their next units first and asks the feed in a thread of its own, one question at a
time and answered in order; what it adds is handed out next.

Units of serial probes (``timing``) never run concurrently with anything: concurrent work would distort the
timings. The driver runs them itself, one at a time, after the pool has finished.

A worker that dies (killed, out of memory, a crash in native code: ``BrokenProcessPool``)
stops the run: the units in flight at that moment are stored ``failed`` with
``worker process died: ...``, units finished earlier stay stored, the rest are not run (a
rerun retries the failed ones and computes the rest). The pool is not restarted, so a
variant that crashes its process cannot take down a sweep over and over. Ctrl-C or SIGTERM
cancels the pending units, terminates the workers (their units in progress are lost, as
the in-process unit would be) and keeps every finished unit. At a run's normal end the
workers are told to stop and exit by themselves (:data:`EXIT_GRACE_S`), so their
multiprocessing finalizers run (inductor's compile pool shuts down there). A worker exits
by itself when the driver dies.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from pydantic import Field, PositiveInt

from ..plugin.settings import Strict
from ..store.store import UnitRecord
from ..sweep.units import Unit
from . import starting
from .base import (
    Executor,
    ExperimentSource,
    RunContext,
    Work,
    compute,
    fed,
    rebuilt,
    sorted_out,
    split_units,
    store_result,
)
from .inprocess import run_in_process
from .threads import choose_threads
from .unit import ResultSink, error_text, now_iso, unit_record

if TYPE_CHECKING:
    from ..config.experiment import Experiment

#: after SIGTERM, the workers' time to exit before SIGKILL
TERMINATE_GRACE_S = 5.0
#: at a run's normal end, the workers' time to exit by themselves before SIGTERM (their exit
#: runs multiprocessing's finalizers: inductor's compile pool shuts down there, where a
#: SIGTERM would leave its semaphores to the resource tracker's "leaked" warning)
EXIT_GRACE_S = 10.0


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one, capped by a
    cgroup CPU quota: :func:`variantlab.probes.machine.cores`)."""
    from ..probes.machine import cores

    return cores()


def threads_per_worker(workers: int, threads: int | None = None) -> int:
    """Torch threads for each of ``workers`` processes: ``threads`` (``--threads``), else the
    user's choice or the policy (:func:`variantlab.executors.threads.choose_threads`: one
    each for more than one worker)."""
    return choose_threads(workers, threads).count


class PoolOptions(Strict):
    """``--workers N``: the pool's size (default: the CPUs this process may use)."""

    workers: PositiveInt = Field(default_factory=cpu_count, description="worker processes")


class PoolExecutor(Executor):
    feeds = True
    elsewhere = True

    def __init__(self, options: PoolOptions | None = None) -> None:
        self.workers = (options or PoolOptions()).workers
        self._warm: ProcessPoolExecutor | None = None  # started by warm(), not yet used
        self._launcher: threading.Thread | None = None  # warm()'s, starting the workers

    def warm(self, source: ExperimentSource, threads: int | None = None) -> None:
        """Start the workers now, in a thread of this process (starting a worker waits for
        the forkserver's imports; the driver meanwhile checks the experiment and sizes its
        variants): each rebuilds the experiment ahead of its first unit."""
        if self._warm is None:
            pool = self._warm = _new_pool(self.workers, threads_per_worker(self.workers, threads))
            environ = dict(os.environ)

            def start() -> None:
                try:
                    for _ in range(self.workers):
                        pool.submit(_rebuild, source, environ)
                except Exception:  # noqa: BLE001, S110 - a broken pool: the run's first
                    pass  # unit says so

            self._launcher = threading.Thread(target=start, name="variantlab-pool-start",
                                              daemon=True)
            self._launcher.start()

    def _started(self) -> None:
        """Wait until warm()'s thread has started the workers (or failed to)."""
        if self._launcher is not None:
            self._launcher.join()
            self._launcher = None

    def close(self) -> None:
        self._started()
        if self._warm is not None:
            _terminate(self._warm)
            self._warm = None

    def describe(self) -> str:
        return f"{self.workers} worker processes"

    def prepare(self, experiment: Experiment, units: Sequence[tuple[int, Unit]],
                context: RunContext) -> None:
        try:
            pickle.dumps(context.probe_fn)
        except Exception as exc:
            raise TypeError(f"the pool sends probe_fn to the workers; it must be picklable "
                            f"(a module-level function): {exc}") from None

    def run(self, sink: ResultSink, units: Sequence[tuple[int, Unit]], experiment: Experiment,
            context: RunContext) -> bool:
        """Compute the units in the pool (and those ``context.feed`` adds as they are
        stored), then the timing units here, one at a time."""
        work = split_units(sink, units)
        if work.leaders or context.feed is not None:
            self._started()
            warm, self._warm = self._warm, None
            if not _pool(sink, work, self.workers, context,
                         ExperimentSource.of(experiment, context.extra_plugins, context.device,
                                             defer=context.defer),
                         warm):
                return False
        now = context.feed.experiment if context.feed is not None else experiment
        return run_in_process(sink, work.serial, now, context.probe_fn, context.fail_fast)


# -- the worker side ---------------------------------------------------------------------
def _init_worker(threads: int) -> None:
    import torch

    from ..model.build import VariantWarning

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever the driver's parent set, the
    if hasattr(signal, "pthread_sigmask"):  # driver can end it (no such call on Windows)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=VariantWarning)  # the driver reports them once
    parent = multiprocessing.parent_process()
    if parent is not None:  # never outlive a driver that was killed
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: Any) -> None:
    parent.join()
    os._exit(1)


def _adopt(environ: dict[str, str]) -> None:
    """Make this worker's environment ``environ``, the driver's when the task was handed
    out."""
    if os.environ != environ:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)


def _rebuild(source: ExperimentSource, environ: dict[str, str]) -> None:
    """Rebuild the experiment ahead of its first unit (:meth:`PoolExecutor.warm`); a failure
    is left to that unit, which reports it."""
    _adopt(environ)
    try:
        rebuilt(source)
    except BaseException:  # noqa: BLE001 - said by the unit that needs it
        pass


def _compute(key: str, source: ExperimentSource, threads: int, probe_fn: Callable[..., list],
             environ: dict[str, str]) -> tuple[UnitRecord, list]:
    """Run the unit ``key`` of ``source``'s experiment in this worker with ``threads`` torch
    threads (the pool's size when the unit was handed out decides them) in the driver's
    environment ``environ`` (its checkpoint folder, ``VARIANTLAB_CHECKPOINT_DIR``, set after a warm
    worker started, included)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    _adopt(environ)
    return compute(source, key, probe_fn)


def _new_pool(workers: int, threads: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=starting.context(),
                               initializer=_init_worker, initargs=(threads,))


# -- the driver side ---------------------------------------------------------------------
def _pool(sink: ResultSink, work: Work, workers: int, context: RunContext,
          source: ExperimentSource, warm: ProcessPoolExecutor | None = None) -> bool:
    """Compute ``work``'s leaders, and the units ``context.feed`` adds as units are stored,
    in ``workers`` processes (no more at a time than there are leaders when nothing can be
    added), those of ``warm`` when it was started already; added serial units join
    ``work.serial``. ``False`` when the run stopped early. The workers are ended as soon as
    the last unit is stored (nothing of theirs is left to wait for)."""
    feed = context.feed
    queue: deque[tuple[int, Unit, ExperimentSource]] = deque(
        (index, unit, source) for index, unit in work.leaders)

    def add(new: list[tuple[int, Unit]]) -> None:
        nonlocal source
        if new and feed is not None:
            source = ExperimentSource.of(feed.experiment, context.extra_plugins, context.device,
                                         defer=context.defer, tested=feed.tested)
        first_now = []
        for index, unit in new:
            if unit.serial:
                work.serial.append((index, unit))
            elif unit.key in work.twins:  # queued or running already: reuse its result
                work.twins[unit.key].append((index, unit))
            else:
                work.twins[unit.key] = []
                first_now.append((index, unit, source))
        queue.extendleft(reversed(first_now))  # next: an extension may need another round

    add(fed(sink, feed, None))
    if not queue:
        if warm is not None:
            _terminate(warm)
        return True
    n = workers if feed is not None else min(workers, len(queue))
    threads = threads_per_worker(n, context.threads)
    pool = warm if warm is not None else _new_pool(n, threads)
    in_flight: dict[Future, tuple[int, Unit, str, float]] = {}
    processes: dict[int, Any] = {}  # pid -> Process, to say which one died
    stopped = False
    # the feed's decisions (reading the store, about 0.5 s for a tuned sweep's group) run in
    # a thread of their own, one at a time and in order, while the workers go on
    decide = getattr(feed, "decide", None)
    feeder = ThreadPoolExecutor(1, thread_name_prefix="variantlab-feed") \
        if decide is not None else None
    deciding: deque[Future] = deque()

    def decided() -> None:
        """Add what the finished decisions add, in the order they were asked for."""
        while deciding and deciding[0].done() and feed is not None:
            decision = deciding.popleft().result()  # a feed that raised: the run stops
            if not stopped:
                add(sorted_out(sink, feed, feed.apply(decision)))  # type: ignore[attr-defined]

    def hand_out() -> None:
        """Give every free worker its next unit."""
        while queue and not stopped and len(in_flight) < n:
            index, unit, where = queue.popleft()
            sink.start(index, unit)
            task = pool.submit(_compute, unit.key, where, threads, context.probe_fn,
                               dict(os.environ))
            in_flight[task] = (index, unit, now_iso(), time.perf_counter())

    finished = False
    try:
        while queue or in_flight or deciding:
            decided()
            hand_out()
            processes.update(getattr(pool, "_processes", None) or {})
            if not in_flight and not deciding:
                break
            done, _ = wait([*in_flight, *deciding], timeout=1.0, return_when=FIRST_COMPLETED)
            stored = []
            for future in sorted((f for f in done if f in in_flight),
                                 key=lambda f: in_flight[f][0]):
                index, unit, started, t0 = in_flight.pop(future)
                record, rows, broken = _outcome(future, unit, started, t0, processes)
                ok = store_result(sink, index, unit, record, rows, work.twins, context.fail_fast)
                stopped = stopped or broken or (context.fail_fast and not ok)
                stored.append(unit)
            hand_out()  # the freed workers go on first; what the feed adds comes next
            for unit in stored:
                if stopped:
                    break
                if feeder is not None and decide is not None:
                    deciding.append(feeder.submit(decide, unit))
                else:
                    add(fed(sink, feed, unit))
        finished = True
    finally:  # done: the workers exit by themselves; Ctrl-C, SIGTERM, a store that cannot
        if feeder is not None:  # be written: they are stopped now
            feeder.shutdown(wait=True, cancel_futures=True)
        _terminate(pool, EXIT_GRACE_S if finished else 0.0)
    return not stopped


def _outcome(future: Future, unit: Unit, started: str, t0: float,
             processes: dict[int, Any]) -> tuple[UnitRecord, list, bool]:
    """``(record, rows, pool_broken)`` of a finished future."""
    try:
        record, rows = future.result()
        return record, rows, False
    except BrokenProcessPool as exc:
        error = f"worker process died ({_dead(processes)}): {exc}"
        tb = (f"{error}\nThe run stopped; units finished before are stored. "
              "Run again to retry this unit and compute the rest.\n")
        return unit_record(unit, started, time.perf_counter() - t0, error, tb), [], True
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # raised in the worker outside the probe (rebuilding,
        # lookup), SystemExit included: it fails this unit, the pool goes on
        remote = getattr(exc.__cause__, "tb", None)
        tb = remote or "".join(traceback.format_exception(exc))
        error = error_text(exc)
        return unit_record(unit, started, time.perf_counter() - t0, error, tb), [], False


def _dead(processes: dict[int, Any]) -> str:
    """Which worker died and how, as far as the exit codes tell."""
    deadline = time.monotonic() + 2.0  # its pipe closes a moment before it can be reaped
    for process in processes.values():
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    codes = {pid: p.exitcode for pid, p in processes.items() if p.exitcode not in (None, 0)}
    culprits = {pid: c for pid, c in codes.items() if c != -signal.SIGTERM} or codes
    if not culprits:
        return "exit status unknown"
    return ", ".join(f"pid {pid} {_exit_text(code)}" for pid, code in sorted(culprits.items()))


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _terminate(pool: ProcessPoolExecutor, grace: float = 0.0) -> None:
    """Cancel what has not started and stop the workers: those that have not exited by
    themselves within ``grace`` seconds (a run's normal end: the shutdown tells them to) get
    SIGTERM, then SIGKILL if still alive after :data:`TERMINATE_GRACE_S` (Ctrl-C, SIGTERM:
    ``grace`` 0, at once)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace
    for process in processes if grace > 0 else ():
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:  # SIGTERM blocked or ignored (inherited), or stuck in I/O
        if process.is_alive():
            process.kill()
            process.join(timeout=TERMINATE_GRACE_S)
