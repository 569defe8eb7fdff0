"""Which machine computed each unit: recorded in the store and its export, said by a report
whose units come from more than one machine (the reading, and the timing comparisons that
cross machines), and said by a run that reuses units another machine computed. The same
code gave other test losses on this project's VM on two days (docs/reports.md), so numbers
from two machines must not be pooled silently."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import MODEL

import variantlab as vl
from variantlab.cli.main import main
from variantlab.config.experiment import experiment_from_text
from variantlab.executors import hardware
from variantlab.executors.runner import run_experiment
from variantlab.report import build_context, gather
from variantlab.report.claims import claims_table
from variantlab.store.export import read_export, write_export
from variantlab.store.store import STORE_FILE, Store, UnitRecord, load_run

REG = vl.get_registry()

AMD_VM = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx avx2

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: something else
"""
INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+   @ 2.0GHz
stepping\t: 8
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
CPU implementer\t: 0x41
"""


def parsed(text: str, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return hardware._cpuinfo(path)


def test_the_processor_is_named_with_its_family_model_and_stepping(tmp_path):
    assert hardware.cpu_name(parsed(AMD_VM, tmp_path)) == "AMD EPYC (AuthenticAMD 25/1/1)"
    assert hardware.cpu_name(parsed(INTEL, tmp_path)) == \
        "Intel(R) Xeon(R) Platinum 8480+ @ 2.0GHz (GenuineIntel 6/143/8)"
    arm = hardware.cpu_name(parsed(ARM, tmp_path))  # no model name: the platform's words
    assert arm and "/" not in arm
    assert hardware._cpuinfo(tmp_path / "absent") == {}
    here = hardware.machine("cpu")
    assert here.startswith(hardware.cpu_name()) and here == hardware.machine(None) or \
        hardware.machine(None).endswith(f"with {here}")


EXPERIMENT = f"""\
name: where
seeds: [0, 1]
{MODEL}grid:
  residual.kind: [pre_norm, post_norm]
measure:
  params: {{}}
  timing: {{batch_size: 2, seq_len: 16, passes: [forward], warmup: 0, repeats: 2, device: cpu}}
"""


def run_once(tmp_path: Path, **kwargs) -> tuple[Path, object]:
    exp = experiment_from_text(EXPERIMENT, str(tmp_path / "where.yaml"), base_dir=tmp_path)
    summary = run_experiment(exp, tmp_path / "out", **kwargs)
    return summary.run_dir, summary


def moved(run_dir: Path, machine: str, variant: str | None = None) -> int:
    """Say in the store that another machine computed the units (of ``variant``)."""
    with closing(sqlite3.connect(run_dir / STORE_FILE)) as conn, conn:
        where = "" if variant is None else " WHERE variant = ?"
        args = () if variant is None else (variant,)
        return conn.execute(f"UPDATE units SET machine = ?{where}", (machine, *args)).rowcount


def test_a_run_records_the_machine_and_the_export_keeps_it(tmp_path):
    run_dir, summary = run_once(tmp_path)
    assert summary.ok and not summary.warnings
    units = load_run(run_dir).units
    assert set(units["machine"]) == {hardware.machine("cpu")}
    export = write_export(load_run(run_dir), tmp_path / "results.json.gz")
    assert set(read_export(export).units["machine"]) == {hardware.machine("cpu")}
    # one machine: the report says nothing about machines
    context, _ = build_context(gather([run_dir]), registry=REG)
    assert not any("machines" in line for line in context["reading"])


def test_an_export_written_before_the_record_reads_with_no_machine():
    committed = Path(__file__).resolve().parent.parent / "reports" / "qk-norm-logits"
    units = read_export(committed / "results.json.gz").units
    assert len(units) and units["machine"].isna().all()


def test_a_store_without_the_machine_column_is_migrated(tmp_path):
    path = tmp_path / STORE_FILE
    with closing(sqlite3.connect(path)) as conn:  # the units table before the record
        conn.executescript(
            "CREATE TABLE units (key TEXT PRIMARY KEY, variant TEXT, seed INTEGER, probe TEXT,"
            " settings_json TEXT, status TEXT, error TEXT, traceback TEXT, started_at TEXT,"
            " finished_at TEXT, duration_s REAL, version TEXT, device TEXT);"
            "INSERT INTO units (key, variant, seed, probe, status) VALUES ('old', 'a', 0,"
            " 'params', 'ok');")
    with Store(path) as store:
        assert store.machines() == {}
        store.save_unit(UnitRecord(key="new", variant="a", seed=1, probe="params",
                                   settings_json="{}", status="ok", machine="X CPU"), [])
        assert store.machines() == {"new": "X CPU"}
    units = load_run(path).units.set_index("key")
    assert units.loc["new", "machine"] == "X CPU" and pd.isna(units.loc["old", "machine"])


def test_units_of_two_machines_are_said_in_the_reading_and_on_the_timings(tmp_path):
    run_dir, _ = run_once(tmp_path)
    assert moved(run_dir, "Other CPU (GenuineIntel 6/143/8), AVX512",
                 "residual.kind=post_norm") == 4
    data = gather([run_dir])
    context, _ = build_context(data, registry=REG)
    said = [line for line in context["reading"] if line.startswith("Computed on 2 machines")]
    assert len(said) == 1
    assert f"4 units on {hardware.machine('cpu')}" in said[0]
    assert "4 units on Other CPU (GenuineIntel 6/143/8), AVX512" in said[0]
    assert "partly the machines'" in said[0]
    timing = claims_table(data)
    timing = timing[timing["kind"] == "timing"]
    assert len(timing) == 1
    assert "timed on different machines (seeds 0, 1)" in timing["caveats"].iloc[0]
    html = (tmp_path / "report")
    from variantlab.report import write_report

    files = write_report([run_dir], html, registry=REG)
    assert "Computed on 2 machines" in files.markdown.read_text()


def test_a_run_that_reuses_another_machines_units_says_so_and_rerun_all_recomputes(tmp_path):
    run_dir, _ = run_once(tmp_path)
    moved(run_dir, "Other CPU, AVX512", "base")
    _, summary = run_once(tmp_path)
    assert summary.done == 0 and len(summary.warnings) == 1
    note = summary.warnings[0]
    assert note.startswith("4 unit(s) stored before were computed on another machine "
                           "(4 on Other CPU, AVX512), and this one is ")
    assert hardware.machine("cpu") in note and "--rerun all" in note
    # the CLI prints it
    yaml_file = tmp_path / "where.yaml"
    yaml_file.write_text(EXPERIMENT)
    shown = CliRunner().invoke(main, ["run", str(yaml_file), "--out", str(tmp_path / "out"),
                                      "--no-report"])
    assert shown.exit_code == 0, shown.output
    assert "warning: 4 unit(s) stored before were computed on another machine" in shown.output
    _, again = run_once(tmp_path, rerun="all")
    assert again.done == 8 and not again.warnings
    assert set(load_run(run_dir).units["machine"]) == {hardware.machine("cpu")}


@pytest.mark.parametrize("device", ["cpu", None, "auto"])
def test_the_machine_is_computed_once_per_device(device):
    assert hardware.machine(device) is hardware.machine(device)
