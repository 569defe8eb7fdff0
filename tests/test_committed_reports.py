"""Every committed report keeps its words to its verdict rows (issue 37's "done when").

Read from the committed files only (no run, no regeneration): each report has
verdicts.csv and seeds.csv; its reading has at most MAX_READING bullets; every verdict
word the reading says is carried by one of its rows; and the tuned table's groups agree
with the pair rows of each condition (two variants share a letter exactly when no clear
verdict separates them).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from variantlab.report.findings_table import EXPORT_FILE, running_time
from variantlab.report.words import MAX_READING

ROOT = Path(__file__).resolve().parent.parent
REPORTS = sorted(p.parent for p in (ROOT / "reports").glob("*/report.md"))
CLEAR = ("lower", "higher")

# a phrase of the reading and the row verdict that must exist for it to be said
WORDS = {
    r"\blower than\b": ("lower",),
    r"\bhigher than\b": ("higher",),
    r"\bequal within ±": ("equal within",),
    r"\bnot clearly different\b": ("not clearly different",),
}


def reading(report: Path) -> list[str]:
    """The bullets of the report's Reading section, markdown escapes removed."""
    text = (report / "report.md").read_text(encoding="utf-8")
    section = re.search(r"^## Reading\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert section, f"{report.name}: report.md has no Reading section"
    return [line[2:].replace("\\", "") for line in section.group(1).splitlines()
            if line.startswith("- ")]


def test_every_committed_report_has_its_claims_and_seeds_tables():
    assert len(REPORTS) >= 20
    missing = [r.name for r in REPORTS
               if not ((r / "verdicts.csv").exists() and (r / "seeds.csv").exists())]
    assert missing == [], f"reports without verdicts.csv or seeds.csv: {missing}"


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.name)
def test_the_reading_is_short_and_says_only_verdicts_its_rows_carry(report: Path):
    bullets = reading(report)
    assert 1 <= len(bullets) <= MAX_READING, (report.name, len(bullets))
    rows = pd.read_csv(report / "verdicts.csv")
    carried = set(rows["verdict"].dropna().astype(str))
    for pattern, verdicts in WORDS.items():
        said = [b for b in bullets if re.search(pattern, b)]
        if said:
            assert any(v.startswith(verdicts) for v in carried), (
                f"{report.name}: the reading says {pattern!r} but no row carries it: "
                f"{said[0][:160]}")


def _matches(frame: pd.DataFrame, condition: str) -> pd.Series:
    """Rows of a tuned table in ``condition`` ("k=v, k2=v2"; a column named k or ending in
    .k), all rows when the condition is empty."""
    keep = pd.Series(True, index=frame.index)
    for part in filter(None, (p.strip() for p in condition.split(", "))):
        key, _, value = part.partition("=")
        cols = [c for c in frame.columns if c == key or c.endswith("." + key)]
        assert cols, f"no column for {key!r} in tuned.csv"
        col = frame[cols[0]].astype(str)
        try:
            keep &= pd.to_numeric(frame[cols[0]], errors="coerce") == float(value)
        except ValueError:
            keep &= col == value
    return keep


def group_mismatches(tuned: pd.DataFrame, rows: pd.DataFrame) -> tuple[int, list[str]]:
    """How many pair rows were checked against the tuned table's groups, and those where
    sharing a letter disagrees with the verdict (a clear verdict must separate the groups,
    any other must not)."""
    pairs = rows[(rows["kind"] == "pair") & rows["verdict"].notna()]
    checked, wrong = 0, []
    for row in pairs.itertuples():
        condition = row.condition if isinstance(row.condition, str) else ""
        here = tuned[_matches(tuned, condition)].set_index("variant")
        if row.a not in here.index or row.b not in here.index:
            continue
        ga, gb = str(here.loc[row.a, "group"]), str(here.loc[row.b, "group"])
        if "unresolved" in (ga, gb) or row.verdict == "unresolved":
            continue
        checked += 1
        if bool(set(ga) & set(gb)) != (row.verdict not in CLEAR):
            wrong.append(f"[{condition}] {row.a} ({ga}) vs {row.b} ({gb}): {row.verdict}")
    return checked, wrong


@pytest.mark.parametrize(
    "report", [r for r in REPORTS if (r / "tuned.csv").exists()], ids=lambda p: p.name)
def test_the_tuned_groups_agree_with_the_pair_rows(report: Path):
    tuned = pd.read_csv(report / "tuned.csv")
    rows = pd.read_csv(report / "verdicts.csv")
    checked, wrong = group_mismatches(tuned, rows)
    assert wrong == [], f"{report.name}: {wrong}"
    assert checked or not (rows["kind"] == "pair").any(), f"{report.name}: nothing matched"


def test_a_group_that_hides_a_clear_verdict_is_caught():
    # layernorm-vs-batchnorm: batch is clearly worse than layer and than rms, so it shares no
    # letter with them; give batch their group and the check must name both pairs
    report = ROOT / "reports" / "layernorm-vs-batchnorm"
    tuned = pd.read_csv(report / "tuned.csv")
    rows = pd.read_csv(report / "verdicts.csv")
    pairs = rows[rows["kind"] == "pair"].set_index(["a", "b"])["verdict"]
    assert pairs[("norm=layer", "norm=batch")] == "lower", "the fixture's verdict moved"
    assert pairs[("norm=batch", "norm=rms")] == "higher", "the fixture's verdict moved"
    assert group_mismatches(tuned, rows) == (3, [])
    tuned.loc[tuned["variant"] == "norm=batch", "group"] = "a"
    checked, wrong = group_mismatches(tuned, rows)
    assert checked == 3 and len(wrong) == 2
    assert "norm=layer (a) vs norm=batch (a): lower" in wrong[0]
    assert "norm=batch (a) vs norm=rms (a): higher" in wrong[1]


def last_runs() -> dict[str, list[str]]:
    """docs/reports.md's table of each committed report's last run: name -> its cells."""
    text = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
    section = re.search(r"^### Each report's last run\n(.*?)(?=^#|\Z)", text, flags=re.M | re.S)
    assert section, "docs/reports.md has no 'Each report's last run' section"
    rows = [line.strip("|").split(" | ") for line in section.group(1).splitlines()
            if line.startswith("| ") and not line.startswith("| report |")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_the_docs_table_of_last_runs_quotes_the_committed_exports():
    # the hand-written history table says when each report last ran and how long it took;
    # both come from the export committed beside the report, so the table cannot drift
    table = last_runs()
    exported = sorted(p.parent.name for p in (ROOT / "reports").glob(f"*/{EXPORT_FILE}"))
    assert sorted(table) == exported
    for name in exported:
        folder = ROOT / "reports" / name
        units = json.loads(gzip.decompress((folder / EXPORT_FILE).read_bytes()))["units"]
        first = min(s for s in units["started_at"] if s)
        assert table[name][0] == first[:16].replace("T", " "), name
        assert table[name][1] == running_time(folder), name
