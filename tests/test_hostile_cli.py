"""Hostile inputs a new user tried in issue 21.3 that the other hostile-input files do not
cover: each gives one clear line (no traceback), exit 2, and nothing computed. Covered
elsewhere: plugin files missing / with a syntax error / raising at import and garbage or
damaged stores (test_hostile_runs.py), ``--out`` a file (test_hostile_runs.py), a pool worker
killed by SIGKILL (test_executors.py), grids over the limit (test_hostile_input.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from variantlab.cli.main import main

GOOD = """\
name: demo
seeds: [0]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, n_layers: 2,
        drop_rate: 0.0}
measure:
  params: {}
  training: {steps: 2, batch_size: 2, seq_len: 8}
"""


def run(tmp: Path, *args: object) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.output
    assert "Traceback" not in result.output
    return result.exit_code, [x for x in result.output.splitlines() if x.strip()]


# (what, old text, new text, the message at FILE:LINE:COL)
VALUES = [
    ("steps 0", "steps: 2", "steps: 0", "7:21: measure.training.steps: Input should be greater"),
    ("steps -1", "steps: 2", "steps: -1", "7:21: measure.training.steps: Input should be"),
    ("lr negative", "steps: 2", "steps: 2, lr: -0.1", "7:28: measure.training.lr: Input should "
                                                       "be greater than 0"),
    ("lr zero", "steps: 2", "steps: 2, lr: 0", "7:28: measure.training.lr: Input should be"),
    ("seq_len 0", "seq_len: 8", "seq_len: 0", "7:48: measure.training.seq_len: Input should be "
                                              "greater than 0"),
    ("vocab 0", "vocab_size: 64", "vocab_size: 0", "3:34: model.vocab_size: Input should be "
                                                   "greater than 0"),
    ("unicode name, 300 characters", "name: demo", "name: " + "é" * 300,
     "1:7: name: '" + "é" * 20),
    ("grid of 10^6 variants", "measure:", "grid:\n" + "".join(
        f"  {k}: [{', '.join(map(str, range(1, 11)))}]\n"
        for k in ("seq_a", "seq_b", "seq_c", "seq_d", "seq_e", "seq_f")) + "measure:",
     "1,000,000 variants"),
]


@pytest.mark.parametrize(("old", "new", "message"), [v[1:] for v in VALUES],
                         ids=[v[0] for v in VALUES])
def test_bad_values_are_one_located_line(tmp_path, old, new, message):
    exp = tmp_path / "exp.yaml"
    exp.write_text(GOOD.replace(old, new, 1))
    code, lines = run(tmp_path, "run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 2, lines
    assert len(lines) == 1 and message in lines[0], lines
    assert re.match(rf"{re.escape(str(exp))}:\d+:\d+: ", lines[0]) or "variants" in message
    assert not (tmp_path / "runs").exists()


def test_the_300_character_unicode_name_says_why(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(GOOD.replace("name: demo", "name: " + "é" * 300))
    _, lines = run(tmp_path, "run", exp, "--out", tmp_path / "runs")
    assert "cannot name a results folder; use letters, digits" in lines[0], lines


def test_dev_zero_as_the_experiment(tmp_path):
    code, lines = run(tmp_path, "run", "/dev/zero", "--out", tmp_path / "runs")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("/dev/zero: ") and "too large for an experiment file" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_folder_given_as_the_experiment(tmp_path):
    code, lines = run(tmp_path, "run", tmp_path, "--out", tmp_path / "runs")
    assert code == 2, lines
    assert f"'{tmp_path}' is a directory" in " ".join(lines), lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("where", ["under a file", "a folder", "no such folder"])
def test_an_unwritable_schema_path(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    target = {"under a file": tmp_path / "afile" / "schema.json", "a folder": tmp_path,
              "no such folder": tmp_path / "nope" / "deeper" / "schema.json"}[where]
    code, lines = run(tmp_path, "schema", "--out", target)
    assert code == 2, lines
    text = " ".join(lines)
    assert ("--out: cannot write" in text and str(target) in text) or "is a directory" in text
    assert not (tmp_path / "afile").is_dir()


def test_out_that_is_a_symlink_loop_says_so(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(GOOD)
    (tmp_path / "one").symlink_to(tmp_path / "two")
    (tmp_path / "two").symlink_to(tmp_path / "one")
    for out in (tmp_path / "one", tmp_path / "one" / "sub"):
        code, lines = run(tmp_path, "run", exp, "--out", out, "--no-report")
        assert code == 2, lines
        assert f"{tmp_path / 'one'} is a symbolic link that loops (it leads back to itself), " \
               "not a folder" in lines[-1] and "fix or remove the link" in lines[-1], lines
        assert "is a file" not in " ".join(lines)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    code, lines = run(tmp_path, "run", exp, "--out", tmp_path / "dangling", "--no-report")
    assert code == 2 and f"to '{tmp_path / 'nowhere'}', which does not exist" in lines[-1]
    # the report's --out says the same
    exp.write_text(GOOD.split("  training:")[0])
    code, lines = run(tmp_path, "run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    code, lines = run(tmp_path, "report", tmp_path / "runs" / "demo", "--out",
                      tmp_path / "one" / "rep")
    assert code == 2 and "symbolic link that loops" in lines[-1], lines


def test_a_truncated_store_is_one_line(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(GOOD.split("  training:")[0])
    code, _ = run(tmp_path, "run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0
    store = tmp_path / "runs" / "demo" / "results.sqlite"
    data = store.read_bytes()
    store.write_bytes(data[: len(data) // 2])  # cut off mid-file, as a full disk or a kill might
    before = store.read_bytes()
    for args in (["run", exp, "--out", tmp_path / "runs", "--no-report"],
                 ["report", tmp_path / "runs" / "demo", "--out", tmp_path / "rep"]):
        code, lines = run(tmp_path, *args)
        assert code == 2, lines
        assert "results.sqlite is not a usable variantlab results store" in lines[-1], lines
        assert "move it away or use another --out" in lines[-1]
    assert store.read_bytes() == before and not (tmp_path / "rep").exists()
