"""Issue 37 item 9: a run's results exported as one compact file (``variantlab
export-results``) give back the frames of the store, and a report written from the export
has the CSVs of the report written from the store; every committed report with an export
beside it regenerates from it to its committed CSVs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, invoke, store_of

from variantlab.report import write_report
from variantlab.store.export import EXPORT_FILE, read_export
from variantlab.store.runs import export_run
from variantlab.store.store import load_run
from variantlab.testing.sample import sample_grid, sample_run

CSVS = ("summary.csv", "effects.csv", "tuned.csv", "effects_by_size.csv",
        "effects_by_condition.csv", "verdicts.csv", "seeds.csv")
#: the size budget of a committed export (docs/findings.md#results-exports)
BUDGET_BYTES = 5 * 2**20


def same_csvs(made: Path, committed: Path) -> list[str]:
    """The CSVs of ``committed`` that ``made`` has too, each checked equal (numbers to
    rel 1e-9); the names compared. Fails on a CSV only one of them has."""
    names = [n for n in CSVS if (committed / n).exists() or (made / n).exists()]
    for name in names:
        assert (made / name).exists() and (committed / name).exists(), name
        a, b = pd.read_csv(made / name), pd.read_csv(committed / name)
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9, obj=name)
    return names


def test_the_export_gives_back_the_frames_of_the_store(tmp_path):
    run = sample_run()  # a failed unit with HTML in its message, NaN values, no-step rows
    folder = store_of(run, tmp_path / "sample")
    written = export_run(folder)
    assert written == folder / EXPORT_FILE
    stored, exported = load_run(folder), load_run(written)
    assert exported.meta == stored.meta
    for frame in ("variants", "units", "rows"):
        pd.testing.assert_frame_equal(getattr(exported, frame), getattr(stored, frame),
                                      check_exact=True, obj=frame)
    assert (stored.rows["status"] == "failed").sum() == 1
    assert exported.rows["value"].isna().sum() == stored.rows["value"].isna().sum() > 0


def test_the_export_is_deterministic_and_compact(tmp_path):
    folder = store_of(sample_grid({"norm.kind": ["layer", "rms"], "drop_rate": [0.0, 0.1]},
                                  seeds=(0, 1, 2)), tmp_path / "grid")
    first = export_run(folder, tmp_path / "a.json.gz").read_bytes()
    second = export_run(folder, tmp_path / "b.json.gz").read_bytes()
    assert first == second  # no timestamp in the gzip header, sorted keys
    rows = len(load_run(folder).rows)
    assert len(first) < 40 * rows  # bytes per stored row; the store takes several hundred
    assert len(first) < (folder / "results.sqlite").stat().st_size / 5


def test_a_report_from_the_export_equals_the_report_from_the_store(tmp_path):
    folder = store_of(sample_grid({"norm.kind": ["layer", "rms"], "attention.n_kv_heads": [1, 4]},
                                  seeds=(0, 1)), tmp_path / "grid")
    write_report([folder], tmp_path / "from-store")
    committed = tmp_path / "reports" / "grid"
    committed.mkdir(parents=True)
    export_run(folder, committed / EXPORT_FILE)
    write_report([committed], committed)  # a report folder with its export beside it
    assert "summary.csv" in same_csvs(committed, tmp_path / "from-store")
    assert ((committed / "report.md").read_text()
            == (tmp_path / "from-store" / "report.md").read_text())


@pytest.mark.slow
def test_a_fresh_tiny_run_exported_reports_the_same_through_the_cli(tmp_path):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(
        "name: tiny-export\nseeds: [0, 1]\n"
        "model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, "
        "n_layers: 2, drop_rate: 0.0}\n"
        "grid: {norm.kind: [layer, rms], measure.training.lr: [1.0e-3, 1.0e-2]}\n"
        "measure:\n  params: {}\n"
        "  training: {steps: 4, batch_size: 2, seq_len: 16, eval_batches: 1, device: cpu}\n"
        "  dynamics: {steps: 4, batch_size: 2, seq_len: 16, every: 2}\n")
    assert invoke("run", exp, "--out", tmp_path / "runs").exit_code == 0
    run = tmp_path / "runs" / "tiny-export"
    done = invoke("export-results", run)
    assert done.exit_code == 0 and f"wrote {run / EXPORT_FILE}" in " ".join(done.output.split())
    report = tmp_path / "reports" / "tiny-export"
    report.mkdir(parents=True)
    (report / EXPORT_FILE).write_bytes((run / EXPORT_FILE).read_bytes())
    assert invoke("report", report, "--out", report).exit_code == 0
    assert {"summary.csv", "tuned.csv"} <= set(same_csvs(report, run / "report"))


COMMITTED = sorted((ROOT / "reports").glob(f"*/{EXPORT_FILE}"))
#: exports above this regenerate in the slow suite (5-40 s each: the large tuned sweeps),
#: the smaller ones in the fast suite; CI runs both
FAST_BYTES = 100_000


@pytest.mark.parametrize("export", [
    pytest.param(p, id=p.parent.name,
                 marks=[pytest.mark.slow] if p.stat().st_size > FAST_BYTES else [])
    for p in COMMITTED])
def test_a_committed_report_regenerates_from_its_export(export, tmp_path):
    assert export.stat().st_size <= BUDGET_BYTES, "over the export size budget"
    made = tmp_path / export.parent.name
    made.mkdir()
    (made / EXPORT_FILE).symlink_to(export)
    write_report([made], made)
    assert "summary.csv" in same_csvs(made, export.parent)


def test_the_committed_exports_are_found_where_the_regeneration_test_looks(tmp_path):
    """The test above runs once per committed export (none before the reports are rerun):
    this one shows that an export placed as the reports hold them is picked up and read."""
    folder = store_of(sample_run(fail=None), tmp_path / "run")
    placed = tmp_path / "reports" / "sample" / EXPORT_FILE
    placed.parent.mkdir(parents=True)
    export_run(folder, placed)
    assert sorted((tmp_path / "reports").glob(f"*/{EXPORT_FILE}")) == [placed]
    assert read_export(placed).meta.experiment == "sample"


def test_export_results_refuses_what_is_not_one_run_store(tmp_path):
    folder = store_of(sample_run(fail=None), tmp_path / "runs" / "a")
    store_of(sample_run(fail=None, experiment="b"), tmp_path / "runs" / "b")
    several = invoke("export-results", tmp_path / "runs")
    assert several.exit_code == 2
    assert "names 2 runs; give one run folder" in " ".join(several.output.split())
    (tmp_path / "x").mkdir()
    export_run(folder, tmp_path / "x" / EXPORT_FILE)
    again = invoke("export-results", tmp_path / "x" / EXPORT_FILE)
    assert again.exit_code == 2 and "an export, not a results store" in again.output
    missing = invoke("export-results", tmp_path / "nowhere")
    assert missing.exit_code == 2 and "Traceback" not in missing.output


def test_a_damaged_export_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "reports" / "bad"
    folder.mkdir(parents=True)
    (folder / EXPORT_FILE).write_bytes(gzip.compress(b'{"format": "something else"}'))
    result = invoke("report", folder, "--out", tmp_path / "out")
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"{folder / EXPORT_FILE}: not a results export" in text and "export-results" in text
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_results_reads_an_export_like_the_store(tmp_path):
    import variantlab as vl

    folder = store_of(sample_grid({"norm.kind": ["layer", "rms"]}, seeds=(0, 1)),
                      tmp_path / "grid")
    (tmp_path / "copy").mkdir()
    export_run(folder, tmp_path / "copy" / EXPORT_FILE)
    from_store, from_export = vl.results(folder), vl.results(tmp_path / "copy")
    assert "norm.kind" in from_export.columns and len(from_export) == len(from_store) > 0
    pd.testing.assert_frame_equal(from_export.drop(columns="run"),
                                  from_store.drop(columns="run"))
