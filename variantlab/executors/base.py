"""The executor interface and what every executor shares.

An executor is made once per run from its validated options (``factory(options)``, see the
``register_executors`` hook), then the runner calls, in this order:

1. ``prepare(experiment, units, context)``: check and connect before the run folder or its
   store exists; bad input (an unreachable cluster, a missing package, resources no machine
   has) raises :class:`~variantlab.errors.SpecError` naming the flag or key to change;
2. ``run(sink, units, experiment, context)``: compute the ``(index, unit)`` pairs, handing
   every result to the :class:`~variantlab.executors.unit.ResultSink` (the only writer of the store)
   as it arrives; ``False`` when the run stopped early (``--fail-fast``, a pool that broke);
   KeyboardInterrupt propagates after the executor has stopped its work;
3. ``close()``: always, also after an error or Ctrl-C.

Shared here: the split of the units into those stored already, serial ones (timing: run
last, alone), leaders (one per unit key) and their twins (same key: reuse the leader's
result), and :class:`ExperimentSource`, what a worker on another process or machine
rebuilds the experiment from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from ..errors import SpecError, SpecIssue
from ..probes import run_probe
from ..store.store import UnitRecord
from ..sweep.units import Unit, plan_units
from .unit import ResultSink, run_unit

if TYPE_CHECKING:
    from ..config.experiment import Experiment
    from ..plugin.registry import Registry

#: option fields that have a flag of their own on ``variantlab run``
FLAGS = {"workers": "--workers", "address": "--address", "retries": "--retries",
         "max_upload": "--ray-max-upload", "checkpoint_dir": "--checkpoint-dir"}


class Feed(Protocol):
    """Units a run adds while it goes on (edge extension): called with each unit once it is
    stored (``None``: once at the start, for what is stored already), it returns the units
    to compute next, indexed after the others; ``experiment`` is the run's experiment as it
    now stands (the one worker processes rebuild)."""

    experiment: Experiment
    tested: frozenset[tuple[str, int]]  # the (variant, seed) pairs given test units so far

    def __call__(self, unit: Unit | None) -> list[tuple[int, Unit]]: ...


def fed(sink: ResultSink, feed: Feed | None, unit: Unit | None) -> list[tuple[int, Unit]]:
    """What ``feed`` adds after ``unit`` was stored; units it adds that are stored already
    are reported skipped and fed on in turn."""
    if feed is None:
        return []
    return sorted_out(sink, feed, feed(unit))


def sorted_out(sink: ResultSink, feed: Feed, added: list[tuple[int, Unit]]
               ) -> list[tuple[int, Unit]]:
    """Of the units ``feed`` added, those to compute: one stored already is reported
    skipped, and what ``feed`` adds after it is sorted out in turn."""
    out: list[tuple[int, Unit]] = []
    todo = deque(added)
    while todo:
        index, new = todo.popleft()
        if sink.stored_ok(new):
            sink.skip(index, new)
            todo.extend(feed(new))
        else:
            out.append((index, new))
    return out


@dataclass(frozen=True)
class RunContext:
    """What the run asks of every executor besides its own options."""

    device: str | None = None  # --device
    fail_fast: bool = False
    probe_fn: Callable[..., list] = run_probe
    extra_plugins: tuple[str, ...] = ()  # --plugin modules and files
    run_dir: Path | None = None  # where the store is (OUT/<experiment name>)
    threads: int | None = None  # --threads: torch threads per process (None: the policy)
    feed: Feed | None = None  # units added while the run goes on (edge extension)
    defer: bool = False  # a tuned sweep's test splits at the chosen settings only (plan_units)


class Executor(ABC):
    """Computes units for a run; see the module docstring for the order of the calls."""

    #: the units run on this machine, so its devices and memory are checked before the run
    #: (false for a cluster elsewhere: ``device: cuda`` on a driver without a GPU is fine)
    runs_here: bool = True
    #: it computes the units a :class:`Feed` adds while the run goes on (edge extension in
    #: the same run); one without runs each extension round as a run of its own
    feeds: bool = False
    #: the units are computed in other processes while this one waits for their results
    #: (the driver meanwhile imports the report's modules: :func:`variantlab.cli.main.run`)
    elsewhere: bool = False

    def describe(self) -> str:
        """A few words for the run's first line (``2 worker processes``); may be empty."""
        return ""

    def prepare(self, experiment: Experiment, units: Sequence[tuple[int, Unit]],
                context: RunContext) -> None:
        """Check and connect before anything is computed or written."""
        return None

    @abstractmethod
    def run(self, sink: ResultSink, units: Sequence[tuple[int, Unit]], experiment: Experiment,
            context: RunContext) -> bool:
        """Compute the units, storing each through ``sink``; ``False`` if stopped early."""

    def close(self) -> None:
        """Release what ``prepare`` or ``warm`` took (connections, processes)."""
        return None

    def warm(self, source: ExperimentSource, threads: int | None = None) -> None:
        """Start what is slow to start (worker processes importing torch and rebuilding
        ``source``'s experiment) while the driver still checks the experiment; ``close``
        releases it if the run never comes. Nothing by default."""
        return None

    def checkpoint_dir(self, run_dir: Path) -> Path | None:
        """Where units write mid-training checkpoints (:mod:`variantlab.probes.checkpoint`):
        the run folder's ``checkpoints``; None: units are not checkpointed."""
        return run_dir / "checkpoints"


