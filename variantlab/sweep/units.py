"""Units and their planning: what identifies a unit, how one is computed, and the driver's
sink that stores it. Shared by the runner and every executor (in-process, process pool).

A unit is one (variant, seed, probe). Its key is the sha256 of canonical JSON of everything
that decides its numbers: the variant's resolved spec, the probe and its settings, the
effective device, the data spec and what it reads, the seed, the variantlab and torch
versions and the source code of the core, the built-in plugins and every other plugin the
variant uses (:mod:`variantlab.sweep.keys`). Only the driver process writes the store, one
transaction per unit (:class:`ResultSink`), so SIGKILL loses at most the units in progress.
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import __version__
from ..store.store import Store, UnitRecord
from .keys import data_fingerprint, environment, probe_code, variant_code

if TYPE_CHECKING:
    from ..config.experiment import Experiment, Variant


def default_probe_fn(name: str, spec: Any, settings: Any, **kwargs: Any) -> list:
    """``variantlab.probes.run_probe``, imported when first needed."""
    from ..probes import run_probe

    return run_probe(name, spec, settings, **kwargs)


def plain(obj: Any) -> Any:
    """JSON-safe data of a pydantic model (or plain data)."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    return obj


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def resolve_device(probe: Any, settings: Any, override: str | None) -> str | None:
    """The device a probe runs on: ``--device``, else the settings' own, else CPU;
    ``auto`` means CUDA when present. ``None`` for a registered probe (``probe``, a
    :class:`variantlab.plugin.probe.Probe`) that no device changes; a probe's name alone
    gives the device its settings ask for."""
    if getattr(probe, "device_free", False):
        return None
    device = override or getattr(settings, "device", None) or "cpu"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device


def unit_key(spec_data: Any, probe: str, settings_data: Any, device: str | None,
             data_data: Any, seed: int, version: str = __version__,
             code: Mapping[str, Any] | None = None) -> str:
    """Content hash of one unit. ``code`` is what the numbers depend on besides the
    arguments (:mod:`variantlab.sweep.keys`); by default the core code and versions."""
    payload = {
        "spec": spec_data, "probe": probe, "settings": settings_data, "device": device,
        "data": data_data, "seed": seed, "version": version,
        "code": dict(code) if code is not None else environment(),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


@dataclass(frozen=True)
class Unit:
    key: str
    variant: Variant
    seed: int
    probe: str
    settings: Any
    device: str | None
    serial: bool = False  # the probe's units run last, one at a time (timing)

    @property
    def title(self) -> str:
        return f"{self.variant.name} seed={self.seed} {self.probe}"


def plan_units(experiment: Experiment, device: str | None = None) -> list[Unit]:
    """Every unit of the experiment in a fixed order: variant, then seed, then probe; the
    units of serial probes (timing) last, interleaved (seed, then variant): a variant's
    timings then sit next to the other variants' in time, so the machine's drift hits
    them alike (the process pool also keeps them out)."""
    def data_key(data: Any) -> Any:
        out = plain(data)
        content = data_fingerprint(data, experiment.base_dir)
        return out if content is None else {**out, "content": content}

    data_data = data_key(experiment.data)
    base = experiment.measure.probes()
    registry = experiment.registry
    found = {name: registry.probe(name, ("measure", name)) for name in base}
    units = []
    for variant in experiment.variants:
        spec_data = variant.spec.to_data()
        # a variant's setting axes (measure.<probe>.<key>) change its probes' settings
        probes = experiment.probes_of(variant) if getattr(variant, "settings", None) else base
        variant_data = getattr(variant, "data", None)
        data_in_key = data_data if variant_data is None else data_key(variant_data)
        for seed in experiment.seeds:
            for name, settings in probes.items():
                probe = found[name]
                plugins = {**variant_code(spec_data, registry),
                           **probe_code(probe, registry)}
                code = {**environment(), "plugins": plugins} if plugins else environment()
                dev = resolve_device(probe, settings, device)
                key = unit_key(spec_data, name, plain(settings), dev, data_in_key, seed,
                               code=code)
                units.append(Unit(key, variant, seed, name, settings, dev, probe.serial))
    seeds = list(experiment.seeds)
    rank = {v.name: i for i, v in enumerate(experiment.variants)}
    first = [u for u in units if not u.serial]
    last = sorted((u for u in units if u.serial),
                  key=lambda u: (seeds.index(u.seed), rank[u.variant.name], u.probe))
    return first + last


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


def run_in_process(
    sink: ResultSink,
    units: Sequence[tuple[int, Unit]],
    experiment: Experiment,
    probe_fn: Callable[..., list] = default_probe_fn,
    fail_fast: bool = False,
) -> bool:
    """The in-process executor: ``(index, unit)`` pairs one after another in this process.
    Returns ``False`` when ``fail_fast`` stopped it; KeyboardInterrupt propagates."""
    for index, unit in units:
        if sink.stored_ok(unit):
            sink.skip(index, unit)
            continue
        sink.start(index, unit)
        record, rows = run_unit(unit, experiment, probe_fn)
        if not sink.save(index, unit, record, rows) and fail_fast:
            return False
    return True


def run_unit(unit: Unit, experiment: Experiment, probe_fn: Callable[..., list]) -> tuple[UnitRecord, list]:
    """Run one probe; an exception, SystemExit included, becomes a failed record
    (KeyboardInterrupt propagates)."""
    started = now_iso()
    t0 = time.perf_counter()
    rows: list = []
    error = tb = None
    try:
        rows = list(probe_fn(
            unit.probe, unit.variant.spec, unit.settings, seed=unit.seed,
            data=getattr(unit.variant, "data", None) or experiment.data,
            base_dir=Path(experiment.base_dir), device=unit.device, registry=experiment.registry,
        ))
        _check_rows(rows, unit.probe)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the run (the unit is not stored)
        raise
    except BaseException as exc:  # any failure of a component, a probe or the device, and
        # SystemExit or another BaseException from plugin code: that unit fails, no more
        error = error_text(exc)
        tb = traceback.format_exc()
        rows = []
        _free_memory()
    return unit_record(unit, started, time.perf_counter() - t0, error, tb), rows


def error_text(exc: BaseException) -> str:
    """``Type: message``; a SystemExit says that code called ``sys.exit`` and with what."""
    if isinstance(exc, SystemExit):
        return (f"SystemExit: code called sys.exit({exc.code!r}) (or raised SystemExit) "
                "while the unit ran; a component must raise an exception instead")
    return f"{type(exc).__name__}: {exc}"


def now_iso() -> str:
    """UTC time to the millisecond, as stored in ``started_at`` / ``finished_at``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def unit_record(unit: Unit, started: str, duration_s: float, error: str | None = None,
                tb: str | None = None) -> UnitRecord:
    """The stored record of a unit that finished now: ``ok`` unless ``error`` is given."""
    return UnitRecord(
        key=unit.key, variant=unit.variant.name, seed=unit.seed, probe=unit.probe,
        settings_json=canonical_json(plain(unit.settings)),
        status="failed" if error else "ok", error=error, traceback=tb,
        started_at=started, finished_at=now_iso(), duration_s=duration_s,
        version=__version__, device=unit.device,
    )


def _check_rows(rows: list, probe: str) -> None:
    for i, r in enumerate(rows):
        missing = [k for k in ("probe", "metric") if k not in r]
        if missing:
            raise TypeError(f"probe {probe!r} returned row {i} without {', '.join(missing)}")
