"""Results store: round trip, atomic units, retries replace, stale units hidden."""

import math
import sqlite3

import pytest

from variantlab.plugin.rows import row
from variantlab.store.store import STORE_FILE, Store, UnitRecord, load_run, results


def record(key, status="ok", variant="a", seed=0, probe="params", error=None):
    return UnitRecord(key=key, variant=variant, seed=seed, probe=probe, settings_json="{}",
                      status=status, error=error, traceback="tb" if error else None,
                      duration_s=0.5, version="0.1.0", device=None)


def setup_store(path):
    store = Store(path)
    store.write_experiment(
        {"experiment": "exp", "seeds": [0, 1], "data": {"source": "synthetic"}, "measure": {}},
        [{"name": "a", "label": "base", "spec": {"x": 1}},
         {"name": "b", "label": "norm.kind=rms", "spec": {"x": 2}, "warnings": ["w"]}],
        [("k1", "a", 0, "params"), ("k2", "b", 0, "params"), ("k3", "b", 1, "params")],
    )
    return store


def test_round_trip(tmp_path):
    with setup_store(tmp_path) as store:
        store.save_unit(record("k1"), [
            row("params", "total", 123, unit="count"),
            row("params", "params", 7, scope="layer", layer=1, unit="count"),
            row("training", "loss", math.nan, step=3),
        ])
        store.save_unit(record("k2", variant="b"), [row("params", "total", 456)])
    assert (tmp_path / STORE_FILE).is_file()
    df = results(tmp_path)
    assert list(df.columns[:12]) == ["experiment", "variant", "label", "seed", "probe", "metric",
                                     "scope", "name", "layer", "step", "value", "unit"]
    assert df["experiment"].unique().tolist() == ["exp"]
    assert df["metric"].tolist() == ["total", "params", "loss", "total"]
    assert df["value"].iloc[0] == 123.0 and df["value"].iloc[3] == 456.0
    assert math.isnan(df["value"].iloc[2])  # NaN survives (stored as NULL)
    assert df["layer"].iloc[1] == 1 and df["layer"].isna().iloc[0]
    assert df["step"].iloc[2] == 3
    assert df["label"].tolist()[-1] == "norm.kind=rms"
    assert set(df["status"]) == {"ok"}
    # the same through the file path and through the package
    import variantlab
    assert variantlab.results(tmp_path / STORE_FILE).equals(df)


def test_load_run_meta_and_frames(tmp_path):
    with setup_store(tmp_path) as store:
        store.save_unit(record("k1"), [row("params", "total", 1)])
    run = load_run(tmp_path)
    assert run.meta.experiment == "exp" and run.meta.seeds == [0, 1]
    assert run.meta.data == {"source": "synthetic"}
    assert run.variants["name"].tolist() == ["a", "b"]
    assert run.variants["position"].tolist() == [0, 1]
    assert run.units["key"].tolist() == ["k1"] and run.units["current"].tolist() == [True]
    assert len(run.rows) == 1


def test_wal_mode(tmp_path):
    setup_store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / STORE_FILE)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_failed_unit_is_one_error_row_and_retry_replaces(tmp_path):
    with setup_store(tmp_path) as store:
        store.save_unit(record("k2", "failed", variant="b", error="RuntimeError: boom"))
        df = results(tmp_path)
        assert len(df) == 1
        assert df.loc[0, "status"] == "failed" and df.loc[0, "metric"] == "error"
        assert df.loc[0, "error"] == "RuntimeError: boom" and math.isnan(df.loc[0, "value"])
        store.save_unit(record("k2", variant="b"), [row("params", "total", 5)])
        store.save_unit(record("k2", variant="b"), [row("params", "total", 5)])  # again
        assert store.statuses() == {"k2": "ok"}
        assert store.count_rows() == 1
    df = results(tmp_path)
    assert df["status"].tolist() == ["ok"] and df["value"].tolist() == [5.0]


def test_unit_transaction_is_atomic(tmp_path):
    """A unit whose rows cannot be written leaves neither its status nor any row."""
    with setup_store(tmp_path) as store:
        store.save_unit(record("k1"), [row("params", "total", 1)])
        # the second row fails inside the transaction, after the unit and first row went in
        bad_rows = [row("params", "total", 2), {"probe": "params", "metric": "x", "value": 1,
                                                 "layer": {"not": "storable"}}]
        with pytest.raises(sqlite3.Error):
            store.save_unit(record("k2", variant="b"), bad_rows)
        assert store.statuses() == {"k1": "ok"}
        assert store.count_rows() == 1
        # a retry of k1 that fails midway keeps the earlier rows of k1
        with pytest.raises(sqlite3.Error):
            store.save_unit(record("k1"), bad_rows)
        assert store.count_rows() == 1
    assert results(tmp_path)["value"].tolist() == [1.0]


def test_units_outside_the_plan_are_hidden(tmp_path):
    with setup_store(tmp_path) as store:
        store.save_unit(record("old", variant="a"), [row("params", "total", 9)])
        store.save_unit(record("k1"), [row("params", "total", 1)])
    run = load_run(tmp_path)
    assert run.rows["unit_key"].tolist() == ["k1"]
    assert dict(zip(run.units["key"], run.units["current"])) == {"k1": True, "old": False}


def test_missing_store_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results store"):
        results(tmp_path / "nothing")
