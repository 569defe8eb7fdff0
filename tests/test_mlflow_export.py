"""export-mlflow against a real local MLflow store (sqlite): search_runs() and the metric
histories hold the numbers of variantlab.results(); a rerun adds nothing; changed results
replace their run; the report is an artifact; a missing mlflow is a clear error."""

import math
import sqlite3
import sys
from contextlib import closing

import pandas as pd
import pytest
from conftest import invoke, store_of

from variantlab import results
from variantlab.export.mlflow import metric_key
from variantlab.testing.sample import sample_grid


def grid_run(tmp_path):
    run = sample_grid({"norm.kind": ["layer", "rms"], "attention.n_kv_heads": [1, 4]},
                      seeds=(0, 1), experiment="grid",
                      probes=("params", "training", "gradients"))
    return store_of(run, tmp_path / "grid")


def test_without_mlflow_the_command_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    result = invoke("export-mlflow", grid_run(tmp_path), "--tracking-uri",
                    f"sqlite:///{tmp_path}/mlflow.db")
    assert result.exit_code == 2
    assert "mlflow is not installed" in result.output and "variantlab[mlflow]" in result.output


def test_metric_keys_name_probe_metric_scope_name_layer():
    assert metric_key("training", "loss", "model", "", None) == "training/loss"
    assert metric_key("gradients", "grad_norm", "layer", "attention", 2) == \
        "gradients/grad_norm/attention/layer2"
    assert metric_key("params", "params", "slot", "feedforward", pd.NA) == \
        "params/params/slot/feedforward"
    assert metric_key("p", "m", "parameter", "w[0]:x", None) == "p/m/parameter/w_0__x"


@pytest.mark.slow
def test_search_runs_holds_the_numbers_of_results(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    run = grid_run(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = invoke("export-mlflow", run, "--tracking-uri", uri)
    assert first.exit_code == 0, first.output
    assert "8 run(s) created, 0 replaced" in first.output
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_runs(experiment_names=["grid"],
                               filter_string="tags.`variantlab.kind` = 'variant'")
    assert len(found) == 8  # 4 variants x 2 seeds
    frame = results(run)
    assert set(zip(found["params.variant"], found["params.seed"].astype(int))) == \
        set(zip(frame["variant"], frame["seed"]))
    client = mlflow.MlflowClient(uri)
    compared = curves = 0
    for _, mrun in found.iterrows():
        rows = frame[(frame["variant"] == mrun["params.variant"])
                     & (frame["seed"] == int(mrun["params.seed"]))]
        axes = dict(s.split("=") for s in mrun["params.variant"].split(","))
        assert mrun["params.norm.kind"] == axes["norm.kind"]  # the axis values as params
        assert mrun["params.attention.n_kv_heads"] == axes["attention.n_kv_heads"]
        for _, r in rows[rows["step"].isna()].iterrows():
            key = metric_key(r["probe"], r["metric"], r["scope"], r["name"], r["layer"])
            assert mrun[f"metrics.{key}"] == pytest.approx(r["value"], rel=1e-12), key
            compared += 1
        curve = rows[rows["step"].notna()].sort_values("step")
        history = client.get_metric_history(mrun["run_id"], "training/loss")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
            list(zip(curve["step"].astype(int), curve["value"]))
        curves += 1
    assert compared == frame["step"].isna().sum() > 100 and curves == 8
    parent = mlflow.search_runs(experiment_names=["grid"],
                                filter_string="tags.`variantlab.kind` = 'run'")
    assert len(parent) == 1 and set(found["tags.mlflow.parentRunId"]) == {parent.run_id[0]}
    names = {a.path for a in client.list_artifacts(parent.run_id[0], "report")}
    assert {"report/report.html", "report/report.md", "report/summary.csv"} <= names
    assert client.list_artifacts(found.run_id[0])[0].path == "spec.json"

    again = invoke("export-mlflow", run, "--tracking-uri", uri)  # idempotent
    assert "0 run(s) created, 0 replaced (results changed), 8 unchanged" in again.output
    with closing(sqlite3.connect(run / "results.sqlite")) as conn, conn:  # a rerun's numbers
        conn.execute("UPDATE rows SET value = value + 1 WHERE metric = 'final_loss' AND "
                     "unit_key IN (SELECT key FROM units WHERE seed = 1)")
    third = invoke("export-mlflow", run, "--tracking-uri", uri)
    assert "0 run(s) created, 4 replaced (results changed), 4 unchanged" in third.output
    now = mlflow.search_runs(experiment_names=["grid"],
                             filter_string="tags.`variantlab.kind` = 'variant'")
    assert len(now) == 8
    changed = results(run).query("metric == 'final_loss'")
    for _, r in changed.iterrows():
        got = now[(now["params.variant"] == r["variant"])
                  & (now["params.seed"] == str(r["seed"]))]["metrics.training/final_loss"]
        assert not math.isnan(got.iloc[0]) and got.iloc[0] == pytest.approx(r["value"])


@pytest.mark.slow
def test_a_store_mlflow_refuses_is_bad_input_with_its_reason(tmp_path):
    pytest.importorskip("mlflow")
    result = invoke("export-mlflow", grid_run(tmp_path), "--tracking-uri", tmp_path / "plain")
    assert result.exit_code == 2
    assert result.output.startswith("--tracking-uri: ") and "MLflow says:" in result.output


@pytest.mark.slow
def test_a_failed_unit_and_a_diverged_loss(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from variantlab.testing.sample import sample_run

    run = store_of(sample_run(), tmp_path / "sample")  # batch seed 1: timing failed, NaN loss
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert invoke("export-mlflow", run, "--tracking-uri", uri, "--no-report").exit_code == 0
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_runs(experiment_names=["sample"],
                               filter_string="tags.`variantlab.kind` = 'variant'")
    bad = found[(found["params.variant"] == "batch") & (found["params.seed"] == "1")].iloc[0]
    assert bad["status"] == "FAILED" and "out of memory" in bad["tags.failed/timing"]
    assert math.isnan(bad["metrics.training/final_loss"])
    assert set(found.loc[found.index != bad.name, "status"]) == {"FINISHED"}
    good = found[(found["params.variant"] == "pre_norm") & (found["params.seed"] == "0")].iloc[0]
    assert good["tags.info/timing/device"] == "cpu"
    assert good["metrics.timing/forward_median_s"] == pytest.approx(0.010)
