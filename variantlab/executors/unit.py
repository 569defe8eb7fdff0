"""One unit computed and stored: :func:`run_unit` runs its probe (an exception becomes a
failed record), :class:`ResultSink` is the driver's end of a run, the only writer of the
store (one transaction per unit, so SIGKILL loses at most the units in progress), and
:class:`RunSummary` / :class:`UnitEvent` are what the run reports. Shared by the runner and
every executor (in-process, process pool, Ray); the units themselves are planned in
:mod:`variantlab.sweep.units`.
"""

from __future__ import annotations

import gc
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data.cache import CacheWarning
from ..probes import checkpoint, machine
from ..probes.allocator import keep_freed_memory
from ..store.store import Store, UnitRecord
from ..sweep.units import Unit, canonical_json, plain
from ..version import __version__
from . import hardware

if TYPE_CHECKING:
    from ..config.experiment import Experiment


@dataclass
class UnitEvent:
    """What the runner reports to a progress callback."""

    kind: str  # start | ok | failed | skipped
    unit: Unit
    index: int  # 0-based position among the units to consider
    total: int
    duration_s: float | None = None
    error: str | None = None
    shared_with: str | None = None  # skipped: the variant whose unit of this key ran just now


@dataclass
class RunSummary:
    run_dir: Path
    store: Path
    total: int  # units considered (after --only)
    done: int = 0  # computed ok in this run
    skipped: int = 0  # already stored ok
    shared: int = 0  # of those, computed in this run for another variant (the same key)
    failed: list[tuple[Unit, str]] = field(default_factory=list)
    interrupted: bool = False
    write_error: str | None = None  # the store refused a write (disk full): the run stopped
    warnings: list[str] = field(default_factory=list)  # the units' (each once, in order)

    @property
    def not_run(self) -> int:
        """Units left after --fail-fast or Ctrl-C."""
        return self.total - self.done - self.skipped - len(self.failed)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted and self.write_error is None

    @property
    def exit_code(self) -> int:
        """0 ok, 1 a unit failed, 3 the store could not be written, 130 interrupted."""
        if self.interrupted:
            return 130
        if self.write_error is not None:
            return 3
        return 1 if self.failed else 0


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class ResultSink:
    """The driver's end of a run, whichever executor computes the units: it alone writes
    the store (one transaction per unit), keeps the summary and emits the progress events."""

    def __init__(self, store: Store, summary: RunSummary, notify: Callable[[UnitEvent], None],
                 rerun: Iterable[str] = ()):
        self.store, self.summary, self.notify = store, summary, notify
        self.statuses = store.statuses()
        self.rerun = set(rerun)  # keys to compute again although stored ok
        self.computed: dict[str, str] = {}  # key -> the variant that computed it in this run

    def stored_ok(self, unit: Unit) -> bool:
        return unit.key not in self.rerun and self.statuses.get(unit.key) == "ok"

    def skip(self, index: int, unit: Unit) -> None:
        """A unit stored ok already: by an earlier run, or in this one for another variant
        with the same key (a setting axis the probe does not read shares its params unit)."""
        self.summary.skipped += 1
        shared = self.computed.get(unit.key)
        self.summary.shared += shared is not None
        self.notify(UnitEvent("skipped", unit, index, self.summary.total, shared_with=shared))

    def start(self, index: int, unit: Unit) -> None:
        self.notify(UnitEvent("start", unit, index, self.summary.total))

    def save(self, index: int, unit: Unit, record: UnitRecord, rows: Sequence[Any]) -> bool:
        """Store one unit and report it; ``True`` when it is ``ok``."""
        self.store.save_unit(record, rows)  # one transaction: rolled back if interrupted
        for note in record.notes:  # a checkpoint set aside or not written: said once
            if note not in self.summary.warnings:
                self.summary.warnings.append(note)
        if record.status == "ok":  # done: its mid-training checkpoint goes (a failed unit,
            checkpoint.remove(unit.key)  # a lost worker's among them, resumes from it)
            trained = getattr(unit.settings, "trained", None)
            if trained is not None:  # a test unit: the weights it scored are not needed
                checkpoint.drop_weights(trained)
        self.rerun.discard(unit.key)  # computed now: a variant with the same spec reuses it
        self.statuses[unit.key] = record.status
        total = self.summary.total
        if record.status == "ok":
            self.computed.setdefault(unit.key, unit.variant.name)
            self.summary.done += 1
            self.notify(UnitEvent("ok", unit, index, total, record.duration_s))
            return True
        self.summary.failed.append((unit, record.error or ""))
        self.notify(UnitEvent("failed", unit, index, total, record.duration_s, record.error))
        return False


