"""Timings that know the machine was busy (issue 27.4): every unit records its wall and CPU
time, the load average at its start and end, its torch threads and the cores it may use; the
timing probe marks a measurement taken while the machine was busy, and the report says so
beside the speed verdict it affects; a run never starts more torch threads than its cores."""

from __future__ import annotations

import math
import sqlite3

import pandas as pd
import torch
from click.testing import CliRunner

import variantlab as vl
from variantlab.cli.main import main
from variantlab.config.experiment import load_experiment
from variantlab.executors.runner import run_experiment
from variantlab.probes import machine, run_probe
from variantlab.report.findings import busy_note

REG = vl.get_registry()
TIMING = {"batch_size": 2, "seq_len": 8, "passes": ["forward"], "warmup": 1, "repeats": 3,
          "device": "cpu"}
EXP = """\
name: demo
seeds: [0]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, n_layers: 2,
        drop_rate: 0.0}
grid: {activation.kind: [gelu, relu]}  # a compared axis: the speed verdict is within one condition
measure:
  training: {steps: 3, batch_size: 2, seq_len: 8, eval_batches: 0}
  timing: {batch_size: 2, seq_len: 8, passes: [forward], warmup: 1, repeats: 3}
"""


def test_each_unit_records_cpu_time_load_threads_and_cores(tmp_path, monkeypatch):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXP.replace("  timing: {batch_size: 2, seq_len: 8, passes: [forward], "
                                    "warmup: 1, repeats: 3}\n", ""))
    monkeypatch.setattr(machine, "cores", lambda cgroup="": 1)  # a run allowed one core
    seen = []
    original = run_probe

    def probe_fn(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)
    before = torch.get_num_threads()
    summary = run_experiment(load_experiment(exp_file), tmp_path / "runs", probe_fn=probe_fn)
    assert summary.ok
    assert seen == [1] * 2  # never more torch threads than the cores the run may use
    assert torch.get_num_threads() == before  # and given back after the run
    con = sqlite3.connect(tmp_path / "runs" / "demo" / "results.sqlite")
    got = con.execute("select duration_s, cpu_s, load_start, load_end, torch_threads, cores "
                      "from units").fetchall()
    assert len(got) == 2
    for wall, cpu, start, end, threads, cores in got:
        assert wall > 0 and cpu > 0 and threads == 1 and cores == 1
        assert math.isfinite(start) and math.isfinite(end) and start >= 0 and end >= 0


def test_the_timing_probe_marks_a_busy_measurement(tiny, monkeypatch):
    loads, busy = (0.1, 9.0), 1.0  # idle at the start, busy at the end (the rule: below)
    values = iter(loads)
    monkeypatch.setattr(machine, "load", lambda: next(values))
    monkeypatch.setattr(machine, "cores", lambda cgroup="": 2)
    rows = run_probe("timing", tiny, TIMING, seed=0, registry=REG)
    got = {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}
    assert (got["load_start"], got["load_end"], got["cores"], got["busy"]) == (*loads, 2.0, busy)


def test_the_busy_rule():
    assert not machine.busy(2.5, 2.5, 2)  # the run's own threads and a little more
    assert machine.busy(2.6, 0.0, 2) and machine.busy(0.0, 3.0, 2)
    assert not machine.busy(math.nan, math.nan, 2)  # unknown: not busy


def test_cores_follow_the_cgroup_cpu_quota(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs' worth: 2 cores
    mask = machine.cores(tmp_path / "none")
    assert machine.cores(v2) == min(mask, 2)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert machine.cores(v2) == mask
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert machine.cores(v1.parent) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert machine.cores(v1.parent) == mask


def test_busy_note_names_the_busy_variants():
    rows = pd.DataFrame({"variant": ["a", "b", "a"], "probe": ["timing"] * 3,
                         "metric": ["busy", "busy", "forward_median_s"],
                         "value": [0.0, 1.0, 0.1]})
    assert busy_note(rows, "timing", ["a"]) == ""
    assert busy_note(rows, "timing", ["a", "b"]).startswith(
        " (but b was timed while the machine was busy: its load average was above the cores")


def test_the_report_says_so_beside_the_speed_verdict(tmp_path, monkeypatch):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXP.replace("  training: {steps: 3, batch_size: 2, seq_len: 8, "
                                    "eval_batches: 0}\n", ""))
    monkeypatch.setattr(machine, "load", lambda: 99.0)
    result = CliRunner().invoke(main, ["run", str(exp_file), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "runs" / "demo" / "report" / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.lstrip("- ").startswith("forward:")
                or "faster than" in x or "slower than" in x or "as fast as" in x)
    assert "timed while the machine was busy" in line, line
