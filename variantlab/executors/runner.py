"""Experiment -> units -> results store: resume, failure isolation, choice of executor.

Units and their keys are planned in :mod:`variantlab.sweep.units`. A rerun skips units stored
``ok`` (unless ``rerun`` names them), retries ``failed`` ones and computes new ones. An
executor computes them (:mod:`variantlab.executors`: in this process, a pool of worker
processes, Ray tasks, or a plugin's), looked up by name in the experiment's registry, each
unit with :func:`variantlab.executors.unit.run_unit` and the probe runner
:func:`variantlab.probes.run_probe`; every executor reports to one
:class:`variantlab.executors.unit.ResultSink`, the only writer of the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..probes import checkpoint, run_probe
from ..store.contract import RunMeta
from ..store.store import STORE_FILE, Store, StoreWriteError
from ..sweep.runfolder import open_run
from ..sweep.units import TEST, Unit, plain, plan_units
from ..version import __version__
from . import hardware
from .base import Executor, RunContext, make_executor
from .threads import choose_threads, torch_threads
from .unit import ResultSink, RunSummary, UnitEvent

if TYPE_CHECKING:
    from ..config.experiment import Experiment


def run_dir_for(experiment: Experiment, out: str | Path = "runs") -> Path:
    return Path(out) / experiment.name


def experiment_meta(experiment: Experiment) -> RunMeta:
    """What the store keeps about the experiment as run now."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return RunMeta(
        experiment=experiment.name,
        description=experiment.description or "",
        yaml=experiment.source_text or "",
        created=now,
        updated=now,
        experiment_file=experiment_file(experiment) or "",
        variantlab_version=__version__,
        torch_version=torch.__version__,
        seeds=list(experiment.seeds),
        baseline=experiment.baseline or "",
        data=plain(experiment.data) or {},
        measure=plain(experiment.measure) or {},
        # the grid's axes, so that the report pairs variants by them (effects)
        grid=plain(dict(getattr(getattr(experiment, "spec", None), "grid", None) or {})),
        compare_on=str(getattr(getattr(experiment, "spec", None), "compare_on", "") or ""),
        roles=dict(getattr(experiment, "roles", None) or {}) or None,
    )


def _variant_rows(variants: Iterable[Any]) -> list[dict[str, Any]]:
    return [
        {"name": v.name, "label": v.label, "spec": v.spec.to_data(),
         "overrides": dict(v.overrides), "warnings": list(v.warnings)}
        for v in variants
    ]


def select_variants(experiment: Experiment, only: Sequence[str] | None) -> set[str]:
    """Names to run; ``ValueError`` naming the choices for a name that is not there."""
    names = [v.name for v in experiment.variants]
    if not only:
        return set(names)
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(
            f"--only: no variant named {', '.join(map(repr, unknown))}; "
            f"the experiment has: {', '.join(names)}"
        )
    return set(only)


