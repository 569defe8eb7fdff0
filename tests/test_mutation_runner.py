"""scripts/mutation's warm runner end to end on a toy module (docs/mutation.md): cosmic-ray
makes the mutants, the runner measures which test executes which line, forks a child per
mutant that runs only those tests, and records each verdict."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

TOY = '''\
"""A toy module under mutation."""

STEP = 1


def advance(x):
    return x + STEP


def enabled():
    return True


def never_called():
    return False
'''

TESTS = '''\
def test_advance():
    from toy import advance  # first imported inside a test: STEP = 1 is still import time

    assert advance(2) == 3


def test_enabled_weakly():
    from toy import enabled

    assert enabled() in (True, False)  # cannot fail: lets its mutant survive
'''

# (line, operator, occurrence) -> (verdict, tests run: "all" or how many, covered)
EXPECTED = {
    (3, "core/NumberReplacer", 0): ("killed", "all", True),  # STEP = 2: import time
    (3, "core/NumberReplacer", 1): ("killed", "all", True),  # STEP = 0
    (7, "core/ReplaceBinaryOperator_Add_Sub", 0): ("killed", 1, True),
    (7, "core/ReplaceBinaryOperator_Add_Mul", 0): ("killed", 1, True),
    (7, "core/ReplaceBinaryOperator_Add_Div", 0): ("killed", 1, True),
    (11, "core/ReplaceTrueWithFalse", 0): ("survived", 1, True),
    (15, "core/ReplaceFalseWithTrue", 0): ("survived", 0, False),  # no test calls it
}


def run_toy(tmp_path: Path, cold: bool) -> tuple[dict, Path]:
    """scripts/mutation's run_module on the toy module; its JSON report and the copy."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "toy.py").write_text(TOY)
    (work / "test_toy.py").write_text(TESTS)
    # scripts/mutation has no .py suffix: load it by path, in a fresh process (the runner
    # forks, which it must not do from this test process)
    program = textwrap.dedent(f"""
        import importlib.machinery, importlib.util, sys
        from pathlib import Path
        sys.path.insert(0, {str(SCRIPTS)!r})
        loader = importlib.machinery.SourceFileLoader("mutation", {str(SCRIPTS / "mutation")!r})
        cli = importlib.util.module_from_spec(importlib.util.spec_from_loader("mutation", loader))
        loader.exec_module(cli)
        cli.run_module("toy.py", {{"tests": ["test_toy.py"], "floor": 0}}, Path({str(work)!r}),
                       Path({str(out)!r}), cold={cold})
    """)
    # run from outside the copy: every mutant must be written inside it, never next to the caller
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / ("toy.cold.json" if cold else "toy.json")).read_text()), work


def verdicts(report: dict) -> dict:
    return {(m["line"], m["operator"], m["occurrence"]):
            (m["verdict"], m["tests"], not m.get("not_covered", False))
            for m in report["mutants"]}


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_warm_runner_verdicts_per_mutant(tmp_path):
    report, work = run_toy(tmp_path, cold=False)
    assert verdicts(report) == EXPECTED
    assert (report["killed"], report["survived"], report["incompetent"]) == (5, 2, 0)
    assert report["score"] == round(5 / 7, 4)
    assert [(s["line"], s["covered"]) for s in report["survivors"]] == [(11, True), (15, False)]
    assert (work / "toy.py").read_text() == TOY  # every mutant was put back


@pytest.mark.slow
def test_cold_runner_gives_the_same_verdicts(tmp_path):
    """The reference path (a fresh pytest per mutant, every test) agrees mutant by mutant."""
    report, work = run_toy(tmp_path, cold=True)
    assert verdicts(report) == {k: (v, "all", True) for k, (v, _, _) in EXPECTED.items()}
    assert (work / "toy.py").read_text() == TOY


def warm_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_warm", SCRIPTS / "mutation_warm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_mutant_on_a_continuation_line_selects_by_its_whole_statement():
    warm = warm_module()
    source = ("total = (1 +\n"  # 1
              "         2)\n"  # 2: the + runs as line 1's code
              "@decorate\n"  # 3
              "def f(a,\n"  # 4
              "      b=2):\n"  # 5: a default, in the header
              "    if (a >\n"  # 6
              "            b):\n"  # 7
              "        return a\n")  # 8
    lines = warm.statement_lines(source)
    assert lines[2] == {1, 2}
    assert lines[5] == {3, 4, 5}  # the header with its decorator, not the body
    assert lines[7] == {6, 7}
    assert lines[8] == {8}
    cover = warm.Coverage(tests={"slow": {1, 6}, "fast": {6, 8}, "other": {8}},
                          imports={3, 4}, durations={"slow": 2.0, "fast": 0.1, "other": 1.0})
    assert cover.select({6, 7}) == ["fast", "slow"]  # fastest first
    assert cover.select({4, 5}) is None  # import time: every test
    assert cover.select({9}) == []  # executed by none: not covered


def test_a_terminated_run_removes_its_checkout_copy(tmp_path):
    # scripts/mutation turns SIGTERM into SystemExit, so its temporary copy of the checkout
    # is removed as after Ctrl-C (a bare SIGTERM left /tmp/variantlab-mutation-* behind)
    import signal
    program = textwrap.dedent(f"""
        import importlib.machinery, importlib.util, sys, tempfile, time
        sys.path.insert(0, {str(SCRIPTS)!r})
        loader = importlib.machinery.SourceFileLoader("mutation", {str(SCRIPTS / "mutation")!r})
        cli = importlib.util.module_from_spec(importlib.util.spec_from_loader("mutation", loader))
        loader.exec_module(cli)
        cli.exit_on_sigterm()
        with tempfile.TemporaryDirectory(dir={str(tmp_path)!r}) as tmp:
            print(tmp, flush=True)
            time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                          text=True) as proc:
        folder = proc.stdout.readline().strip()
        assert folder and Path(folder).is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not Path(folder).exists()
