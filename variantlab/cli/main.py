"""The ``variantlab`` command: run, validate and report here; describe, plugins, schema and
families in :mod:`variantlab.cli.info`; what they share in :mod:`variantlab.cli.base`.

The library computes; this module only formats. Exit codes: 0 ok, 1 a unit failed, or a
report part failed (the report is written, that part a notice in it),
2 bad input (the messages are printed, never a traceback), 3 the results or the report could
not be written (a full disk, a quota; what was stored is intact), 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from ..errors import SpecError
from ..version import __version__
from .base import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_WRITE,
    bad_input_exits,
    max_variants_option,
    plugin_option,
)
from .export import export_cmd, export_mlflow_cmd, export_results_cmd
from .findings import findings_cmd
from .fmt import ProgressReporter, consoles, print_summary
from .info import describe, families_cmd, plugins_cmd, schema_cmd

if TYPE_CHECKING:
    from ..config.experiment import Experiment
    from ..plugin.registry import Registry


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="variantlab")
def main() -> None:
    """variantlab: build transformer variants from plugins, measure them, compare them."""
    _no_final_collection()


def _no_final_collection() -> None:
    """Once per process: at exit, move every object to the garbage collector's permanent
    generation (``gc.freeze``), so the interpreter's last collection does not walk them
    all. With torch imported that walk is about 0.3 s of CPU (a fifth of ``import torch``)
    spent after the command is done; what it would free, the process's end frees. Files
    are closed by then (every write is in a ``with`` block; stdout and stderr are flushed
    by the interpreter); only ``__del__`` of objects in reference cycles is skipped."""
    import atexit
    import gc

    if not getattr(_no_final_collection, "registered", False):
        _no_final_collection.registered = True  # type: ignore[attr-defined]
        atexit.register(gc.freeze)


# -- run ---------------------------------------------------------------------------------
@main.command()
@click.argument("experiment", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(), default="runs", show_default=True,
              help="Folder of run folders; results go to OUT/<experiment name>/.")
@click.option("--only", multiple=True, metavar="VARIANT",
              help="Run only this variant (repeatable); stored results of others are kept.")
@click.option("--device", default=None, help="Override every probe's device (cpu, cuda, ...).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first unit that fails.")
@click.option("--no-report", is_flag=True, help="Do not write the report at the end.")
@click.option("--workers", type=int, default=None, metavar="N",
              help="Processes that compute the units. 1 (the default): all in this process. "
                   "N > 1: params, gradients and training units run in N worker "
                   "processes with one torch thread each; timing units still run in "
                   "this process, one at a time, after the pool has finished (concurrent work "
                   "would distort timings). With --executor ray: the CPUs of the local Ray "
                   "instance. Results are the same either way.")
@click.option("--threads", type=int, default=None, metavar="N",
              help="Torch threads per process (default: VARIANTLAB_THREADS or OMP_NUM_THREADS "
                   "when set, else the cores the load leaves free at the start, one per "
                   "process with --workers N > 1). See docs/distributed.md.")
@click.option("--executor", default=None, metavar="NAME",
              help="What computes the units: inprocess, pool, ray or a plugin's executor "
                   "(default: inprocess, or pool with --workers N > 1). See docs/distributed.md.")
@click.option("--address", default=None, metavar="ADDR",
              help="--executor ray: the Ray cluster to run on (HOST:PORT as `ray start --head` "
                   "prints it, ray://HOST:PORT or auto); without it a local Ray instance.")
@click.option("--retries", type=int, default=None, metavar="N",
              help="--executor ray: times a unit whose worker process or node died is tried "
                   "again before it is stored failed (default 2).")
@click.option("--ray-max-upload", "max_upload", type=float, default=None, metavar="MB",
              help="--executor ray: the most it may ship to the workers (plugin files and the "
                   "data files data.path matches), in MB (10^6 bytes; default 100); a larger "
                   "payload is refused before Ray starts.")
@click.option("--checkpoint-dir", "checkpoint_dir", default=None, metavar="DIR",
              help="--executor ray: a folder every worker can write (shared storage) for "
                   "mid-training checkpoints; without it Ray units are not checkpointed and "
                   "a unit whose worker died starts again. Other executors write them in the "
                   "run folder.")
@click.option("--executor-option", "executor_options", multiple=True, metavar="KEY=VALUE",
              help="Another option of the executor (a plugin's), VALUE read as YAML; repeatable.")
@click.option("--extend-edges", is_flag=True,
              help="While a compared variant's best value of a tuned axis on a log or linear "
                   "grid sits at an edge, run one more value beyond it (the grid's spacing), "
                   "up to 3 times per edge; as `extend: true` on every such axis. See "
                   "docs/fair-comparisons.md.")
@click.option("--test-every-setting", "test_every", is_flag=True,
              help="In a tuned sweep, score the test split of every training unit; by "
                   "default only each group's chosen setting is scored (the report uses no "
                   "other), once the group is complete. See docs/fair-comparisons.md.")
@click.option("--rerun", is_flag=False, flag_value="all", default=None, metavar="[PROBE]",
              help="Compute again units stored already: all of them, or only PROBE's "
                   "(e.g. --rerun gradients). Bare --rerun goes after EXPERIMENT.")
@max_variants_option
@plugin_option
@bad_input_exits
def run(experiment: str, out: str, only: Sequence[str], device: str | None, fail_fast: bool,
        no_report: bool, workers: int | None, threads: int | None, executor: str | None,
        address: str | None,
        retries: int | None, max_upload: float | None, checkpoint_dir: str | None,
        executor_options: Sequence[str], rerun: str | None, extend_edges: bool,
        test_every: bool, max_variants: int, plugins: Sequence[str]) -> None:
    """Run every unit of EXPERIMENT not stored yet; write the report.

    Only this process writes the store, one transaction per unit, whatever computes the
    units (--executor, --workers); a second run on the same run folder refuses to start
    while this one writes.
    """
    if executor == "pool" or (executor is None and (workers or 1) > 1):
        from ..executors.starting import start_server

        start_server()  # the workers' torch is imported while this process imports its own
    from ..config.experiment import load_experiment
    from ..executors.base import command_line_options, make_executor
    from ..executors.runner import pool_work_pending
    from ..executors.threads import choose_threads

    stdout, err = consoles()
    _check_environment()
    if workers is not None and workers < 1:
        raise SpecError.at(("--workers",), f"{workers} is not a number of processes; use 1 "
                                           "(everything in this process, the default) or more")
    choose_threads(workers or 1, threads)  # a bad --threads or VARIANTLAB_THREADS: exit 2 now
    options = command_line_options(workers=workers, address=address, retries=retries,
                                   max_upload=max_upload, checkpoint_dir=checkpoint_dir,
                                   pairs=executor_options)
    exp = load_experiment(experiment, extra_plugins=plugins, max_variants=max_variants)
    runner_ = make_executor(exp.registry, executor, options)  # before any check that computes
    _check_device_option(device, runner_.runs_here)
    from ..executors.base import Executor, ExperimentSource

    defer = runner_.feeds and not test_every  # the test split at the chosen settings only
    try:  # only an executor with something to start looks at the store first
        if (type(runner_).warm is not Executor.warm
                and pool_work_pending(exp, out, only, device, rerun, defer)):
            # the workers start while the checks below run; one that refuses closes them
            runner_.warm(ExperimentSource.of(exp, plugins, device, defer=defer), threads)
    except Exception:  # noqa: BLE001 - a bad --only or --rerun, data that cannot be read:
        pass  # the checks below say what is wrong, where, before anything runs
    try:
        _run_checked(stdout, err, exp, runner_, experiment, out, only, device, fail_fast,
                     no_report, threads, rerun, extend_edges, plugins, defer)
    finally:
        runner_.close()


def _run_checked(stdout: Any, err: Any, exp: Experiment, runner_: Any, experiment: str,
                 out: str, only: Sequence[str], device: str | None, fail_fast: bool,
                 no_report: bool, threads: int | None, rerun: str | None, extend_edges: bool,
                 plugins: Sequence[str], defer: bool = True) -> None:
    """``run`` once the experiment is loaded and its executor made (and warmed)."""
    from ..executors.runner import check_rerun, plan_units, run_experiment, select_variants

    try:
        selected = select_variants(exp, only)
    except ValueError as exc:
        raise SpecError.at(("--only",), str(exc).removeprefix("--only: ")) from None
    try:
        check_rerun(exp, rerun)
    except ValueError as exc:
        raise SpecError.at(("--rerun",), str(exc).removeprefix("--rerun: ")) from None
    _print_checks(err, exp, device, selected, runner_.runs_here)  # before the run folder exists
    for v in exp.variants:
        for w in v.warnings:
            err.print(f"warning: {escape(v.name)}: {escape(w)}", soft_wrap=True)
    n_units = sum(u.variant.name in selected
                  for u in plan_units(exp, device, defer=defer))
    where = f", {runner_.describe()}" if runner_.describe() else ""
    stdout.print(f"{escape(exp.name)}: {len(selected)} variant(s), {len(exp.seeds)} seed(s), "
                 f"{n_units} unit(s){where}")
    import warnings

    from ..model.build import VariantWarning

    warnings.filterwarnings("ignore", category=VariantWarning)  # printed above, once
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` stops as cleanly as Ctrl-C
    extend = exp.extensions(extend_edges)
    if extend_edges and not extend:
        err.print("warning: --extend-edges: no tuned axis on a log or linear grid to extend",
                  soft_wrap=True)
    if extend and only:
        err.print("warning: no edge extension with --only (the added values would not run); "
                  "run without --only to extend", soft_wrap=True)
        extend = {}
    rounds: list[Experiment] = []
    ahead = _import_report_ahead() if runner_.elsewhere and not no_report else None
    try:
        with ProgressReporter(stdout) as report_progress:
            def run_once(e: Experiment, grow: Any = None) -> Any:
                again = rerun if not rounds else None  # an extension round computes only new units
                rounds.append(e)
                return run_experiment(e, out, only=only, device=device, fail_fast=fail_fast,
                                      progress=report_progress, executor=runner_,
                                      extra_plugins=plugins, rerun=again, threads=threads,
                                      grow=grow)

            if not extend:
                chooser = _chooser(exp, out, plugins) if defer else None
                summary = run_once(exp, chooser)
                if chooser is not None and only and not summary.interrupted:
                    _say_untested(err, [v for v in exp.variants if v.name in selected],
                                  chooser.settled)
            elif runner_.feeds:  # each group's extension as soon as its grid is stored
                summary = _run_growing(stdout, err, exp, run_once, extend, tuple(plugins), out,
                                       defer)
            else:
                summary = _run_extended(stdout, err, exp, run_once, extend, tuple(plugins))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_summary(stdout, err, summary)
    code = summary.exit_code
    if ahead is not None:
        ahead.join()
    if not no_report and not summary.interrupted and summary.write_error is None:
        reported = _write_report(stdout, err, [summary.run_dir], summary.run_dir / "report", None,
                                 exp.registry)
        code = max(code, reported if reported == EXIT_WRITE else min(reported, EXIT_FAILED))
    sys.exit(code)


def _say_untested(err: Any, selected: Sequence[Any], settled: set[str]) -> None:
    """After a deferred run with ``--only``: the selected variants whose tuned group is
    not complete in the store, so that no test split was scored for it."""
    waiting = [v.name for v in selected if v.name not in settled]
    if waiting:
        shown = ", ".join(escape(n) for n in waiting[:3]) + (", ..." if len(waiting) > 3 else "")
        err.print(f"note: --only: {len(waiting)} variant(s) ({shown}) belong to tuned groups "
                  "with settings not stored yet, and a group's test split is scored at its "
                  "chosen setting once all of them are; run without --only to score it (the "
                  "stored units are not computed again)", soft_wrap=True)


def _import_report_ahead() -> threading.Thread:
    """Import the report's modules in a thread while other processes compute the units
    (about 1 s that the report would otherwise add at the end, with one core idle); an
    import that fails is left to the report, which says why."""

    def load() -> None:
        try:
            from ..report import plots, write_report  # noqa: F401
        except BaseException:  # noqa: BLE001, S110 - said by the report itself
            pass

    thread = threading.Thread(target=load, name="variantlab-report-import", daemon=True)
    thread.start()
    return thread


def _run_growing(stdout: Any, err: Any, exp: Experiment, run_once: Any,
                 extend: dict[str, int], plugins: tuple[str, ...], out: str,
                 defer: bool = True) -> Any:
    """The run with edge extension inside it (:class:`variantlab.report.fair.extension.EdgeFeed`):
    each added value is printed as it is added."""
    from ..executors.runner import run_dir_for
    from ..report.fair.extension import EdgeFeed

    def said(number: int, added: list) -> None:
        stdout.print("edge extension: "
                     + "; ".join(escape(f"{e.group}: {e.axis}={e.value}") for e in added),
                     soft_wrap=True)

    feed = EdgeFeed(exp, run_dir_for(exp, out), extend, plugins, said, defer=defer)
    summary = run_once(exp, feed)
    for line in feed.skipped:
        err.print(f"warning: edge extension: not added: {escape(line)}", soft_wrap=True)
    return summary


def _chooser(exp: Experiment, out: str, plugins: Sequence[str]) -> Any:
    """What makes each group's choice while the run goes on, so that a tuned sweep scores
    its test split at the chosen settings only (an
    :class:`~variantlab.report.fair.extension.EdgeFeed` with nothing to extend); None for
    an experiment without a tuned axis."""
    from ..executors.runner import run_dir_for
    from ..report.fair.extension import EdgeFeed
    from ..sweep.units import defers_test

    return EdgeFeed(exp, run_dir_for(exp, out), {}, plugins, defer=True) \
        if defers_test(exp) else None


def _run_extended(stdout: Any, err: Any, exp: Experiment, run_once: Any,
                  extend: dict[str, int], plugins: tuple[str, ...]) -> Any:
    """The run with edge extension (:mod:`variantlab.report.fair.extension`): each round's
    added values are printed; the summary counts every round's computed units."""
    from ..report.fair.extension import run_extended

    def said(number: int, added: list) -> None:
        stdout.print(f"edge extension, round {number}: "
                     + "; ".join(escape(f"{e.group}: {e.axis}={e.value}") for e in added),
                     soft_wrap=True)

    done = run_extended(exp, run_once, extend, plugins, said)
    for line in done.skipped:
        err.print(f"warning: edge extension: not added: {escape(line)}", soft_wrap=True)
    summary = done.summaries[-1]
    notes = [n for s in done.summaries for n in s.warnings]
    summary.warnings = list(dict.fromkeys(notes))
    earlier = sum(s.done for s in done.summaries[:-1])
    summary.done += earlier
    summary.skipped = max(0, summary.skipped - earlier)
    return summary


