"""The warm mutant runner of scripts/mutation (docs/mutation.md, "Running it").

cosmic-ray still makes the mutants (its work DB) and applies each one
(``cosmic_ray.mutating.use_mutation`` writes the mutant to the copied checkout and puts the
original back); what changes is how the tests run. Instead of a fresh ``python -m pytest``
per mutant (most of its CPU time spent importing torch, pandas, pytest, pydantic ...), one
parent process imports those third-party modules once, never variantlab itself and never
runs a torch op, and ``os.fork()``s a child per mutant: the child imports variantlab from
disk (so the mutant is what runs), runs ``pytest.main`` and ``os._exit``s with its code.

The child runs only the tests that can see the mutant: a first child runs the mapped test
files under a line tracer limited to the module under test and records, per test, the lines
it executed (its own call, setup and teardown, and the setup of every fixture it uses). A
mutant is then run against the tests that executed one of its lines, fastest first, ``-x``;
against every mapped test when a line ran at import time (module and class bodies,
decorators, defaults) or outside any test; and against none when no test executed it: it
survives, marked "not covered".

Bytecode: the children never write bytecode (``sys.dont_write_bytecode``) and the module's
cached bytecode is deleted before every child, so a mutant of the same size written within
the same second as the original can never run as the cached original (cosmic-ray sets
PYTHONDONTWRITEBYTECODE for the same reason)."""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

OWN = ("variantlab", "variantlab_plugins", "tests", "conftest", "__main__", "__mp_main__")
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "--no-header", "-m", "not slow"]


# ---------------------------------------------------------------- in the forked children


