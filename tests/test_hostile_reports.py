"""Hostile input to ``variantlab report`` (issue 10, items 4 and 8): every bad path, store,
baseline or --out is one message naming it, with exit code 2 and no traceback, before
anything is written; odd but valid input (a run given twice, hostile variant names) gives a
report whose CSV is safe in a spreadsheet and whose HTML and Markdown are escaped."""

import csv
import io
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import store_of

from variantlab.cli.main import main
from variantlab.report.frame import visible
from variantlab.report.render import browse_script
from variantlab.report.tables import csv_safe, summary_csv
from variantlab.testing.sample import sample_run

HOSTILE = ["=HYPERLINK(\"http://evil.example\",\"x\")", "+1+cmd|' /C calc'!A0", "-2+3",
           "@SUM(A1:A2)", "\tTabbed", "<script>alert(1)</script>"]


@pytest.fixture
def good(tmp_path) -> Path:
    return store_of(sample_run(fail=None, diverge=None), tmp_path / "runs" / "good")


def _missing(tmp, good):
    return [tmp / "nowhere"], "nowhere: no results store: no such file or folder"


def _empty_folder(tmp, good):
    (tmp / "empty").mkdir()
    return [tmp / "empty"], "empty: no results store (results.sqlite) and no run folders"


def _text_file(tmp, good):
    (tmp / "notes.txt").write_text("not a database\n")
    return [tmp / "notes.txt"], "notes.txt: not a results store"


def _garbage_store(tmp, good):
    (tmp / "junk").mkdir()
    (tmp / "junk" / "results.sqlite").write_bytes(b"\x00garbage" * 100)
    return [tmp / "junk"], "junk/results.sqlite: not a results store"


def _empty_store(tmp, good):
    (tmp / "zero").mkdir()
    (tmp / "zero" / "results.sqlite").write_bytes(b"")
    return [tmp / "zero"], "zero/results.sqlite: not a results store"


def _folder_of_non_runs(tmp, good):
    for name in ("a", "b"):
        (tmp / "outs" / name).mkdir(parents=True)
    return [tmp / "outs"], "outs: no results store (results.sqlite) and no run folders"


def _store_path_missing(tmp, good):
    return [good / "results.sqlite", tmp / "gone" / "results.sqlite"], \
        "gone/results.sqlite: no results store: no such file or folder"


def _good_then_missing(tmp, good):
    return [good, tmp / "typo"], "typo: no results store: no such file or folder"


def _unknown_baseline(tmp, good):
    return [good, "--baseline", "nope"], "--baseline 'nope': no such variant; choose one of"


def _out_is_a_file(tmp, good):
    (tmp / "taken").write_text("x")
    return [good, "--out", tmp / "taken"], "taken' is a file"


def _out_under_a_file(tmp, good):
    (tmp / "blocker").write_text("x")
    return [good, "--out", tmp / "blocker" / "deeper"], "blocker is a file, not a folder"


def _bad_plugin(tmp, good):
    return [good, "--plugin", tmp / "noplugin.py"], "noplugin.py"


CASES = {
    "missing folder": _missing,
    "empty folder": _empty_folder,
    "a text file": _text_file,
    "a store that is not SQLite": _garbage_store,
    "a zero-byte store": _empty_store,
    "a folder of folders without runs": _folder_of_non_runs,
    "a missing results.sqlite": _store_path_missing,
    "a good run and a typo": _good_then_missing,
    "unknown --baseline": _unknown_baseline,
    "--out is a file": _out_is_a_file,
    "--out under a file": _out_under_a_file,
    "a plugin file that does not exist": _bad_plugin,
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_report_input_is_one_message_and_exit_2(case, tmp_path, good):
    args, message = CASES[case](tmp_path, good)
    result = CliRunner().invoke(main, ["report", *map(str, args)])
    assert result.exit_code == 2, result.output
    assert message in result.output.replace("\n", " ") or message in result.output
    assert "Traceback" not in result.output
    assert not (good / "report").exists()  # nothing written, not even for the good run


def test_no_run_at_all_is_a_usage_error():
    result = CliRunner().invoke(main, ["report"])
    assert result.exit_code == 2 and "Missing argument 'RUNS...'" in result.output
    assert "Traceback" not in result.output


def test_the_same_run_twice_is_one_run(tmp_path, good, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["report", "runs/good", "./runs/good/",
                                       "runs/good/results.sqlite", "--out", "r"])
    assert result.exit_code == 0, result.output
    summary = pd.read_csv(tmp_path / "r" / "summary.csv")
    assert list(dict.fromkeys(summary["variant"])) == ["pre_norm", "post_norm", "batch"]
    assert set(summary.loc[summary["metric"] == "total", "n"]) == {2}


@pytest.fixture
def hostile_report(tmp_path) -> Path:
    variants = [(name, {"norm.eps": 1e-5 * (i + 1)}, 1.0 + 0.1 * i)
                for i, name in enumerate(HOSTILE)]
    run = sample_run(variants, fail=None, diverge=None)
    store_of(run, tmp_path / "runs" / "evil")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "runs" / "evil")])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return tmp_path / "runs" / "evil" / "report"


def test_hostile_names_are_neutralised_in_the_csv(hostile_report):
    text = (hostile_report / "summary.csv").read_text(encoding="utf-8")
    cells = [c for row in csv.reader(io.StringIO(text)) for c in row]
    for name in map(visible, HOSTILE):  # the tab shown as "\\t" (issue 38 C9)
        if name[0] in "=+-@\t":
            assert name not in cells  # never a bare cell a spreadsheet would evaluate
            assert "'" + name in cells
    assert "\\tTabbed" in cells and "\tTabbed" not in cells
    for c in cells:
        assert not c.startswith(("=", "+", "@", "\t", "\r")), c
        assert not c.startswith("-") or c[1:2].isdigit() and float(c) < 0, c
    summary = pd.read_csv(io.StringIO(text))
    assert pd.api.types.is_float_dtype(summary["mean"]) and summary["mean"].notna().all()
    assert "'<script>alert(1)</script>" not in cells  # no quote where none is needed


def test_hostile_names_are_escaped_in_html_and_markdown(hostile_report):
    html = (hostile_report / "report.html").read_text(encoding="utf-8")
    # the page's one script is the package's own; the name's script is text
    assert html.count("<script") == 1 and "<script>\n" + browse_script() in html
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'HYPERLINK(&#34;http://evil.example&#34;' in html or \
        "HYPERLINK(&quot;http://evil.example&quot;" in html
    md = (hostile_report / "report.md").read_text(encoding="utf-8")
    assert "<script>" not in md and "&lt;script&gt;" in md


def test_csv_safe_keeps_numbers_numbers():
    frame = pd.DataFrame({"variant": ["=1+2", "-1.5", "ok", "-x", "@a", "\rb", "+7"],
                          "mean": [-1.5, 2.0, -0.25, 3.0, 4.0, 5.0, -6e-9]})
    out = csv_safe(frame)
    assert out["variant"].tolist() == ["'=1+2", "-1.5", "ok", "'-x", "'@a", "'\nb", "+7"]
    assert out["mean"].tolist() == frame["mean"].tolist()
    summary = frame.assign(section="s", metric="=m", label="-l", unit="")
    lines = list(csv.reader(io.StringIO(summary_csv(summary))))
    assert lines[1] == ["'=1+2", "-1.5", "s", "'=m", "'-l", ""]
    assert lines[6] == ["'\nb", "5", "s", "'=m", "'-l", ""]
    assert lines[7] == ["+7", "-6e-09", "s", "'=m", "'-l", ""]