def option_flag(name: str) -> str:
    """The command-line spelling of an executor option."""
    return FLAGS.get(name, f"--executor-option {name}")


def command_line_options(pairs: Sequence[str] = (), **flags: Any) -> dict[str, Any]:
    """Executor options from the flags given (``None``: not given) and ``KEY=VALUE``
    pairs (``--executor-option``, VALUE read as YAML)."""
    import yaml

    options = {k: v for k, v in flags.items() if v is not None}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SpecError.at(("--executor-option",), f"{pair!r} is not KEY=VALUE "
                               "(e.g. --executor-option partition=gpu)")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            options[key.strip()] = value
    return options


def default_executor(workers: int | None) -> str:
    """``--executor`` when not given: the process pool for ``--workers N > 1``."""
    return "pool" if workers is not None and workers > 1 else "inprocess"


def make_executor(registry: Registry, name: str | None, options: Mapping[str, Any]) -> Executor:
    """The registered executor ``name`` (default: :func:`default_executor`) made from
    ``options`` (option name -> value, only those given); :class:`SpecError` naming the
    flag for an unknown executor or an option it does not take or cannot use."""
    name = name or default_executor(options.get("workers"))
    entry = registry.executor(name)
    try:
        validated = entry.options_cls.model_validate(dict(options))
    except ValidationError as exc:
        takes = ", ".join(option_flag(f) for f in entry.options_cls.model_fields) or "no options"
        issues = []
        for error in exc.errors():
            key = str(error["loc"][0]) if error["loc"] else "options"
            if error["type"] == "extra_forbidden":
                message = f"the {name} executor does not take it (it takes: {takes})"
            else:
                message = f"{error['msg']} (given: {error.get('input')!r})"
            issues.append(SpecIssue((option_flag(key),), message))
        raise SpecError(issues) from None
    return entry.factory(validated)


# -- the units' split ----------------------------------------------------------------------
@dataclass
class Work:
    """Units still to compute: ``leaders`` (one per key), their ``twins`` by key, ``serial``."""

    leaders: list[tuple[int, Unit]] = field(default_factory=list)
    twins: dict[str, list[tuple[int, Unit]]] = field(default_factory=dict)
    serial: list[tuple[int, Unit]] = field(default_factory=list)


def split_units(sink: ResultSink, units: Sequence[tuple[int, Unit]],
                serial_apart: bool = True) -> Work:
    """Skip the units stored ok already (reported as skipped); sort out the rest. With
    ``serial_apart`` false the serial units are leaders and twins like any other."""
    work = Work()
    for index, unit in units:
        if sink.stored_ok(unit):
            sink.skip(index, unit)
        elif unit.serial and serial_apart:
            work.serial.append((index, unit))
        elif unit.key in work.twins:
            work.twins[unit.key].append((index, unit))
        else:
            work.twins[unit.key] = []
            work.leaders.append((index, unit))
    return work


def store_result(sink: ResultSink, index: int, unit: Unit, record: UnitRecord, rows: list,
                 twins: dict[str, list[tuple[int, Unit]]], fail_fast: bool) -> bool:
    """Store a leader's result, then its twins' (unless ``fail_fast`` stops at a failure);
    ``True`` when the leader is ok."""
    ok = sink.save(index, unit, record, rows)
    if ok or not fail_fast:
        for twin_index, twin in twins.pop(unit.key, []):
            _reuse(sink, twin_index, twin, record)
    return ok


