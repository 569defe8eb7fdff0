"""The Ray executor: ``variantlab run EXP.yaml --executor ray [--address ADDR] [--workers N]``.

Without ``--address`` a local Ray instance with ``--workers`` CPUs (default: all) is started
for the run and stopped after it; with one, the run connects to that cluster
(``ray.init(address=ADDR)``; ``ray://HOST:PORT`` for Ray Client, ``auto`` for the cluster
this machine belongs to). Each unit is one Ray task: it gets the experiment's YAML text,
path and plugins (:class:`~variantlab.executors.base.ExperimentSource`) and the unit's key,
rebuilds the experiment once per worker process and sends back the unit's record and rows
as plain data. Only the files the units read travel, in Ray's runtime environment, and a
payload above ``--ray-max-upload`` MB is refused before Ray is started (:mod:`.ray_payload`).

Each task reserves ``resources.<probe>`` of the experiment (default one CPU, and one GPU
when the unit's device is CUDA) and runs with as many torch threads as CPUs. The driver
hands the cluster no more units than its CPUs and GPUs hold at once (``start`` in the
progress display means handed over), writes each unit as its task finishes (``ray.wait``)
and is the only writer of the store. Serial units (timing) run last, as Ray tasks, one at a
time, after every other task has finished: none of the run's other units runs beside them.

Faults: a task whose worker process or node dies (killed, out of memory) is retried up to
``--retries`` times (default 2), then stored ``failed`` with Ray's error; the run goes on.
A unit whose code raises is failed at once (as in process: no retry). Ctrl-C cancels the
tasks in flight (``ray.cancel(force=True)``); finished units stay stored.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from ..errors import SpecError
from ..plugin.settings import Strict
from ..probes import checkpoint
from ..store.store import UnitRecord
from ..sweep.units import Unit
from . import ray_env, ray_payload
from .base import Executor, ExperimentSource, RunContext, compute, split_units, store_result
from .pool import cpu_count
from .unit import ResultSink, error_text, now_iso, unit_record

if TYPE_CHECKING:
    from ..config.experiment import Experiment


class RayOptions(Strict):
    """``--address``, ``--workers`` (a local instance's CPUs), ``--retries``,
    ``--ray-max-upload`` and ``--checkpoint-dir``."""

    address: str | None = Field(default=None, description="a running cluster; none: a local instance")
    workers: PositiveInt | None = Field(default=None, description="CPUs of the local instance")
    retries: NonNegativeInt = Field(default=2, description="retries of a task whose worker died")
    max_upload: PositiveFloat = Field(default=ray_payload.DEFAULT_MAX_MB,
                                      description="MB the run may ship to the workers")
    checkpoint_dir: str | None = Field(
        default=None, description="a folder every worker can write (shared storage) for "
        "mid-training checkpoints; none: units are not checkpointed and restart")


def _task(source: ExperimentSource, key: str, device: str | None,
          probe_fn: Callable[..., list], threads: int,
          shipped: ray_payload.Shipped | None,
          checkpoints: str | None = None) -> tuple[dict[str, Any], list]:
    """One unit in a Ray worker: ``(record as a dict, rows)``."""
    import torch

    from ..model.build import VariantWarning

    warnings.filterwarnings("ignore", category=VariantWarning)  # the driver reports them once
    torch.set_num_threads(threads)
    if shipped is not None:
        source = replace(source, plugin_paths=tuple(shipped.paths().items()))
    with checkpoint.directory(Path(checkpoints) if checkpoints else None):
        record, rows = compute(source, key, probe_fn, device)
    return asdict(record), rows


@dataclass
class _Task:
    index: int
    unit: Unit
    demand: tuple[float, float]
    started: str
    t0: float


class RayExecutor(Executor):
    elsewhere = True

    def __init__(self, options: RayOptions | None = None) -> None:
        self.options = options or RayOptions()
        self.ray: Any = None
        self.stage: Path | None = None
        self.shipped: ray_payload.Shipped | None = None
        self.base_dir: str | None = None  # the experiment folder's copy on the workers
        self.capacity = (0.0, 0.0)

    @property
    def runs_here(self) -> bool:  # type: ignore[override]
        return not self.options.address

    def describe(self) -> str:
        if self.options.address:
            return f"Ray cluster at {self.options.address}"
        return f"local Ray instance, {self.options.workers or cpu_count()} CPUs"

    def checkpoint_dir(self, run_dir: Path) -> Path | None:
        """``--checkpoint-dir`` (the workers may not see the driver's run folder)."""
        folder = self.options.checkpoint_dir
        return Path(folder).expanduser() if folder else None

    # -- before the run ------------------------------------------------------------------
    def prepare(self, experiment: Experiment, units: Sequence[tuple[int, Unit]],
                context: RunContext) -> None:
        opts = self.options
        if opts.address and opts.workers:
            raise SpecError.at(("--workers",), "sizes a local Ray instance; a cluster at "
                               "--address has its own size: drop one of them")
        if opts.checkpoint_dir:
            check_checkpoint_dir(Path(opts.checkpoint_dir).expanduser())
        try:
            import ray
        except ImportError:
            where = f" to reach {opts.address}" if opts.address else ""
            raise SpecError.at(("--executor",), f"ray needs the ray package{where}: pip install "
                               "'variantlab[ray]' (the Ray version of the cluster)") from None
        ray_env.check_devices(units, context.device)
        if opts.address:
            ray_env.check_address(opts.address)
        self.stage = ray_payload.make_stage()
        payload = ray_payload.select(experiment, context.extra_plugins, context.run_dir,
                                     self.stage)
        ray_payload.check_size(payload, opts.max_upload)  # before anything is copied
        env, self.shipped, self.base_dir = ray_payload.stage(payload, self.stage)
        self._connect(ray, env)
        nodes = ray.nodes()
        ray_env.check_capacity(nodes, {u.probe: ray_env.unit_resources(experiment, u)
                                       for _, u in units})
        total = ray.cluster_resources()
        self.capacity = (float(total.get("CPU", 0)), float(total.get("GPU", 0)))

    def _connect(self, ray: Any, env: dict[str, Any]) -> None:
        kwargs: dict[str, Any] = dict(runtime_env=env or None, log_to_driver=False,
                                      logging_level=logging.WARNING,
                                      configure_logging=False)
        if not self.options.address:
            kwargs.update(num_cpus=self.options.workers or cpu_count(), include_dashboard=False)
        sigterm = signal.getsignal(signal.SIGTERM)  # a local instance installs its own
        try:
            ray.init(address=self.options.address, **kwargs)
        except Exception as exc:
            what = f"Ray cluster at {self.options.address}" if self.options.address else \
                "a local Ray instance"
            raise SpecError.at(("--address" if self.options.address else "--executor",),
                               f"cannot connect to {what}: {type(exc).__name__}: {exc}") from None
        finally:
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        self.ray = ray

    def close(self) -> None:
        if self.ray is not None:
            self.ray.shutdown()
            self.ray = None
        if self.stage is not None:
            import shutil

            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None

    # -- the run -------------------------------------------------------------------------
    def run(self, sink: ResultSink, units: Sequence[tuple[int, Unit]], experiment: Experiment,
            context: RunContext) -> bool:
        work = split_units(sink, units)
        source = ExperimentSource.of(experiment, context.extra_plugins, context.device)
        if self.base_dir is not None:
            source = replace(source, base_dir=self.base_dir)  # the workers' copy of the folder
        ray = self.ray
        args = (ray.put(source), ray.put(context.probe_fn))
        submit = _Submitter(ray, experiment, args, self.shipped, self.options.retries,
                            self.options.checkpoint_dir)
        if not self._drain(sink, deque(work.leaders), work.twins, submit, context, False):
            return False
        return self._drain(sink, deque(work.serial), {}, submit, context, True)

    def _drain(self, sink: ResultSink, queue: deque[tuple[int, Unit]],
               twins: dict[str, list[tuple[int, Unit]]], submit: _Submitter,
               context: RunContext, alone: bool) -> bool:
        """Hand units to the cluster as its capacity allows (``alone``: one at a time) and
        store each as it finishes; ``False`` when ``fail_fast`` stopped it."""
        in_flight: dict[Any, _Task] = {}
        stopped = False
        try:
            while queue or in_flight:
                while queue and not stopped and self._fits(queue[0][1], in_flight, alone,
                                                           submit.experiment):
                    index, unit = queue.popleft()
                    sink.start(index, unit)
                    ref, demand = submit(unit)
                    in_flight[ref] = _Task(index, unit, demand, now_iso(), time.perf_counter())
                if not in_flight:
                    break
                done, _ = self.ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                if done:
                    done, _ = self.ray.wait(list(in_flight), num_returns=len(in_flight),
                                            timeout=0)
                for ref in sorted(done, key=lambda r: in_flight[r].index):
                    task = in_flight.pop(ref)
                    record, rows = self._outcome(ref, task)
                    ok = store_result(sink, task.index, task.unit, record, rows, twins,
                                      context.fail_fast)
                    stopped = stopped or (context.fail_fast and not ok)
        except BaseException:  # Ctrl-C, SIGTERM, a store that cannot be written
            for ref in in_flight:
                self.ray.cancel(ref, force=True)
            raise
        return not stopped

    def _fits(self, unit: Unit, in_flight: dict[Any, _Task], alone: bool,
              experiment: Experiment) -> bool:
        if not in_flight:
            return True
        if alone:
            return False
        cpus, gpus = ray_env.unit_resources(experiment, unit)
        used_cpus = sum(t.demand[0] for t in in_flight.values())
        used_gpus = sum(t.demand[1] for t in in_flight.values())
        return used_cpus + cpus <= self.capacity[0] and used_gpus + gpus <= self.capacity[1]

    def _outcome(self, ref: Any, task: _Task) -> tuple[UnitRecord, list]:
        """The task's record and rows, or a failed record saying what Ray reported."""
        from ray.exceptions import RayError, RayTaskError

        try:
            data, rows = self.ray.get(ref)
            return UnitRecord(**data), rows
        except RayTaskError as exc:  # raised in the worker outside the probe: no retry
            cause = getattr(exc, "cause", None) or exc
            error, tb = error_text(cause), str(exc)
        except RayError as exc:  # its worker or node died, also after the retries
            error = f"{type(exc).__name__}: {exc}"
            tb = (f"{error}\nRay ran the task {self.options.retries + 1} time(s) (--retries "
                  f"{self.options.retries}). Run again to retry this unit.\n")
        return unit_record(task.unit, task.started, time.perf_counter() - task.t0, error, tb), []


class _Submitter:
    """Makes one Ray task of a unit with its resources and the retry policy."""

    def __init__(self, ray: Any, experiment: Experiment, args: tuple[Any, Any],
                 shipped: ray_payload.Shipped | None, retries: int,
                 checkpoints: str | None = None) -> None:
        self.remote = ray.remote(_task)
        self.experiment, self.args, self.shipped, self.retries = experiment, args, shipped, retries
        self.checkpoints = checkpoints

    def __call__(self, unit: Unit) -> tuple[Any, tuple[float, float]]:
        cpus, gpus = ray_env.unit_resources(self.experiment, unit)
        ref = self.remote.options(
            num_cpus=cpus, num_gpus=gpus, max_retries=self.retries, retry_exceptions=False,
            name=f"variantlab {unit.title}",
        ).remote(self.args[0], unit.key, unit.device, self.args[1], max(1, int(cpus)),
                 self.shipped, self.checkpoints)
        return ref, (cpus, gpus)


def check_checkpoint_dir(folder: Path) -> None:
    """``--checkpoint-dir`` must be a folder this process can write (made if missing), checked
    before Ray starts; each worker writes there too, so it belongs on shared storage."""
    if folder.exists() and not folder.is_dir():
        raise SpecError.at(("--checkpoint-dir",), f"{folder} is a file, not a folder: name a "
                           "folder every worker can write (shared storage), or leave the flag out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError.at(("--checkpoint-dir",), f"cannot make {folder}: {exc.strerror}; name a "
                           "folder every worker can write, or leave the flag out") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError.at(("--checkpoint-dir",), f"{folder} is not writable: name a folder "
                           "every worker can write, or leave the flag out")