class LineTracer:
    """pytest plugin: the lines of ``target`` each test executes (its setup, call and
    teardown), the lines each fixture's setup executes, and the tests' durations."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.key = "import"  # lines run outside any test: collection, imports, hooks
        self.lines: dict[str, set[int]] = defaultdict(set)
        self.uses: dict[str, list[str]] = {}
        self.durations: dict[str, float] = {}

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != self.target:
            return None
        self.local(frame, "line", arg)
        return self.local

    def local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            # a module or class body (no CO_OPTIMIZED: not a function) runs once, at import,
            # even when a test is the first to import the module: its lines (constants,
            # decorators, defaults) can change what every test sees
            key = self.key if frame.f_code.co_flags & inspect.CO_OPTIMIZED else "import"
            self.lines[key].add(frame.f_lineno)
        return self.local

    def start(self) -> None:
        import threading

        threading.settrace(self.trace)
        sys.settrace(self.trace)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        self.key, start = item.nodeid, time.perf_counter()
        defs = item._fixtureinfo.name2fixturedefs
        self.uses[item.nodeid] = sorted({fixture_key(d) for ds in defs.values() for d in ds})
        try:
            return (yield)
        finally:
            self.durations[item.nodeid] = time.perf_counter() - start
            self.key = "import"

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Any:
        before, self.key = self.key, "fixture " + fixture_key(fixturedef)
        try:
            return (yield)
        finally:
            self.key = before


def fixture_key(fixturedef: Any) -> str:
    return f"{fixturedef.baseid}::{fixturedef.argname}"


class Select:
    """pytest plugin: run only ``order``'s tests, in that order (every collected test when
    one of them is not collected, e.g. a mutant changed a parametrization)."""

    def __init__(self, order: list[str]) -> None:
        self.rank = {n: i for i, n in enumerate(order)}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: Any, items: list) -> None:
        chosen = [it for it in items if it.nodeid in self.rank]
        if len(chosen) < len(self.rank):
            return
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid not in self.rank])
        items[:] = sorted(chosen, key=lambda it: self.rank[it.nodeid])


def child(work: Path, args: list[str], plugins: list, log: Path, bytecode: bool,
          before: Any = None) -> None:
    """The forked child: run pytest in ``work`` and exit with its code (never returns)."""
    code = 3
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(work)
        sys.path.insert(0, str(work))
        sys.dont_write_bytecode = not bytecode
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
        if before is not None:
            before()
        code = int(pytest.main(args, plugins=plugins))
    except BaseException:  # noqa: B036  (whatever happens, the child must not return)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# ------------------------------------------------------------------------- in the parent


@dataclass
class Run:
    """One forked pytest run: its exit code (None: killed at the timeout), output, CPU."""

    code: int | None
    output: str
    cpu: float


def fork_pytest(work: Path, args: list[str], plugins: list, timeout: float,
                bytecode: bool = False, before: Any = None) -> Run:
    """Run ``pytest.main(args)`` in a forked child in ``work`` (calling ``before()`` first
    there); kill it (and anything it started) after ``timeout`` seconds."""
    with tempfile.NamedTemporaryFile(prefix="mutant-", suffix=".log", delete=False) as f:
        log = Path(f.name)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()  # its own process group, so a timeout kills everything it started
        child(work, args, plugins, log, bytecode, before)
    pidfd = os.pidfd_open(pid)
    ready: list = []
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:  # at the timeout, or when this process is interrupted (Ctrl-C)
        if not ready:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status, usage = os.wait4(pid, 0)
        os.close(pidfd)
    output = log.read_text(errors="replace")
    log.unlink()
    code = os.waitstatus_to_exitcode(status) if ready else None
    return Run(code, output, usage.ru_utime + usage.ru_stime)


def preload(names: list[str]) -> None:
    """Import the third-party modules the tests imported (in their order), so every forked
    child starts with them; a module that fails to import here is left to the child."""
    for name in names:
        if name.split(".")[0] not in OWN and name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (a side module the child may still import)
                pass


def third_party(work: Path) -> list[str]:
    """The modules now imported that come from outside the checkout ``work``."""
    out = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if where and name.split(".")[0] not in OWN and not where.startswith(str(work)):
            out.append(name)
    return out


def drop_bytecode(path: Path) -> None:
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink()


@dataclass
class Coverage:
    """Which mapped tests executed which lines of the module under test."""

    tests: dict[str, set[int]]  # test node id -> lines it executed
    imports: set[int]  # lines executed outside any test (import time, hooks)
    durations: dict[str, float]
    modules: list[str] = field(default_factory=list)  # third-party modules to preload

    def select(self, lines: set[int]) -> list[str] | None:
        """The tests to run for a mutant on ``lines``, fastest first; None: all of them."""
        if lines & self.imports:
            return None
        hit = [t for t, seen in self.tests.items() if lines & seen]
        return sorted(hit, key=lambda t: self.durations.get(t, 0.0))


def measure(work: Path, path: str, tests: list[str], timeout: float) -> tuple[Coverage, Run]:
    """Run the mapped ``tests`` once under the line tracer (in a forked child, writing
    bytecode for everything but the module under test); the coverage and the run."""
    target = str((work / path).resolve())
    with tempfile.NamedTemporaryFile(prefix="coverage-", suffix=".json", delete=False) as f:
        dump = Path(f.name)

    class Dump:
        def __init__(self, tracer: LineTracer) -> None:
            self.tracer = tracer

        def pytest_sessionfinish(self) -> None:
            sys.settrace(None)
            t = self.tracer
            dump.write_text(json.dumps({
                "lines": {k: sorted(v) for k, v in t.lines.items()}, "uses": t.uses,
                "durations": t.durations, "modules": third_party(work)}))

    tracer = LineTracer(target)
    run = fork_pytest(work, [*PYTEST_ARGS, *tests], [tracer, Dump(tracer)], timeout,
                      bytecode=True, before=tracer.start)
    drop_bytecode(work / path)
    data = json.loads(dump.read_text() or "{}") if dump.stat().st_size else {}
    dump.unlink()
    lines = {k: set(v) for k, v in data.get("lines", {}).items()}
    per_test = {}
    for test, used in data.get("uses", {}).items():
        seen = set(lines.get(test, ()))
        for key in used:
            seen |= lines.get("fixture " + key, set())
        per_test[test] = seen
    return Coverage(per_test, lines.get("import", set()), data.get("durations", {}),
                    data.get("modules", [])), run


def statement_lines(source: str) -> dict[int, set[int]]:
    """For each line of ``source``, the lines of the innermost statement (for a compound
    statement: its header with decorators) that contains it: the line tracer attributes an
    operator on a continuation line to the line its statement's code runs on."""
    spans: dict[int, range] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt | ast.excepthandler):
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            last = max(node.lineno, body[0].lineno - 1)
        else:
            last = node.end_lineno or node.lineno
        span = range(first, last + 1)
        for line in span:
            if line not in spans or len(span) < len(spans[line]):
                spans[line] = span
    return {line: set(span) for line, span in spans.items()}


def diff(before: str, after: str, path: Path) -> str:
    """The mutation's diff, as cosmic-ray writes it."""
    return "\n".join(["--- mutation diff ---", *difflib.unified_diff(
        before.split("\n"), after.split("\n"), fromfile=f"a/{path}", tofile=f"b/{path}",
        lineterm="")])


