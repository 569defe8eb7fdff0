"""The store and the report share one contract (variantlab.store.contract): results() and load_run()
give exactly its columns and dtypes, the meta is decoded once, in the store, and the report
reads what the store decoded."""

import json
import math
import sqlite3
from contextlib import closing
from dataclasses import fields, replace
from typing import get_type_hints

import pandas as pd
import pytest
from conftest import TINY_MODEL, invoke, store_of

import variantlab as vl
from variantlab.plugin.rows import Row
from variantlab.report import build_context, gather, write_report
from variantlab.store import contract
from variantlab.store.contract import (
    RESULTS,
    UNITS,
    VARIANTS,
    ContractError,
    RunData,
    RunMeta,
    conform,
    dtype,
    empty,
    names,
)
from variantlab.store.store import Store, StoreError, UnitRecord, load_run, results
from variantlab.testing.sample import sample_run

REG = vl.get_registry()


def shape(frame: pd.DataFrame) -> list[tuple[str, object]]:
    return [(c, frame[c].dtype) for c in frame.columns]


def contract_shape(columns) -> list[tuple[str, object]]:
    return [(c.name, dtype(c.kind)) for c in columns]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real run of the CLI: two variants x two seeds of the params probe."""
    folder = tmp_path_factory.mktemp("real")
    (folder / "c.yaml").write_text(
        f"name: contract\nseeds: [3, 5]\nmodel: {TINY_MODEL}\n"
        "grid: {norm.kind: [layer, rms]}\nmeasure: {params: {}}\n")
    result = invoke("run", folder / "c.yaml", "--out", folder / "runs", "--no-report")
    assert result.exit_code == 0, result.output
    return folder / "runs" / "contract"


def test_a_real_run_has_exactly_the_contracts_frames(real_run):
    run = load_run(real_run)
    assert shape(run.rows) == contract_shape(RESULTS)
    assert shape(run.variants) == contract_shape(VARIANTS)
    assert shape(run.units) == contract_shape(UNITS)
    # results() adds a column per grid axis (model axes too, issue 28.2)
    results = vl.results(real_run)
    assert shape(results.drop(columns=["norm.kind"])) == contract_shape(RESULTS)
    assert list(results.columns)[-2:] == ["norm.kind", "run"]
    by_variant = dict(zip(results["variant"], results["norm.kind"]))
    assert by_variant == {"base": "layer", "norm.kind=rms": "rms"}
    per_unit = run.rows.groupby("unit_key", sort=False).size().tolist()
    # 2 variants x 2 seeds; 11 parameter-count rows and 4 state rows (2 layers, total, per token)
    assert per_unit == [15] * 4 and set(run.rows["status"]) == {"ok"}
    assert run.rows["seed"].tolist()[:15] == [3] * 15 and run.rows["run"].iloc[0] == "contract"
    assert run.variants["name"].tolist() == ["base", "norm.kind=rms"]


def test_the_meta_and_variants_come_decoded(real_run):
    run = load_run(real_run)
    meta = run.meta
    assert isinstance(meta, RunMeta)
    assert meta.seeds == [3, 5] and all(type(s) is int for s in meta.seeds)
    assert meta.grid == {"norm.kind": ["layer", "rms"]}
    assert meta.measure == {"params": {}} and meta.data["source"] == "synthetic"
    assert meta.experiment == "contract" and meta.run == "contract"
    assert meta.yaml.startswith("name: contract") and meta.extra == {}
    spec = run.variants["spec"].tolist()
    assert [s["norm"]["kind"] for s in spec] == ["layer", "rms"] and spec[0]["emb_dim"] == 32
    assert run.variants["overrides"].tolist() == [{"norm.kind": "layer"}, {"norm.kind": "rms"}]
    assert run.variants["warnings"].tolist() == [[], []]


def test_an_empty_and_a_failed_only_run_keep_the_columns_and_dtypes(tmp_path):
    meta = RunMeta(experiment="e", seeds=[0])
    with Store(tmp_path) as store:
        store.write_experiment(meta, [{"name": "a", "label": "a", "spec": {}}],
                               [("k", "a", 0, "params")])
    nothing = results(tmp_path)
    assert len(nothing) == 0 and shape(nothing) == contract_shape(RESULTS)
    assert shape(empty(RESULTS)) == contract_shape(RESULTS)
    with Store(tmp_path) as store:
        store.save_unit(UnitRecord(key="k", variant="a", seed=0, probe="params",
                                   settings_json="{}", status="failed", error="boom"))
    failed = results(tmp_path)
    assert shape(failed) == contract_shape(RESULTS)
    assert failed[["metric", "status", "error"]].values.tolist() == [["error", "failed", "boom"]]
    assert math.isnan(failed["value"].iloc[0]) and failed["layer"].isna().all()
    data = gather([tmp_path])  # the report of a run with no numbers: its failure only
    assert len(data.rows) == 0 and data.units["error"].tolist() == ["boom"]
    files = write_report([tmp_path], tmp_path / "report", registry=REG)
    assert "| a | params | 0 | boom |" in files.markdown.read_text()


def test_gather_reads_the_same_from_the_store_and_from_its_run_data(real_run):
    from_path, from_data = gather([real_run]), gather([load_run(real_run)])
    pd.testing.assert_frame_equal(from_path.rows, from_data.rows)
    pd.testing.assert_frame_equal(from_path.variants, from_data.variants)
    assert from_path.runs == from_data.runs
    assert list(from_path.rows.columns) == [*names(RESULTS), "invocation", "machine", "stack"]
    assert from_path.runs[0].seeds == [3, 5]


def test_the_report_decodes_no_json(real_run, monkeypatch):
    decodes = []
    real_decode = RunMeta.decode.__func__

    def counting(cls, stored, run=""):
        decodes.append(run)
        return real_decode(cls, stored, run)

    monkeypatch.setattr(RunMeta, "decode", classmethod(counting))
    run = load_run(real_run)
    assert decodes == ["contract"]

    def refuse(*args, **kwargs):
        raise AssertionError("the report decoded JSON again")

    # the report's modules load lazily, and matplotlib reads its font cache's JSON when it is
    # first imported: import them first, so that only the run's JSON counts
    build_context(gather([run]), REG)
    monkeypatch.setattr(json, "loads", refuse)
    context, _ = build_context(gather([run]), REG)
    assert decodes == ["contract"]
    assert context["headers"][0].seeds == "3, 5"
    assert context["effects"] is not None  # the grid, from the decoded meta


def test_gather_refuses_frames_that_are_not_the_contract():
    run = sample_run()
    run.rows = run.rows.drop(columns=["unit_key"])
    with pytest.raises(ContractError, match=r"run sample: rows lacks the column\(s\) unit_key"):
        gather([run])
    run = sample_run()
    run.variants = run.variants.rename(columns={"spec": "spec_json"})
    with pytest.raises(ContractError, match=r"run sample: variants lacks .* spec"):
        gather([run])
    run = sample_run()
    run.meta = {"experiment": "sample", "seeds": "[0, 1]"}  # type: ignore[assignment]
    with pytest.raises(TypeError, match="meta is a dict, not a variantlab.store.contract.RunMeta"):
        gather([run])


def test_the_meta_round_trips_through_the_store(tmp_path):
    run = sample_run()
    meta = replace(run.meta, grid={"a": [1, "x", True]}, extra={"later": "text"})
    store_of(replace(run, meta=meta), tmp_path / "sample")
    assert load_run(tmp_path / "sample").meta == meta


def _old_store(path, meta: dict[str, str]):
    """A store as the first versions wrote it: no grid in the meta, no units.invocation."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
            "CREATE TABLE variants (name TEXT PRIMARY KEY, label TEXT, position INTEGER,"
            " spec_json TEXT, overrides_json TEXT, warnings_json TEXT);"
            "CREATE TABLE units (key TEXT PRIMARY KEY, variant TEXT, seed INTEGER, probe TEXT,"
            " settings_json TEXT, status TEXT, error TEXT, traceback TEXT, started_at TEXT,"
            " finished_at TEXT, duration_s REAL, version TEXT, device TEXT);"
            "CREATE TABLE rows (unit_key TEXT, probe TEXT, metric TEXT, scope TEXT, name TEXT,"
            " layer INTEGER, step INTEGER, value REAL, unit TEXT);"
            "CREATE TABLE plan (key TEXT, variant TEXT, seed INTEGER, probe TEXT,"
            " position INTEGER);"
            "INSERT INTO variants VALUES ('a', 'base', 0, '{\"emb_dim\": 32}', NULL, NULL);"
            "INSERT INTO units (key, variant, seed, probe, status) VALUES"
            " ('k', 'a', 0, 'params', 'ok');"
            "INSERT INTO rows VALUES ('k', 'params', 'total', 'model', NULL, NULL, NULL,"
            " 7.0, 'count');")
        conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        conn.commit()