def run_experiment(
    experiment: Experiment,
    out: str | Path = "runs",
    *,
    only: Sequence[str] | None = None,
    device: str | None = None,
    fail_fast: bool = False,
    probe_fn: Callable[..., list] = run_probe,
    progress: Callable[[UnitEvent], None] | None = None,
    workers: int = 1,
    extra_plugins: Sequence[str] = (),
    rerun: str | None = None,
    executor: str | Executor | None = None,
    executor_options: Mapping[str, Any] | None = None,
    threads: int | None = None,
    grow: Callable[[Unit | None], Experiment | None] | None = None,
) -> RunSummary:
    """Run every unit not yet stored ok; store each with its rows or its error.

    ``only`` restricts the run to some variants (the store keeps the others' results);
    ``device`` overrides the probes' device settings; ``rerun`` (``"all"`` or a probe name)
    computes those units again although they are stored. Ctrl-C stops after storing the
    finished units; the summary says ``interrupted``.

    ``executor``: a registered executor's name (the experiment's registry: built-ins and
    plugins) made from ``executor_options``, or an executor already made
    (:func:`variantlab.executors.base.make_executor`); by default ``inprocess`` for
    ``workers=1`` and ``pool`` (``workers`` worker processes, which rebuild the experiment
    from its YAML text with ``extra_plugins``; timing units run here after the pool) for
    more. Whichever computes, only this process writes the store. An unknown executor or
    options it refuses raise :class:`~variantlab.errors.SpecError`, and so does whatever the
    executor's ``prepare`` finds (an unreachable Ray cluster, say), before anything exists.

    A write the store refuses (a full disk, a quota, the file made read-only) stops the
    run: the units being computed are dropped, those stored stay intact, and the summary's
    ``write_error`` says why (exit code 3); a rerun computes only what is missing.

    Before computing anything the run folder is made and locked for this process, and its
    store opened (:func:`variantlab.sweep.runfolder.open_run`): a folder another run is writing,
    an unusable ``out`` or store raise :class:`~variantlab.store.store.StoreError`.
    """
    if workers < 1:
        raise ValueError(f"workers must be 1 or more, got {workers}")
    selected = select_variants(experiment, only)
    check_rerun(experiment, rerun)
    if not isinstance(executor, Executor):
        options = {**({"workers": workers} if workers > 1 else {}), **(executor_options or {})}
        executor = make_executor(experiment.registry, executor, options)
    run_dir = run_dir_for(experiment, out)
    # a feed that makes each group's choice (EdgeFeed(defer=True)) scores a tuned sweep's
    # test split at the chosen settings only
    defer = executor.feeds and getattr(grow, "defer", False) is True
    plan = plan_units(experiment, device, defer=defer)
    todo = [(i, u) for i, u in enumerate(u for u in plan if u.variant.name in selected)]
    again = {u.key for _, u in todo if rerun in ("all", u.probe)}
    summary = RunSummary(run_dir=run_dir, store=run_dir / STORE_FILE, total=len(todo))
    chosen = choose_threads(1, threads)  # this process's share; the pool asks for its own
    context = RunContext(device, fail_fast, probe_fn, tuple(extra_plugins), run_dir, threads,
                         defer=defer)
    feeding = grow is not None and executor.feeds
    try:
        executor.prepare(experiment, todo, context)
        with open_run(run_dir, experiment_file(experiment)) as store:
            # a resumed run's feed re-adds the variants and units it added before: until
            # its first answer the store keeps them (Growing writes the exact tables then)
            store.write_experiment(
                experiment_meta(experiment),
                _variant_rows(experiment.variants),
                [(u.key, u.variant.name, u.seed, u.probe) for u in plan],
                keep_stored=feeding,
            )
            if executor.runs_here:
                elsewhere = other_machines(store.machines(),
                                           [u for _, u in todo if u.key not in again])
                summary.warnings += [elsewhere] if elsewhere else []
            sink = ResultSink(store, summary, progress or (lambda event: None), again)
            growing = None
            if grow is not None and feeding:
                growing = Growing(grow, experiment, store, summary, device, len(todo), plan,
                                  defer)
                context = replace(context, feed=growing)
            try:
                # every planned key, --only's others too: their checkpoints stay usable
                with checkpoint.directory(executor.checkpoint_dir(run_dir),
                                          keep={u.key for u in plan}), \
                        torch_threads(chosen.count):
                    executor.run(sink, todo, experiment, context)
                    if growing is not None:
                        if not growing.written:  # an executor that never asked its feed
                            growing.write()
                        growing.settle(sink)
            except KeyboardInterrupt:
                summary.interrupted = True
    except StoreWriteError as exc:  # a full disk: every unit stored so far is intact
        summary.write_error = str(exc)
    finally:
        executor.close()
    return summary


def other_machines(stored: Mapping[str, str], units: Sequence[Unit]) -> str:
    """The note for ``units`` stored already that another machine computed (``stored``:
    key -> machine, :meth:`Store.machines`): a run reuses them, so the report would pool
    two machines' numbers; empty when there are none."""
    counts: dict[str, int] = {}
    here = ""
    for unit in units:
        there = stored.get(unit.key)
        mine = hardware.machine(unit.device)
        if there is not None and there != mine:
            counts[there] = counts.get(there, 0) + 1
            here = mine
    if not counts:
        return ""
    them = "; ".join(f"{n} on {name}" for name, n in counts.items())
    return (f"{sum(counts.values())} unit(s) stored before were computed on another machine "
            f"({them}), and this one is {here}. The same code can give other low bits on "
            "another processor, and training can grow them: the report says which machines "
            "its numbers come from. To have every number from this machine, run again "
            "with --rerun all.")


def pool_work_pending(experiment: Experiment, out: str | Path = "runs",
                      only: Sequence[str] = (), device: str | None = None,
                      rerun: str | None = None, defer: bool = True) -> bool:
    """Whether a run would hand any unit to worker processes: a non-serial unit of the
    selected variants not stored ok yet, or one ``rerun`` asks for. Read only; a store it
    cannot read counts as pending (the run itself then says what is wrong)."""
    selected = select_variants(experiment, only)
    units = [u for u in plan_units(experiment, device, defer=defer)
             if u.variant.name in selected and not u.serial]
    if any(rerun in ("all", u.probe) for u in units):
        return True
    path = run_dir_for(experiment, out) / STORE_FILE
    if not units or not path.is_file():
        return bool(units)
    try:
        with Store(path, create=False) as store:
            statuses = store.statuses()
    except Exception:  # noqa: BLE001 - the run reports it
        return True
    return any(statuses.get(u.key) != "ok" for u in units)