def run_unit(unit: Unit, experiment: Experiment, probe_fn: Callable[..., list]) -> tuple[UnitRecord, list]:
    """Run one probe; an exception, SystemExit included, becomes a failed record
    (KeyboardInterrupt propagates). The first unit of a process fixes its allocator's
    thresholds (:func:`variantlab.probes.allocator.keep_freed_memory`)."""
    keep_freed_memory()
    started = now_iso()
    t0, cpu0, load0 = time.perf_counter(), time.process_time(), machine.load()
    rows: list = []
    error = tb = None
    notes: list[str] = []
    try:
        with checkpoint.for_unit(unit.key), warnings.catch_warnings():
            warnings.simplefilter("always", checkpoint.CheckpointWarning)
            warnings.simplefilter("always", CacheWarning)
            warnings.showwarning = _noting(notes, warnings.showwarning)
            rows = list(probe_fn(
                unit.measures, unit.variant.spec, unit.settings, seed=unit.seed,
                data=getattr(unit.variant, "data", None) or experiment.data,
                base_dir=Path(experiment.base_dir), device=unit.device,
                registry=experiment.registry,
            ))
        _check_rows(rows, unit.probe)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the run (the unit is not stored)
        raise
    except BaseException as exc:  # any failure of a component, a probe or the device, and
        # SystemExit or another BaseException from plugin code: that unit fails, no more
        rows = []
        error = error_text(exc)
        if out_of_memory(exc):  # free what filled memory before formatting anything
            traceback.clear_frames(exc.__traceback__)
            _free_memory()
        tb = traceback_text(exc)
        _free_memory()
    usage: dict[str, Any] = {"cpu_s": time.process_time() - cpu0, "load_start": load0,
                             "load_end": machine.load(), "torch_threads": torch.get_num_threads(),
                             "cores": machine.cores(), "machine": hardware.machine(unit.device)}
    usage["notes"] = tuple(notes)
    return unit_record(unit, started, time.perf_counter() - t0, error, tb, usage), rows


def _noting(notes: list[str], show: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that keeps a checkpoint's or the token cache's warnings in
    ``notes`` (the run prints them, each once, in any executor) and shows the others as
    ``show`` does."""
    def showwarning(message: Any, category: type[Warning], filename: str, lineno: int,
                    file: Any = None, line: str | None = None) -> None:
        if issubclass(category, checkpoint.CheckpointWarning):
            notes.append(f"checkpoint: {message}")
        elif issubclass(category, CacheWarning):
            notes.append(f"data: {message}")
        else:
            show(message, category, filename, lineno, file, line)
    return showwarning


def out_of_memory(exc: BaseException) -> bool:
    """A ``MemoryError`` (host), torch's ``OutOfMemoryError`` (a device) or torch's CPU
    allocator failing ("can't allocate memory")."""
    return (isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError)))
            or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)))


def error_text(exc: BaseException) -> str:
    """``Type: message``; a SystemExit says that code called ``sys.exit`` and with what; an
    out-of-memory error says what to change."""
    if isinstance(exc, SystemExit):
        return (f"SystemExit: code called sys.exit({exc.code!r}) (or raised SystemExit) "
                "while the unit ran; a component must raise an exception instead")
    if out_of_memory(exc):
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return (f"{type(exc).__name__}: the unit ran out of memory{': ' + text if text else ''}"
                "; use a smaller batch_size, model or budget (the other units go on)")
    return f"{type(exc).__name__}: {exc}"


def traceback_text(exc: BaseException) -> str:
    """The formatted traceback of ``exc``; a short note when formatting it runs out of
    memory itself."""
    try:
        return "".join(traceback.format_exception(exc))
    except MemoryError:
        return f"{type(exc).__name__} (the traceback could not be formatted: out of memory)\n"


def now_iso() -> str:
    """UTC time to the millisecond, as stored in ``started_at`` / ``finished_at``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def unit_record(unit: Unit, started: str, duration_s: float, error: str | None = None,
                tb: str | None = None, usage: dict[str, Any] | None = None) -> UnitRecord:
    """The stored record of a unit that finished now: ``ok`` unless ``error`` is given;
    ``usage``: its CPU time, load averages, torch threads and cores (:func:`run_unit`)."""
    return UnitRecord(
        key=unit.key, variant=unit.variant.name, seed=unit.seed, probe=unit.probe,
        settings_json=canonical_json(plain(unit.settings)),
        status="failed" if error else "ok", error=error, traceback=tb,
        started_at=started, finished_at=now_iso(), duration_s=duration_s,
        version=__version__, device=unit.device, **(usage or {}),
    )


def _check_rows(rows: list, probe: str) -> None:
    for i, r in enumerate(rows):
        missing = [k for k in ("probe", "metric") if k not in r]
        if missing:
            raise TypeError(f"probe {probe!r} returned row {i} without {', '.join(missing)}")
