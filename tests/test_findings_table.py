"""Issue 37 item 8: the findings table is generated from the committed reports
(``variantlab findings reports/``); README.md and docs/findings.md hold exactly it; every
experiment asks one question; a ``note:`` quotes only numbers its report's CSVs hold."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, invoke
from pydantic import ValidationError

from variantlab.config.experiment import ExperimentSpec
from variantlab.report.findings_table import (
    NOT_YET,
    budget,
    csv_numbers,
    duration,
    findings,
    findings_markdown,
    short,
    sizes,
    table_in,
    unquoted_numbers,
    verdict_cell,
)
from variantlab.store.export import EXPORT_FILE

VERDICT_COLUMNS = ("condition,a,b,metric,a_setting,b_setting,estimate,low,high,n_seeds,"
                   "verdict,caveats")
VERDICTS = f"""{VERDICT_COLUMNS}
emb_dim=32,rms,layer,test_loss,lr=0.01,lr=0.01,-0.0871,-0.105,-0.0692,3,lower,
emb_dim=32,batch,layer,test_loss,lr=0.003,lr=0.01,0.00213,-0.0114,0.0143,3,not clearly different,tie-broken
emb_dim=32,batch,rms,test_loss,lr=0.003,lr=0.01,0.0024,-0.0101,0.0151,3,unresolved,best at an edge
emb_dim=64,rms,layer,test_loss,lr=0.01,lr=0.03,0.00043,-0.0061,0.0069,3,equal within ±0.01,\
still improving (1 of 3)
emb_dim=64,rms,layer,val_loss,lr=0.01,lr=0.03,0.5,0.4,0.6,3,higher,
"""
EXPERIMENT = """name: norms
question: Does RMSNorm or BatchNorm change a tiny GPT's loss against LayerNorm?
seeds: [0, 1, 2]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, n_layers: 2}
grid:
  emb_dim: [32, 64]
  norm.kind: [layer, rms, batch]
  measure.training.lr: {values: [0.003, 0.01, 0.03], extend: 1}
measure:
  params: {}
  training: {steps: 200, batch_size: 8}
