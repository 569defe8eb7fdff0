"""Issue 10 item 4: runs are never pooled by accident.

Two runs of one experiment (same name) stay apart in a report and in ``results()``; one run
folder given several times, in several spellings, counts once; the ``--out`` folder of
``variantlab run`` (a folder of run folders) is read as every run in it.
"""

import os
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import variantlab
from variantlab.cli.main import main
from variantlab.store.runs import RunPathError, find_runs, unique_labels

MODEL = ("{family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, "
         "n_layers: 2, drop_rate: 0.0}")


def write_exp(folder: Path, name: str, seeds: str) -> Path:
    text = (f"name: {name}\nseeds: {seeds}\nmodel: {MODEL}\n"
            "grid:\n  residual.kind: [pre_norm, post_norm]\nbaseline: base\n"
            "measure:\n  params: {}\n")
    path = folder / f"{name}-{len(seeds)}.yaml"
    path.write_text(text)
    return path


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The experiment ``same`` run twice: into A with seeds 0, 1 and into B with 0, 1, 2."""
    root = tmp_path_factory.mktemp("runs")
    for out, seeds in (("A", "[0, 1]"), ("B", "[0, 1, 2]")):
        result = invoke("run", write_exp(root, "same", seeds), "--out", root / out,
                        "--no-report")
        assert result.exit_code == 0, result.output
    return root


def summary_of(path: Path) -> pd.DataFrame:
    return pd.read_csv(path / "summary.csv", keep_default_na=False)


def test_two_same_name_runs_stay_apart(two_runs, tmp_path):
    """What it must show 4: variants listed once per run, seed counts right."""
    out = tmp_path / "report"
    result = invoke("report", two_runs / "A" / "same", two_runs / "B" / "same", "--out", out)
    assert result.exit_code == 0, result.output
    summary = summary_of(out)
    variants = list(dict.fromkeys(summary["variant"]))
    assert variants == ["A/same/residual=pre_norm", "A/same/residual=post_norm",
                        "B/same/residual=pre_norm", "B/same/residual=post_norm"]
    totals = summary[summary["metric"] == "total"].set_index("variant")
    assert totals["n"].to_dict() == {"A/same/residual=pre_norm": 2,
                                     "A/same/residual=post_norm": 2,
                                     "B/same/residual=pre_norm": 3,
                                     "B/same/residual=post_norm": 3}
    assert (totals["mean"] == 30_400).all()  # 2048 + 1024 + 2 x 12608 + 64 + 2048: the same in both runs
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "## Run: A/same" in md and "## Run: B/same" in md
    assert "| variant | run | residual.kind |" in md
    assert "| A/same/residual=pre\\_norm (baseline) | A/same | pre\\_norm |" in md
    assert "variantlab report: same (2 runs)" in md
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("<h2>Run: ") == 2


def test_one_run_given_in_several_spellings_counts_once(two_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(two_runs)
    spellings = ["A/same", "A/same/", "./A/same", "A/same/results.sqlite",
                 str(two_runs / "A" / "same"), "B/same", "B/../B/same"]
    result = invoke("report", *spellings, "--out", tmp_path / "many")
    assert result.exit_code == 0, result.output
    result = invoke("report", "A/same", "B/same", "--out", tmp_path / "two")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "many" / "summary.csv").read_text() == \
        (tmp_path / "two" / "summary.csv").read_text()
    refs = find_runs(spellings)
    assert [r.label for r in refs] == ["A/same", "B/same"]
    only_a = invoke("report", "A/same", "./A/same/", "--out", tmp_path / "one")
    assert only_a.exit_code == 0, only_a.output
    summary = summary_of(tmp_path / "one")
    assert list(dict.fromkeys(summary["variant"])) == ["residual=pre_norm", "residual=post_norm"]
    assert set(summary.loc[summary["metric"] == "total", "n"]) == {2}


def test_out_folder_takes_every_run_in_it(tmp_path):
    runs = tmp_path / "runs"
    for name, seeds in (("first", "[0]"), ("second", "[0, 1]")):
        result = invoke("run", write_exp(tmp_path, name, seeds), "--out", runs, "--no-report")
        assert result.exit_code == 0, result.output
    result = invoke("report", runs)
    assert result.exit_code == 0, result.output
    summary = summary_of(runs / "report")  # the default: OUT/report
    n = summary[summary["metric"] == "total"].set_index("variant")["n"].to_dict()
    assert n == {"first/residual=pre_norm": 1, "first/residual=post_norm": 1,
                 "second/residual=pre_norm": 2, "second/residual=post_norm": 2}
    # the report folder written into runs/ is no run: a second report reads the same two
    assert invoke("report", runs).exit_code == 0
    assert summary_of(runs / "report").equals(summary)

    frame = variantlab.results(runs)
    assert list(frame.columns)[-1] == "run"
    counts = frame[frame["metric"] == "total"].groupby("run")["seed"].nunique().to_dict()
    assert counts == {"first": 1, "second": 2}
    one = variantlab.results(runs / "second")
    assert set(one["run"]) == {"second"}
    assert one.drop(columns="run").equals(
        frame[frame["run"] == "second"].drop(columns="run").reset_index(drop=True))


def test_results_of_two_same_name_runs_carry_the_run(two_runs):
    frame = variantlab.results([two_runs / "A" / "same", two_runs / "B" / "same",
                                two_runs / "A" / "same" / "results.sqlite"])
    seeds = frame[frame["metric"] == "total"].groupby(["run", "variant"])["seed"].nunique()
    # results() keeps the stored names (reports label variants, :mod:`variantlab.report.labels`)
    assert seeds.to_dict() == {("A/same", "base"): 2, ("A/same", "residual.kind=post_norm"): 2,
                               ("B/same", "base"): 3, ("B/same", "residual.kind=post_norm"): 3}


def test_results_on_a_folder_without_runs_names_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunPathError, match="empty: no results store .* and no run folders"):
        variantlab.results(tmp_path / "empty")
    with pytest.raises(FileNotFoundError,
                       match="nowhere: no results store: no such file or folder"):
        variantlab.results(tmp_path / "nowhere")


def test_unique_labels_lengthen_only_what_clashes():
    stores = [Path("/x/a/runs/exp/results.sqlite"), Path("/x/b/runs/exp/results.sqlite"),
              Path("/x/a/runs/other/results.sqlite")]
    assert unique_labels(stores) == ["a/runs/exp", "b/runs/exp", "other"]
    assert unique_labels(stores[:1]) == ["exp"]


def test_symlinked_run_counts_once(two_runs, tmp_path):
    link = tmp_path / "link"
    os.symlink(two_runs / "A" / "same", link)
    refs = find_runs([two_runs / "A" / "same", link])
    assert len(refs) == 1 and refs[0].label == "same"


def test_baseline_named_in_several_runs_asks_which(two_runs, tmp_path):
    result = invoke("report", two_runs / "A" / "same", two_runs / "B" / "same",
                    "--baseline", "base", "--out", tmp_path / "r")
    assert result.exit_code == 2
    assert ("'base' is in several runs; choose one of: A/same/residual=pre_norm, "
            "B/same/residual=pre_norm") in result.output
    result = invoke("report", two_runs / "A" / "same", two_runs / "B" / "same",
                    "--baseline", "B/same/residual=pre_norm", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    summary = summary_of(tmp_path / "r")
    ratio = summary[(summary["metric"] == "total")
                    & (summary["variant"] == "A/same/residual=pre_norm")]
    assert ratio["baseline_mean"].tolist() == [30_400]