def run_mutants(work: Path, path: str, tests: list[str], items: list, coverage: Coverage,
                timeout: float, record: Any) -> list[dict]:
    """Apply each work item's mutation in ``work`` (cosmic-ray's ``use_mutation``), run its
    selected tests in a forked child, and ``record(job_id, WorkResult)``; one row per
    mutant (job, line, selected tests, verdict, CPU seconds)."""
    import cosmic_ray.plugins
    from cosmic_ray.mutating import use_mutation
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    module = work / path
    lines_of = statement_lines(module.read_text())
    rows = []
    for item in items:
        (mutation,) = item.mutations
        first, last = mutation.start_pos[0], mutation.end_pos[0]
        lines = set(range(first, last + 1)).union(*(lines_of.get(n, set())
                                                    for n in range(first, last + 1)))
        chosen = coverage.select(lines)
        row = {"job": item.job_id, "line": first, "operator": mutation.operator_name,
               "occurrence": mutation.occurrence,
               "tests": "all" if chosen is None else len(chosen)}
        began, cpu = time.time(), cpu_now()
        try:
            operator = cosmic_ray.plugins.get_operator(mutation.operator_name)()
            with use_mutation(work / mutation.module_path, operator,
                              mutation.occurrence) as (before, after):
                if after is None:  # the occurrence no longer exists: nothing to test
                    result = WorkResult(worker_outcome=WorkerOutcome.NO_TEST)
                elif chosen == []:
                    result = WorkResult(
                        output=f"not covered: no test of {' '.join(tests)} executes line "
                        f"{first}", diff=diff(before, after, mutation.module_path),
                        test_outcome=TestOutcome.SURVIVED, worker_outcome=WorkerOutcome.NORMAL)
                    row["not_covered"] = True
                else:
                    drop_bytecode(module)
                    plugins = [] if chosen is None else [Select(chosen)]
                    run = fork_pytest(work, [*PYTEST_ARGS, "-x", *tests], plugins, timeout)
                    outcome = TestOutcome.SURVIVED if run.code == 0 else TestOutcome.KILLED
                    result = WorkResult(output="timeout" if run.code is None else run.output,
                                        diff=diff(before, after, mutation.module_path),
                                        test_outcome=outcome,
                                        worker_outcome=WorkerOutcome.NORMAL)
        except Exception:  # noqa: BLE001  (as cosmic-ray: the mutant is incompetent)
            result = WorkResult(output=traceback.format_exc(),
                                test_outcome=TestOutcome.INCOMPETENT,
                                worker_outcome=WorkerOutcome.EXCEPTION)
        drop_bytecode(module)
        record(item.job_id, result)
        row["verdict"] = verdict(result)
        # this process (applying the mutant) and its child together
        row["cpu"], row["wall"] = round(cpu_now() - cpu, 3), round(time.time() - began, 3)
        rows.append(row)
    return rows


def verdict(result: Any) -> str:
    """killed / survived / skipped / incompetent, as scripts/mutation counts them."""
    from cosmic_ray.work_item import WorkerOutcome

    if result.worker_outcome == WorkerOutcome.SKIPPED:
        return "skipped"
    if result.worker_outcome != WorkerOutcome.NORMAL:
        return "incompetent"
    return "survived" if result.test_outcome == "survived" else "killed"


def cpu_now() -> float:
    """CPU seconds of this process and every child it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def compare(reference: dict, warm: dict) -> list[str]:
    """The verdicts of two scripts/mutation JSON reports (``--cold`` and warm) on the mutants
    both ran, mutant by mutant, and their CPU seconds per mutant: report lines."""
    def by_key(report: dict) -> dict:
        return {(m["line"], m["operator"], m["occurrence"]): m for m in report["mutants"]}

    ref, new = by_key(reference), by_key(warm)
    both = sorted(set(ref) & set(new))
    differ = [k for k in both if ref[k]["verdict"] != new[k]["verdict"]]
    lines = [f"{reference['module']}: {len(both)} mutants run by both, "
             f"{len(both) - len(differ)} same verdict, {len(differ)} different"]
    lines += [f"  line {k[0]} {k[1]} #{k[2]}: {ref[k]['verdict']} (reference) vs "
              f"{new[k]['verdict']} (warm, tests {new[k]['tests']})" for k in differ]
    for name, rows in (("reference", ref), ("warm", new)):
        cpu = sorted(rows[k].get("cpu", 0.0) for k in both)
        wall = sorted(rows[k].get("wall", 0.0) for k in both)
        if both:
            lines.append(f"  {name}: CPU s per mutant mean {sum(cpu) / len(cpu):.2f}, median "
                         f"{cpu[len(cpu) // 2]:.2f}; wall mean {sum(wall) / len(wall):.1f}")
    return lines