"""


def committed_table() -> str:
    return findings_markdown(findings(ROOT / "reports", ROOT / "experiments"))


@pytest.mark.parametrize("page", ["README.md", "docs/findings.md"])
def test_the_page_holds_the_generated_findings_table(page):
    """Run `variantlab findings reports/ --write README.md --write docs/findings.md` after
    a report changes."""
    assert table_in((ROOT / page).read_text()) == committed_table()


def test_the_committed_table_has_a_row_per_report_and_quotes_no_number_it_lacks():
    table = committed_table().splitlines()[2:]
    folders = sorted(p.parent.name for p in (ROOT / "reports").glob("*/summary.csv"))
    assert [row.split(" | ")[0].strip("| ") for row in table] == folders
    for row, folder in zip(table, folders):
        cells = row.split(" | ")
        if NOT_YET in cells[2]:  # no verdict rows yet: no numbers in the row
            assert cells[3:] == ["-", "-", "- |"]
            continue
        assert unquoted_numbers(cells[2], csv_numbers(ROOT / "reports" / folder)) == []


def test_every_experiment_asks_one_question():
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        question = yaml.safe_load(path.read_text()).get("question", "")
        assert question and "\n" not in question and question.endswith("?"), path.name


def test_a_question_is_one_line():
    base = {"name": "x", "model": {"family": "gpt"}}
    assert ExperimentSpec(**base, question="  Is it?  ").question == "Is it?"
    with pytest.raises(ValidationError, match="one line"):
        ExperimentSpec(**base, question="Is it?\nAnd this?")
    with pytest.raises(ValidationError, match="at most 200"):
        ExperimentSpec(**base, question="x" * 201)


def rows(text: str) -> list[dict]:
    import io

    import pandas as pd

    frame = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
    return frame.to_dict("records")


def test_the_verdict_cell_renders_each_condition_from_the_rows():
    cell = verdict_cell(rows(VERDICTS), "loss")
    assert cell == (
        "emb_dim=32: rms vs layer: lower -0.0871 [-0.105, -0.0692]; "
        "not clearly different: batch vs layer (tie-broken); "
        "unresolved: batch vs rms (best at an edge) — "
        "emb_dim=64: rms vs layer: equal within ±0.01 0.000430 [-0.00610, 0.00690] "
        "(still improving (1 of 3))")
    assert "val_loss" not in cell and "0.5" not in cell  # the headline test metric only


def test_the_cell_falls_back_to_every_metric_and_names_them():
    text = (VERDICT_COLUMNS + "\n,naive,sdpa,forward_median_s,,,1.13,1.11,1.19,3,higher,"
            "timed on a busy machine\n")
    cell = verdict_cell(rows(text), "loss")
    assert cell == "naive vs sdpa: higher 1.13 [1.11, 1.19] (timed on a busy machine)"
    recall = VERDICT_COLUMNS + "\nw64,attn,linear,test_recall_accuracy,,,0.74,0.7,0.78,3,higher,\n"
    assert verdict_cell(rows(recall), "recall_accuracy") == \
        "w64: attn vs linear: higher 0.740 [0.700, 0.780]"


def test_the_pairs_at_other_lengths_follow_the_headline_with_their_metric():
    text = (VERDICT_COLUMNS + ",kind\n"
            "w64,rope,nope,test_loss,,,0.001,-0.01,0.01,3,equal within ±0.02,,pair\n"
            "w64,rope,nope,test_loss_at_256,,,0.2,0.1,0.3,3,higher,,length\n"
            "w64,rope,nope,test_loss_at_128,,,0.02,-0.1,0.14,3,not clearly different,,length\n")
    assert verdict_cell(rows(text), "loss") == (
        "w64: rope vs nope (test_loss): equal within ±0.02 0.00100 [-0.0100, 0.0100]; "
        "rope vs nope (test_loss_at_256): higher 0.200 [0.100, 0.300]; "
        "not clearly different (test_loss_at_128): rope vs nope")


def test_lead_and_ranking_rows_do_not_repeat_a_pair_in_the_cell():
    text = (VERDICT_COLUMNS + ",kind\n"
            ",a,b,test_loss,,,0.01,-0.02,0.04,3,not clearly different,,pair\n"
            ",b,a,test_loss,,,-0.01,-0.04,0.02,3,not clearly different,,lead\n"
            ",a,b,val_loss,,,0.01,-0.02,0.04,3,not clearly different,,ranking\n")
    assert verdict_cell(rows(text), "loss") == "not clearly different: a vs b"


def test_averages_stay_out_of_the_cell_beside_per_condition_verdicts():
    text = (VERDICT_COLUMNS + ",kind\n"
            "w32,gelu,relu,test_loss,0.01,0.003,-0.05,-0.08,-0.02,3,lower,,pair\n"
            "averaged,lr=0.01,lr=0.001,test_loss,,,-0.18,-0.22,-0.15,3,lower,"
            "averaged over (activation),average\n")
    assert verdict_cell(rows(text), "loss") == "w32: gelu vs relu: lower -0.0500 [-0.0800, -0.0200]"
    alone = VERDICT_COLUMNS + ",kind\n" + text.splitlines()[2] + "\n"
    assert verdict_cell(rows(alone), "loss") == (
        "averaged: lr=0.01 vs lr=0.001: lower -0.180 [-0.220, -0.150] "
        "(averaged over (activation))")


def test_a_caveat_every_pair_carries_is_said_once():
    text = (VERDICT_COLUMNS + "\n"
            ",pre,post,test_loss,,,-0.5,-0.7,-0.3,3,lower,one rate only (not tuned)\n"
            ",pre,off,test_loss,,,0.01,-0.01,0.03,3,not clearly different,"
            "one rate only (not tuned); still improving (1 of 3)\n")
    assert verdict_cell(rows(text), "loss") == (
        "pre vs post: lower -0.500 [-0.700, -0.300]; not clearly different: pre vs off "
        "(still improving (1 of 3)) (every pair: one rate only (not tuned))")


def test_short_keeps_three_significant_digits():
    assert [short(x) for x in (0.08712, -1.2871, 349.6, 0.0, 1.5e-5, 12.04)] == \
        ["0.0871", "-1.29", "350", "0", "1.50e-05", "12.0"]


def test_numbers_match_a_csv_value_at_the_digits_written():
    values = [0.08712, 2.7904, 349.6, 163009536.0]
    assert unquoted_numbers("0.087 above, 2.79 to 350; 163,009,536 parameters", values) == []
    assert unquoted_numbers("0.088 and 2.80 and `GPT-2`", values) == ["0.088", "2.80"]


def report_folder(tmp_path: Path, note: str = "", verdicts: bool = True) -> Path:
    exps, reports = tmp_path / "experiments", tmp_path / "reports"
    exps.mkdir()
    (reports / "norms").mkdir(parents=True)
    (exps / "norms.yaml").write_text(EXPERIMENT + (f"note: {note}\n" if note else ""))
    folder = reports / "norms"
    (folder / "summary.csv").write_text("variant,metric,mean\nlayer,test_loss,2.7904\n")
    if verdicts:
        (folder / "verdicts.csv").write_text(VERDICTS)
    return folder


def export_with_units(folder: Path) -> None:
    """An export holding only what the running time reads: the units' times."""
    units = {"invocation": ["a", "a", "b"],
             "started_at": ["2026-11-26T07:00:00+00:00", "2026-11-26T07:10:00+00:00",
                            "2026-11-26T09:00:00+00:00"],
             "finished_at": ["2026-11-26T07:05:00+00:00", "2026-11-26T07:20:00+00:00",
                             "2026-11-26T09:05:30+00:00"]}
    (folder / EXPORT_FILE).write_bytes(gzip.compress(json.dumps({"units": units}).encode()))