class Growing:
    """A run's :class:`~variantlab.executors.base.Feed` while its experiment grows: the
    variants ``grow`` adds, and the test units of the (variant, seed) pairs in its
    ``tested`` (the chosen settings whose test split is scored now,
    :func:`variantlab.sweep.units.plan_units`), are written to the store (variants and plan)
    and their units indexed after those planned so far, counted in the summary's total. Its
    first answer writes the store's tables whatever it adds: the run wrote them keeping an
    earlier run's (``write_experiment(keep_stored=True)``)."""

    def __init__(self, grow: Callable[[Unit | None], Experiment | None], experiment: Experiment,
                 store: Any, summary: RunSummary, device: str | None, count: int,
                 plan: Sequence[Unit], defer: bool = True) -> None:
        self.grow, self.experiment, self.store, self.summary = grow, experiment, store, summary
        self.device, self.count, self.defer = device, count, defer
        self.tested: frozenset[tuple[str, int]] = frozenset()
        self.planned = {(u.variant.name, u.seed, u.probe) for u in plan}
        self.written = False  # the store holds the exact tables of self.experiment

    def __call__(self, unit: Unit | None) -> list[tuple[int, Unit]]:
        return self.apply(self.decide(unit))

    def decide(self, unit: Unit | None) -> tuple[Experiment | None, frozenset[tuple[str, int]]]:
        """What ``grow`` makes of ``unit`` being stored: the experiment with the variants it
        adds (None: none) and the (variant, seed) pairs to test so far. It reads the store
        with a connection of its own and writes nothing, so the pool runs it in a thread of
        its own (one call at a time) while the workers go on."""
        bigger = self.grow(unit)
        return bigger, frozenset(getattr(self.grow, "tested", ()))

    def apply(self, decision: tuple[Experiment | None, frozenset[tuple[str, int]]]
              ) -> list[tuple[int, Unit]]:
        """The units a decision (:meth:`decide`) adds, written to the store's plan and
        indexed after the others."""
        bigger, tested = decision
        if bigger is None and tested == self.tested and self.written:
            return []
        self.experiment = bigger if bigger is not None else self.experiment
        self.tested = tested
        plan = self.write()
        new = [u for u in plan if (u.variant.name, u.seed, u.probe) not in self.planned]
        self.planned |= {(u.variant.name, u.seed, u.probe) for u in new}
        out = list(enumerate(new, self.count))
        self.count += len(new)
        self.summary.total += len(new)
        return out

    def write(self) -> list[Unit]:
        """Write the experiment as it stands (its variants, and the plan with the test units
        of :attr:`tested`) to the store; its plan."""
        plan = plan_units(self.experiment, self.device, defer=self.defer, tested=self.tested)
        self.store.write_experiment(experiment_meta(self.experiment),
                                    _variant_rows(self.experiment.variants),
                                    [(u.key, u.variant.name, u.seed, u.probe) for u in plan])
        self.written = True
        return plan

    def settle(self, sink: ResultSink) -> None:
        """After the run: remove the final weights kept for test units
        (:func:`variantlab.probes.checkpoint.keep_weights`) that no unit of this run needs
        any more: those of the groups whose choice was made (``grow``'s ``settled``
        variants), except a chosen model whose test unit is not stored ok (a rerun scores
        it from them)."""
        settled = set(getattr(self.grow, "settled", ()))
        plan = plan_units(self.experiment, self.device, defer=self.defer, tested=self.tested)
        waiting = {u.settings.trained for u in plan
                   if u.probe == TEST and not sink.stored_ok(u)}
        for u in plan:
            if u.variant.name in settled and getattr(u.settings, "test_split", None) == \
                    "deferred" and u.key not in waiting:
                checkpoint.drop_weights(u.key)


def check_rerun(experiment: Experiment, rerun: str | None) -> None:
    """``ValueError`` naming the choices when ``rerun`` is neither ``all`` nor a probe of
    the experiment."""
    choices = ["all", *experiment.measure.probes()]
    if rerun is not None and rerun not in choices:
        raise ValueError(f"--rerun: {rerun!r} is not a probe of this experiment; "
                         f"use one of: {', '.join(choices)} (or --rerun alone for all)")


def experiment_file(experiment: Experiment) -> str | None:
    """The experiment file's resolved path, or ``None`` for an experiment from a string."""
    path = getattr(experiment, "path", None)
    return str(Path(path).resolve()) if path else None