def test_an_old_store_loads_with_the_defaults(tmp_path):
    path = tmp_path / "old" / "results.sqlite"
    path.parent.mkdir()
    _old_store(path, {"experiment": "old", "seeds": "[0]", "future_key": "x"})
    run = load_run(path)  # read only: not migrated
    assert run.meta == RunMeta(experiment="old", seeds=[0], run="old",
                               extra={"future_key": "x"})
    assert run.meta.grid is None  # older than the grid in the meta: the report reads the yaml
    assert shape(run.units) == contract_shape(UNITS) and run.units["invocation"].isna().all()
    assert run.variants[["overrides", "warnings"]].values.tolist() == [[{}, []]]
    assert run.rows[["name", "value", "unit"]].values.tolist() == [["", 7.0, "count"]]


@pytest.mark.parametrize(("key", "text", "says"), [
    ("seeds", "0, 1", "meta 'seeds' is not JSON"),
    ("seeds", "[0, 1.5]", "meta 'seeds' is not a list of integers"),
    ("measure", "[1]", "meta 'measure' is not a mapping"),
])
def test_a_meta_that_is_not_the_contract_names_the_file_and_key(tmp_path, key, text, says):
    path = tmp_path / "bad" / "results.sqlite"
    path.parent.mkdir()
    _old_store(path, {"experiment": "bad", "seeds": "[0]", key: text})
    with pytest.raises(StoreError, match=says) as info:
        load_run(path)
    assert str(path) in str(info.value) and "fresh --out" in str(info.value)