def test_a_row_holds_question_verdicts_sizes_budget_and_running_time(tmp_path):
    folder = report_folder(tmp_path, note="LayerNorm's test loss is 2.79 here.")
    export_with_units(folder)
    (row,) = findings(folder.parent)
    assert row.question == "Does RMSNorm or BatchNorm change a tiny GPT's loss against LayerNorm?"
    assert row.verdicts.startswith("emb_dim=32: rms vs layer: lower -0.0871")
    assert row.verdicts.endswith(". Note: LayerNorm's test loss is 2.79 here.")
    assert row.sizes == "width 32, 64; 2 layers"
    assert row.budget == "200 steps of batch 8; 3 seeds; lr 0.003, 0.01, 0.03 tuned (+1 beyond an edge)"
    assert row.running == "26 min"  # 20 min of invocation a, 5.5 of b


def test_a_report_without_verdict_rows_says_so_and_quotes_no_number(tmp_path):
    folder = report_folder(tmp_path, note="LayerNorm's test loss is 2.79 here.", verdicts=False)
    export_with_units(folder)
    (row,) = findings(folder.parent)
    assert row.cells()[2:] == [NOT_YET, "-", "-", "-"]
    table = findings_markdown([row])
    assert not re.search(r"\d", table.splitlines()[2].split(" | ", 2)[2])


SEEDS = """variant,compared,condition,setting,chosen,seed,learned,test_recall_accuracy
w20,base,warmup_steps=20,,True,0,True,1
w20,base,warmup_steps=20,,True,1,True,1
w20,base,warmup_steps=20,,True,2,False,0.257324
w200,base,warmup_steps=200,,True,0,True,1
w200,base,warmup_steps=200,,True,1,True,0.998
w200,base,warmup_steps=200,,True,2,True,1
w200,base,warmup_steps=200,lr=0.003,False,0,False,0.2
"""


def test_a_report_that_compares_nothing_gives_each_conditions_headline_and_failed_seeds(
        tmp_path):
    # a pilot: every axis a condition, so its verdicts.csv has no rows; the cell gives the
    # held-out recall per condition from seeds.csv (chosen setting only: the lr=0.003 seed
    # is not counted) and names the seed that did not learn, without a verdict word
    folder = report_folder(tmp_path, verdicts=False)
    (folder / "verdicts.csv").write_text(VERDICT_COLUMNS + "\n")
    (folder / "seeds.csv").write_text(SEEDS)
    exp = tmp_path / "experiments" / "norms.yaml"
    exp.write_text(EXPERIMENT.replace("measure:", "compare_on: recall_accuracy\nvariants:\n"
                                      "  - {name: long, set: {measure.training.steps: 400}}\n"
                                      "measure:"))
    (row,) = findings(folder.parent)
    assert row.verdicts == (
        "nothing compared; warmup_steps=20: test_recall_accuracy 0.752 over 3 seeds (1 of 3 "
        "did not learn: 0.257) — warmup_steps=200: test_recall_accuracy 0.999 over 3 seeds")
    assert row.budget.startswith("200, 400 steps of batch 8; 3 seeds")
    (folder / "seeds.csv").write_text(SEEDS.replace("test_recall_accuracy", "recall_accuracy"))
    assert findings(folder.parent)[0].verdicts == "no verdict rows"  # nothing held out


