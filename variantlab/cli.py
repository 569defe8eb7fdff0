"""The ``variantlab`` command: run, validate, describe, report, plugins.

The library computes; this module only formats. Exit codes: 0 ok, 1 a unit failed,
2 bad input (the messages are printed, never a traceback), 130 interrupted.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from . import __version__
from .clifmt import (
    ProgressReporter, consoles, module_tree, param_table, plugins_table, print_summary,
)
from .errors import PluginLoadError, SpecError, format_loc
from .registry import ALL_SLOTS

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def input_messages(exc: BaseException) -> list[str]:
    """One line per problem for InputError / SpecError / PluginLoadError / missing files."""
    messages = getattr(exc, "messages", None)
    if messages:
        return [str(m) for m in messages]
    if isinstance(exc, SpecError):
        return [f"{format_loc(i.loc)}: {i.message}" for i in exc.issues]
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return [f"{exc.filename}: no such file"]
    return [str(exc)]


def _input_error_types() -> tuple[type[BaseException], ...]:
    from .experiment import InputError

    return (SpecError, PluginLoadError, FileNotFoundError, InputError)


def bad_input_exits(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn bad input into its messages on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _input_error_types() as exc:
            _, err = consoles()
            for line in input_messages(exc):
                err.print(escape(line), soft_wrap=True)
            sys.exit(EXIT_INPUT)

    return wrapper


plugin_option = click.option(
    "--plugin", "plugins", multiple=True, metavar="MODULE_OR_FILE.py",
    help="Extra plugin module (import name or .py file); repeatable.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="variantlab")
def main() -> None:
    """variantlab: build transformer variants from plugins, measure them, compare them."""


# -- run ---------------------------------------------------------------------------------
@main.command()
@click.argument("experiment", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default="runs", show_default=True,
              help="Folder of run folders; results go to OUT/<experiment name>/.")
@click.option("--only", multiple=True, metavar="VARIANT",
              help="Run only this variant (repeatable); stored results of others are kept.")
@click.option("--device", default=None, help="Override every probe's device (cpu, cuda, ...).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first unit that fails.")
@click.option("--no-report", is_flag=True, help="Do not write the report at the end.")
@click.option("--workers", type=int, default=1, show_default=True, metavar="N",
              help="Processes that compute the units. 1: all in this process. N > 1: params, "
                   "gradients and training units run in N spawned worker processes with "
                   "cpu_count/N torch threads each; timing units still run in this process, "
                   "one at a time, after the pool has finished (concurrent work would "
                   "distort timings). Results are the same either way.")
@plugin_option
@bad_input_exits
def run(experiment: str, out: str, only: Sequence[str], device: str | None, fail_fast: bool,
        no_report: bool, workers: int, plugins: Sequence[str]) -> None:
    """Run every unit of EXPERIMENT not stored yet; write the report.

    Only this process writes the store, one transaction per unit, whatever --workers says.
    """
    from .experiment import load_experiment
    from .runner import plan_units, run_experiment, select_variants

    stdout, err = consoles()
    if workers < 1:
        raise SpecError.at(("--workers",), f"{workers} is not a number of processes; use 1 "
                                           "(everything in this process, the default) or more")
    exp = load_experiment(experiment, extra_plugins=plugins)
    if device is not None and not _valid_device(device):
        raise SpecError.at(("--device",), f"{device!r} is not a device; use cpu, cuda, cuda:N, "
                                          "mps or auto")
    try:
        selected = select_variants(exp, only)
    except ValueError as exc:
        raise SpecError.at(("--only",), str(exc).removeprefix("--only: ")) from None
    for v in exp.variants:
        for w in v.warnings:
            err.print(f"warning: {escape(v.name)}: {escape(w)}", soft_wrap=True)
    n_units = sum(u.variant.name in selected for u in plan_units(exp, device))
    pool = f", {workers} worker processes" if workers > 1 else ""
    stdout.print(f"{escape(exp.name)}: {len(selected)} variant(s), {len(exp.seeds)} seed(s), "
                 f"{n_units} unit(s){pool}")
    import warnings

    from .build import VariantWarning

    warnings.filterwarnings("ignore", category=VariantWarning)  # printed above, once
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` stops as cleanly as Ctrl-C
    try:
        with ProgressReporter(stdout) as report_progress:
            summary = run_experiment(exp, out, only=only, device=device, fail_fast=fail_fast,
                                     progress=report_progress, workers=workers,
                                     extra_plugins=plugins)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_summary(stdout, err, summary)
    code = summary.exit_code
    if not no_report and not summary.interrupted:
        reported = _write_report(stdout, err, [summary.run_dir], summary.run_dir / "report", None)
        code = max(code, min(reported, EXIT_FAILED))
    sys.exit(code)


def _valid_device(device: str) -> bool:
    import re

    return re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", device) is not None


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _write_report(stdout: Any, err: Any, runs: Sequence[Path], out_dir: Path,
                  baseline: str | None) -> int:
    from .report import write_report

    try:
        files = write_report(list(runs), Path(out_dir), baseline=baseline)
    except ValueError as exc:  # e.g. an unknown --baseline: bad input
        err.print(f"report: {escape(str(exc))}", soft_wrap=True)
        return EXIT_INPUT
    except OSError as exc:  # the report folder cannot be written: bad --out
        where = exc.filename or out_dir
        err.print(f"report: cannot write {escape(str(where))}: {escape(exc.strerror or str(exc))}"
                  "; choose another --out", soft_wrap=True)
        return EXIT_INPUT
    except Exception as exc:  # the run is stored; say why the report is missing
        err.print(f"report failed: {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True)
        return EXIT_FAILED
    for attr in ("markdown", "html", "csv"):
        path = getattr(files, attr, None)
        if path is not None:
            stdout.print(f"report: {path}")
    return EXIT_OK


# -- validate ----------------------------------------------------------------------------
@main.command()
@click.argument("experiment", type=click.Path(dir_okay=False))
@plugin_option
@bad_input_exits
def validate(experiment: str, plugins: Sequence[str]) -> None:
    """Check EXPERIMENT and print its expanded variants (nothing is computed)."""
    from .experiment import load_experiment

    stdout, _ = consoles()
    exp = load_experiment(experiment, extra_plugins=plugins)
    stdout.print(f"{escape(exp.name)}: {len(exp.variants)} variant(s)")
    table = Table()
    for col in ("#", "variant", "label", "family", "warnings"):
        table.add_column(col, overflow="fold")
    for i, v in enumerate(exp.variants):
        name = v.name + (" (baseline)" if v.name == exp.baseline else "")
        table.add_row(str(i), escape(name), escape(v.label), escape(v.spec.family),
                      escape("; ".join(v.warnings)))
    stdout.print(table)
    probes = ", ".join(exp.measure.probes()) or "(none)"
    n_units = len(exp.variants) * len(exp.seeds) * len(exp.measure.probes())
    stdout.print(f"seeds: {list(exp.seeds)}  probes: {probes}  units: {n_units}")
    stdout.print("ok")


# -- describe ----------------------------------------------------------------------------
@main.command()
@click.argument("path", type=click.Path(dir_okay=False))
@plugin_option
@bad_input_exits
def describe(path: str, plugins: Sequence[str]) -> None:
    """Print each variant's module tree and parameter breakdown (EXPERIMENT or bare model)."""
    import warnings

    import torch

    from .build import build_model
    from .experiment import load_variants
    from .probes.params import count_rows

    stdout, _ = consoles()
    variants, registry = load_variants(path, extra_plugins=plugins)
    for v in variants:
        title = escape(f"{v.name} ({v.label})")
        if stdout.is_terminal:
            stdout.rule(title, align="left")
        else:
            stdout.print(f"== {title} ==")
        for w in v.warnings:
            stdout.print(f"warning: {escape(w)}", soft_wrap=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            model = build_model(v.spec, registry)
        stdout.print(module_tree(model))
        stdout.print(param_table(count_rows(model)))


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

    Each RUN is a run folder, its results.sqlite, or a folder of run folders (the --out of
    `run`: every run in it). A run given twice counts once; variants of several runs that
    share a name are told apart by their run (RUN/variant).
    """
    from .runs import find_runs

    stdout, err = consoles()
    if plugins:
        from .registry import build_registry

        build_registry(extra=plugins, base_dir=Path.cwd())
    refs = find_runs(runs)  # every path checked before anything is written
    first = Path(runs[0])
    out_dir = Path(out) if out else (first.parent if first.is_file() else first) / "report"
    blocker = next((p for p in (out_dir, *out_dir.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise SpecError.at(("--out",), f"{out_dir}: {blocker} is a file, not a folder; "
                           "choose another --out for the report")
    sys.exit(_write_report(stdout, err, [r.store for r in refs], out_dir, baseline))


# -- plugins -----------------------------------------------------------------------------
@main.command("plugins")
@click.option("--slot", type=click.Choice(ALL_SLOTS), default=None)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@plugin_option
@bad_input_exits
def plugins_cmd(slot: str | None, as_json: bool, plugins: Sequence[str]) -> None:
    """List registered components with their parameters, and plugins that failed to load.

    Each kind shows what it is (its spec's docstring) and one line per parameter:
    ``name: type = default — description``.
    """
    from .plugininfo import failure_rows, plugin_rows
    from .registry import build_registry

    stdout, _ = consoles()
    registry = build_registry(extra=plugins, base_dir=Path.cwd())
    rows, failures = plugin_rows(registry, slot), failure_rows(registry)
    if as_json:
        click.echo(json.dumps({"components": rows, "failures": failures}, indent=2,
                              default=str))
        return

    stdout.print(plugins_table(rows))
    if failures:
        stdout.print("[bold]plugins that failed to load[/]")
        for f in failures:
            stdout.print(f"{escape(f['plugin'])} ({escape(f['source'])}): {escape(f['error'])}",
                         soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    main()
