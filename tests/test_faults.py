"""Faults of docs/reliability.md not shown elsewhere: Ctrl-C (SIGINT) or SIGTERM of an
in-process run, and a plugin file edited while a run goes on (in this process: the run keeps
the code it started with and its keys, as its stored parameter counts show; a worker that
imports the edited file refuses the unit, naming the cause; the next run recomputes the
edited plugin's units only, with the edited code's numbers)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_MODEL, invoke

from variantlab.config.experiment import load_experiment
from variantlab.executors.base import _LOADED, ExperimentSource, compute
from variantlab.executors.runner import plan_units, run_experiment
from variantlab.probes import run_probe
from variantlab.store.store import load_run

NORM = '''
from typing import Literal

from torch import nn

import variantlab


class HalfSpec(variantlab.ComponentSpec):
    kind: Literal["half_layer"] = "half_layer"


@variantlab.hookimpl
def register_norms(register):
    register("half_layer", HalfSpec,
             lambda spec, dim: nn.LayerNorm(dim, elementwise_affine={affine}))
'''


def norm_experiment(tmp_path: Path) -> Path:
    (tmp_path / "half.py").write_text(NORM.format(affine="True"))
    exp = tmp_path / "edit.yaml"
    exp.write_text(f"name: edit\nseeds: [0, 1]\nmodel: {TINY_MODEL}\nplugins: [half.py]\n"
                   "grid:\n  norm.kind: [layer, half_layer]\nmeasure:\n  params: {}\n")
    return exp


def test_a_plugin_edited_mid_run_in_process_keeps_the_runs_code_and_keys(tmp_path):
    exp_path = norm_experiment(tmp_path)
    exp = load_experiment(exp_path)
    planned = {u.key for u in plan_units(exp)}
    calls: list[str] = []

    def edit_after_the_first_unit(name, spec, settings, **kwargs):
        calls.append(name)
        if len(calls) == 1:  # someone saves the plugin file while the run goes on
            (tmp_path / "half.py").write_text(NORM.format(affine="False"))
        return run_probe(name, spec, settings, **kwargs)

    summary = run_experiment(exp, tmp_path / "runs", probe_fn=edit_after_the_first_unit)
    assert summary.exit_code == 0 and summary.done == 4
    stored = load_run(tmp_path / "runs" / "edit").units
    assert set(stored.key) == planned  # the keys of the code it started with and ran
    # the edit drops the norms' scale and shift (2 x 32 parameters in each of 5 norms): every
    # unit of this run, those computed after the edit included, counts them (the code it
    # started with), as LayerNorm's scale and shift do
    first = totals(tmp_path / "runs" / "edit")
    assert first == {("base", 0): first[("base", 0)], ("base", 1): first[("base", 0)],
                     ("norm.kind=half_layer", 0): first[("base", 0)],
                     ("norm.kind=half_layer", 1): first[("base", 0)]}

    # the next run sees the edit: the half_layer units get new keys and are computed again,
    # the others are kept
    again = run_experiment(load_experiment(exp_path), tmp_path / "runs")
    assert (again.done, again.skipped) == (2, 2)
    units = load_run(tmp_path / "runs" / "edit").units
    assert len(units) == 6 and set(units.status) == {"ok"}
    assert totals(tmp_path / "runs" / "edit", latest=True) == {
        **first, ("norm.kind=half_layer", 0): first[("base", 0)] - 5 * 64,
        ("norm.kind=half_layer", 1): first[("base", 0)] - 5 * 64}


def totals(run: Path, latest: bool = False) -> dict[tuple[str, int], float]:
    """The params probe's total per (variant, seed), of the run's newest units if latest."""
    import variantlab as vl

    got = vl.results(run)
    got = got[(got.metric == "total") & (got.scope == "model")]
    if latest:
        got = got.drop_duplicates(["variant", "seed"], keep="last")
    assert not got.duplicated(["variant", "seed"]).any()
    return {(v, int(s)): float(x) for v, s, x in zip(got.variant, got.seed, got.value)}


def test_a_worker_that_imports_the_edited_plugin_refuses_the_unit(tmp_path):
    exp_path = norm_experiment(tmp_path)
    exp = load_experiment(exp_path)
    units = {(u.variant.name, u.probe, u.seed): u for u in plan_units(exp)}
    source = ExperimentSource.of(exp)
    (tmp_path / "half.py").write_text(NORM.format(affine="False"))  # edited before it rebuilds
    _LOADED.clear()
    try:
        with pytest.raises(LookupError, match=r"is not in the experiment as the worker rebuilt "
                                              r"it \(did the YAML, a plugin"):
            compute(source, units[("norm.kind=half_layer", "params", 0)].key, run_probe)
        # a unit the edit does not touch is computed as planned
        record, rows = compute(source, units[("base", "params", 0)].key, run_probe)
        assert record.status == "ok" and rows
    finally:
        _LOADED.clear()


# a probe that stores nothing until a "go" file exists, leaving a "started" file
WAIT_PLUGIN = '''
import time
from pathlib import Path

import variantlab
from variantlab.plugin.rows import row


class WaitSettings(variantlab.ProbeSettings):
    folder: str = ""


def run(spec, settings, *, seed, data, base_dir, device, registry):
    Path(settings.folder, f"started-{seed}").touch()
    deadline = time.monotonic() + 600
    while not Path(settings.folder, "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return [row("wait", "waited", 1)]


@variantlab.hookimpl
def register_probes(register):
    register("wait", WaitSettings, run, device_free=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_an_in_process_run_and_keeps_finished_units(tmp_path, sig):
    (tmp_path / "wait.py").write_text(WAIT_PLUGIN)
    exp = tmp_path / "wait.yaml"
    exp.write_text(f"name: wait\nseeds: [0, 1]\nmodel: {TINY_MODEL}\nplugins: [wait.py]\n"
                   f"measure:\n  params: {{}}\n  wait: {{folder: '{tmp_path}'}}\n")
    cmd = [sys.executable, "-m", "variantlab", "run", str(exp), "--out", str(tmp_path / "runs"),
           "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while not (tmp_path / "started-0").exists():  # params of seed 0 stored, wait running
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(sig)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    assert "interrupted: finished units are stored" in output and "Traceback" not in output
    units = load_run(tmp_path / "runs" / "wait").units
    assert list(zip(units.probe, units.seed, units.status)) == [("params", 0, "ok")]

    (tmp_path / "go").touch()
    again = invoke("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert again.exit_code == 0, again.output
    assert "4 unit(s): 3 computed, 1 stored already, 0 failed" in again.output


def test_every_row_of_the_fault_matrix_names_a_test_that_exists():
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "reliability.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[^\]]*\])?`", text)
    assert len(named) >= 8
    for path, name in named:
        source = (root / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} does not exist"
    for fault in ("SIGKILL", "SIGINT", "SIGTERM", "disk full", "corrupt store", "concurrent run",
                  "worker death under Ray", "code edit mid-run", "memory exhaustion in a unit",
                  "damaged token cache", "killed long unit", "unreachable tracking server",
                  "busy machine"):
        assert f"| {fault} |" in text, fault