def _check_environment() -> None:
    """The settings read from the environment while units run (the checkpoint triggers),
    checked before anything runs."""
    from ..probes.checkpoint import environment_problem

    problem = environment_problem()
    if problem is not None:
        raise SpecError.at((problem[0],), problem[1])


def _valid_device(device: str) -> bool:
    import re

    return re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", device) is not None


def _check_device_option(device: str | None, here: bool = True) -> None:
    """``--device``: a device name, and one this machine has (``here``: the units run on
    this machine)."""
    from ..sweep.preflight import device_problem

    if device is None:
        return
    if not _valid_device(device):
        raise SpecError.at(("--device",), f"{device!r} is not a device; use cpu, cuda, cuda:N, "
                                          "mps or auto")
    problem = device_problem(device) if here else None
    if problem:
        raise SpecError.at(("--device",), problem)


def _print_checks(err: Any, exp: Experiment, device: str | None,
                  only: set[str] | None = None, here: bool = True) -> None:
    """Devices, data and the size guard (:func:`variantlab.sweep.preflight.preflight`); warnings."""
    from ..config.yamlio import YamlDoc
    from ..sweep.preflight import preflight

    doc = exp.doc if exp.doc is not None else YamlDoc({})  # built in Python: no positions
    for line in preflight(exp, doc, device, only=only, here=here):
        err.print(f"warning: data: {escape(line)}", soft_wrap=True)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _write_report(stdout: Any, err: Any, runs: Sequence[Path], out_dir: Path,
                  baseline: str | None, registry: Registry) -> int:
    from ..report import write_report

    try:
        files = write_report(list(runs), Path(out_dir), baseline=baseline, registry=registry)
    except ValueError as exc:  # e.g. an unknown --baseline: bad input
        err.print(f"report: {escape(str(exc))}", soft_wrap=True)
        return EXIT_INPUT
    except OSError as exc:  # the report folder cannot be written: bad --out, or a full disk
        from ..store.store import write_problem

        where = exc.filename or out_dir
        problem = write_problem(exc)
        if problem is not None:
            err.print(f"report: cannot write {escape(str(where))}: {escape(problem)}; no report "
                      "file was written or changed (an earlier report there is left whole). "
                      "Free some space or choose another --out", soft_wrap=True)
            return EXIT_WRITE
        err.print(f"report: cannot write {escape(str(where))}: {escape(exc.strerror or str(exc))}"
                  "; choose another --out", soft_wrap=True)
        return EXIT_INPUT
    except Exception as exc:  # the run is stored; say why the report is missing
        err.print(f"report failed: {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True)
        return EXIT_FAILED
    for attr in ("markdown", "html", "csv", "verdicts", "seeds", "tuned", "by_size",
                 "by_condition"):
        path = getattr(files, attr, None)
        if path is not None:
            stdout.print(f"report: {path}")
    if files.failed:  # the report is written, each failed part a notice in it
        parts = "; ".join(f.notice() for f in files.failed)
        err.print(f"report: {len(files.failed)} part(s) failed and show a notice in the "
                  f"report: {escape(parts)}", soft_wrap=True)
        return EXIT_FAILED
    return EXIT_OK


# -- validate ----------------------------------------------------------------------------
@main.command()
@click.argument("experiment", type=click.Path(dir_okay=False))
@click.option("--device", default=None, help="Check as if run with this --device.")
@max_variants_option
@plugin_option
@bad_input_exits
def validate(experiment: str, device: str | None, max_variants: int,
             plugins: Sequence[str]) -> None:
    """Check EXPERIMENT and print its expanded variants (nothing is computed).

    Checks everything `run` checks before computing: the file, every variant, the devices,
    the data and whether each variant fits in the memory of its probes' devices."""
    from ..config.experiment import load_experiment

    stdout, err = consoles()
    _check_environment()
    exp = load_experiment(experiment, extra_plugins=plugins, max_variants=max_variants)
    _check_device_option(device)
    _print_checks(err, exp, device)
    stdout.print(f"{escape(exp.name)}: {len(exp.variants)} variant(s)")
    table = Table()
    for col in ("#", "variant", "label", "family", "warnings"):
        table.add_column(col, overflow="fold")
    for i, v in enumerate(exp.variants):
        name = v.name + (" (baseline)" if v.name == exp.baseline else "")
        table.add_row(str(i), escape(name), escape(v.label), escape(v.spec.family),
                      escape("; ".join(v.warnings)))
    stdout.print(table)
    if exp.spec.variants and not exp.spec.grid:
        stdout.print("base: the model under `model:` as written, measured as the first variant "
                     "(`variants:` without a `grid` adds it)", soft_wrap=True)
    roles = exp.roles
    if roles:  # compared variants are compared within each condition, each at its best tuned
        from ..config.metrics import headline
        from ..config.roles import role_lines

        stdout.print("axis roles (compared: the variants the question is about; tuned: each "
                     "compared variant at its own best; condition: compared only within one):",
                     soft_wrap=True)
        for line in role_lines(roles, exp.extensions(), exp.partial_axes):
            stdout.print(f"  {escape(line)}", soft_wrap=True)
        head = headline(exp.spec.compare_on, exp.registry)
        stdout.print(f"compare_on: {head.name} ({head.direction} is better; chosen on "
                     f"{head.val}, reported on {head.test})", soft_wrap=True)
    probes = ", ".join(exp.measure.probes()) or "(none)"
    n_units = len(exp.variants) * len(exp.seeds) * len(exp.measure.probes())
    stdout.print(f"seeds: {list(exp.seeds)}  probes: {probes}  units: {n_units}")
    from ..model.kernels import kernel_line

    line = kernel_line(exp.spec.kernels, [v.spec for v in exp.variants],
                       [s for v in exp.variants for s in exp.probes_of(v).values()])
    stdout.print(escape(line), soft_wrap=True)
    if exp.base_note:
        stdout.print(f"note: {escape(exp.base_note)}", soft_wrap=True)
    stdout.print("ok")


# -- report ------------------------------------------------------------------------------
@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Where to write the report (default: RUN/report for the first RUN).")
@click.option("--baseline", default=None, help="Variant the report compares against.")
@plugin_option
@bad_input_exits
def report(runs: Sequence[str], out: str | None, baseline: str | None,
           plugins: Sequence[str]) -> None:
    """Write report.md, report.html and CSV tables from one or more runs.

    Each RUN is a run folder, its results.sqlite, a results export (results.json.gz of
    `variantlab export-results`, or a report folder holding one), or a folder of run
    folders (the --out of `run`: every run in it). A run given twice counts once; variants
    of several runs that share a name are told apart by their run (RUN/variant).
    """
    from ..store.runs import find_runs

    stdout, err = consoles()
    from ..plugin.registry import build_registry

    # the built-in probes' and --plugin probes' report views (other probes: a generic
    # table); deferred: the components (and torch) load only if a part asks for them
    registry = build_registry(extra=plugins, base_dir=Path.cwd(), defer=True)
    refs = find_runs(runs)  # every path checked before anything is written
    first = Path(runs[0])
    out_dir = Path(out) if out else (first.parent if first.is_file() else first) / "report"
    from ..sweep.runfolder import blocker

    found = blocker(out_dir)
    if found is not None:
        path, what, fix = found
        raise SpecError.at(("--out",), f"{out_dir}: {path} {what}; choose another --out for "
                           f"the report or {fix}")
    sys.exit(_write_report(stdout, err, [r.store for r in refs], out_dir, baseline, registry))


main.add_command(describe)
main.add_command(plugins_cmd)
main.add_command(schema_cmd)
main.add_command(families_cmd)
main.add_command(export_cmd)
main.add_command(export_mlflow_cmd)
main.add_command(export_results_cmd)
main.add_command(findings_cmd)