def test_a_variant_spec_that_is_not_json_names_the_variant(tmp_path):
    path = tmp_path / "bad" / "results.sqlite"
    path.parent.mkdir()
    _old_store(path, {"experiment": "bad"})
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE variants SET spec_json = '{oops'")
        conn.commit()
    with pytest.raises(StoreError, match="variant 'a': spec_json is not JSON"):
        results(path)


def test_conform_casts_to_the_kinds_and_names_what_is_missing():
    frame = pd.DataFrame({"name": ["a"], "label": ["l"], "position": [0.0], "spec": [{}],
                          "overrides": [{}], "warnings": [[]], "extra": [1]})
    out = conform(frame, VARIANTS, "here")
    assert shape(out) == contract_shape(VARIANTS) and out["position"].tolist() == [0]
    with pytest.raises(ContractError, match=r"here lacks the column\(s\) spec, warnings"):
        conform(frame.drop(columns=["spec", "warnings"]), VARIANTS, "here")
    with pytest.raises(ContractError, match="here: column 'position' is not int"):
        conform(frame.assign(position=["first"]), VARIANTS, "here")


def test_the_other_definitions_agree_with_the_contract():
    result_names = names(RESULTS)
    probe_fields = list(get_type_hints(Row))
    assert [n for n in result_names if n in probe_fields] == probe_fields
    stored = [f.name for f in fields(UnitRecord) if f.metadata.get("stored", True)]
    assert stored == [n for n in names(UNITS) if n != "current"]
    # a field kept out of the store (the unit's warnings for the run's output) is named
    assert [f.name for f in fields(UnitRecord) if not f.metadata.get("stored", True)] == ["notes"]
    for column in RESULTS:  # results()'s documented columns are the contract's
        assert f"``{column.name}`` ({column.kind}): {column.meaning}" in results.__doc__
    assert contract.RunData is RunData