def _reuse(sink: ResultSink, index: int, unit: Unit, record: UnitRecord) -> None:
    """A unit whose key another variant just computed: skipped when that was ok, failed
    with the same error otherwise (as the in-process executor would find them)."""
    if record.status == "ok":
        sink.skip(index, unit)
    else:
        sink.start(index, unit)
        sink.save(index, unit, replace(record, variant=unit.variant.name), [])


# -- rebuilding the experiment elsewhere -------------------------------------------------
@dataclass(frozen=True)
class ExperimentSource:
    """What a worker needs to rebuild the experiment: plain strings only (hashable, so a
    worker keeps one rebuilt experiment per source)."""

    text: str
    path: str
    base_dir: str
    extra_plugins: tuple[str, ...] = ()
    device: str | None = None
    plugin_paths: tuple[tuple[str, str], ...] = ()  # plugin -> file to import it from
    defer: bool = False  # a tuned sweep's test splits are scored at the chosen settings
    tested: tuple[tuple[str, int], ...] = ()  # ... of these (variant, seed) pairs

    @classmethod
    def of(cls, experiment: Experiment, extra_plugins: Sequence[str] = (),
           device: str | None = None, defer: bool = False,
           tested: Collection[tuple[str, int]] = ()) -> ExperimentSource:
        """The source of ``experiment`` as planned with ``defer`` and ``tested``
        (:func:`~variantlab.sweep.units.plan_units`)."""
        path = getattr(experiment, "path", None)
        return cls(experiment.source_text, str(path) if path else "<string>",
                   str(experiment.base_dir), tuple(extra_plugins), device, defer=defer,
                   tested=tuple(sorted(tested)))

    def load(self, device: str | None = None) -> tuple[Experiment, dict[str, Unit]]:
        """The experiment and its units by key, as :func:`plan_units` gives them with
        ``device`` (default: the run's ``--device``)."""
        from ..config.experiment import experiment_from_text

        exp = experiment_from_text(self.text, self.path, base_dir=self.base_dir,
                                   extra_plugins=self.extra_plugins, max_variants=None,
                                   plugin_paths=dict(self.plugin_paths))
        return exp, {u.key: u for u in plan_units(exp, device or self.device, defer=self.defer,
                                                  tested=self.tested)}


_LOADED: dict[tuple[ExperimentSource, str | None], tuple[Experiment, dict[str, Unit]]] = {}


def rebuilt(source: ExperimentSource, device: str | None = None
            ) -> tuple[Experiment, dict[str, Unit]]:
    """``source``'s experiment and its units by key, rebuilt in this (worker) process on
    first use and kept (one experiment per process: a new run's replaces the last); an
    experiment that cannot be rebuilt raises, and is tried again on the next call."""
    if (source, device) not in _LOADED:
        try:
            loaded = source.load(device)
        except (Exception, SystemExit) as exc:  # a plugin that exits is an error here too
            messages = getattr(exc, "messages", None) or [str(exc)]
            raise RuntimeError("the worker could not rebuild the experiment: "
                               + "; ".join(map(str, messages))) from None
        if _LOADED and next(iter(_LOADED))[0] != source:
            _LOADED.clear()
        _LOADED[(source, device)] = loaded
    return _LOADED[(source, device)]


def compute(source: ExperimentSource, key: str, probe_fn: Callable[..., list],
            device: str | None = None) -> tuple[UnitRecord, list]:
    """Run the unit ``key`` of ``source`` in this (worker) process, rebuilding the
    experiment on first use; an experiment that cannot be rebuilt or lacks the unit raises.
    ``device``: the unit's device as the driver resolved it (``auto`` is the driver's
    machine's answer, which another machine may not share), else the run's ``--device``."""
    experiment, units = rebuilt(source, device)
    unit = units.get(key)
    if unit is None:
        raise LookupError(f"unit {key[:12]} is not in the experiment as the worker rebuilt it "
                          "(did the YAML, a plugin, the data or variantlab itself change "
                          "during the run, or differ on the worker's machine?)")
    return run_unit(unit, experiment, probe_fn)