def test_a_seeds_table_without_its_columns_is_one_line_naming_it(tmp_path):
    folder = report_folder(tmp_path, verdicts=False)
    (folder / "verdicts.csv").write_text(VERDICT_COLUMNS + "\n")
    (folder / "seeds.csv").write_text("seed,test_loss\n0,2.5\n")
    result = invoke("findings", folder.parent)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (f"{folder / 'seeds.csv'}: no column variant, condition; regenerate the report"
            in " ".join(result.output.split()))


def test_sizes_and_rates_count_what_named_variants_set():
    doc = {"model": {"emb_dim": 64, "n_layers": 2}, "grid": {"emb_dim": [64, 32]},
           "seeds": [0], "measure": {"training": {"steps": 1500, "batch_size": 32, "lr": 3e-3}},
           "variants": [{"name": "w128", "set": {"emb_dim": 128, "measure.training.lr": 1e-3}},
                        {"name": "fast", "set": {"measure.training.lr": 1e-2}}]}
    assert sizes(doc) == "width 64, 32, 128; 2 layers"
    assert budget(doc) == "1500 steps of batch 32; 1 seed; lr 0.003, 0.001, 0.01 (named variants)"
    del doc["variants"]
    assert budget(doc) == "1500 steps of batch 32; 1 seed; lr 0.003 (one rate, not tuned)"


def test_a_note_quoting_a_number_its_report_lacks_is_refused(tmp_path):
    folder = report_folder(tmp_path, note="the loss is 2.81 here")
    result = invoke("findings", folder.parent)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert (f"{tmp_path / 'experiments' / 'norms.yaml'}:12:7: note: quotes 2.81, which no CSV "
            f"of {folder} holds") in text
    assert "Traceback" not in result.output


def test_findings_writes_between_the_markers_and_refuses_a_page_without_them(tmp_path):
    folder = report_folder(tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n<!-- findings:start -->\nold rows\n<!-- findings:end -->\nafter\n")
    assert invoke("findings", folder.parent, "--write", page).exit_code == 0
    text = page.read_text()
    assert "old rows" not in text and text.endswith("<!-- findings:end -->\nafter\n")
    assert table_in(text) == findings_markdown(findings(folder.parent))
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    result = invoke("findings", folder.parent, "--write", page, "--write", plain)
    assert result.exit_code == 2 and "no <!-- findings:start -->" in result.output
    assert plain.read_text() == "no markers\n"


def test_findings_of_a_folder_without_reports_is_one_line(tmp_path):
    result = invoke("findings", tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == (f"{tmp_path}: no report folders (NAME/summary.csv) in it; "
                                     "give the folder of committed reports (reports/)")


def test_every_committed_note_quotes_only_numbers_of_its_report():
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        note = yaml.safe_load(path.read_text()).get("note", "")
        folder = ROOT / "reports" / path.stem
        if note and folder.is_dir():
            assert unquoted_numbers(note, csv_numbers(folder)) == [], path.name


def test_a_damaged_export_beside_a_report_is_one_line(tmp_path):
    folder = report_folder(tmp_path)
    (folder / EXPORT_FILE).write_bytes(gzip.compress(b"[1, 2]"))
    result = invoke("findings", folder.parent)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{folder / EXPORT_FILE}: not a results export" in " ".join(result.output.split())


@pytest.mark.parametrize("seconds, text", [(0.0, "under 1 s"), (0.49, "under 1 s"),
                                           (0.5, "under 1 s"), (0.51, "1 s"), (59.4, "59 s"),
                                           (60.0, "1 min"), (89.0, "1 min"), (91.0, "2 min"),
                                           (4740.0, "79 min")])
def test_a_running_time_reads_in_minutes_or_seconds_and_never_as_zero(seconds, text):
    assert duration(seconds) == text
