"""Long budgets without memory blow-ups (issue 27.1): budgets over the bound of steps are
refused before anything runs, the size guard counts what a unit holds besides the model, and
a unit that runs out of memory fails alone."""

from __future__ import annotations

import sqlite3

import pytest
from click.testing import CliRunner

import variantlab as vl
from variantlab.cli.main import main
from variantlab.executors import unit as units
from variantlab.model.specs import parse_model_spec
from variantlab.probes.recipe import MAX_STEPS
from variantlab.probes.training import TrainingSettings
from variantlab.sweep import sizeguard

REG = vl.get_registry()

EXP = """\
name: demo
seeds: [0]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, n_layers: 2,
        drop_rate: 0.0}
GRID
measure:
  training: {steps: 2, batch_size: 2, seq_len: 8, eval_batches: 0}
"""


def cli(*args: object) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.output
    assert "Traceback (most recent" not in result.output
    return result.exit_code, [x for x in result.output.splitlines() if x.strip()]


@pytest.mark.parametrize(("grid", "where", "steps"), [
    ("grid: {measure.training.steps: [5, 1000000000]}", "5:36: grid.measure.training.steps[1]",
     "1,000,000,000 steps"),
    ("grid: {measure.training.tokens: [64, 100000000000]}",
     "5:38: grid.measure.training.tokens[1]", "6,250,000,000 steps (tokens=100,000,000,000 over "
                                              "16 tokens per step"),
    ("grid: {measure.training.tokens_per_param: [1, 1e9]}",
     "5:47: grid.measure.training.tokens_per_param[1]", "1,708,000,000,000 steps"),
], ids=["steps", "tokens", "tokens_per_param"])
def test_a_budget_over_the_bound_is_refused_before_anything_runs(tmp_path, grid, where, steps):
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXP.replace("GRID", grid))
    for command in ("validate", "run"):
        args = [command, exp] + (["--out", tmp_path / "runs"] if command == "run" else [])
        code, lines = cli(*args)
        assert code == 2, lines
        assert len(lines) == 1 and lines[0].startswith(f"{exp}:{where}: "), lines
        assert f"works out to {steps}" in lines[0], lines
        assert f"the bound of {MAX_STEPS:,} steps" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_the_size_guard_counts_the_batch_the_eval_sets_and_the_rows_of_each_step(tiny):
    spec = parse_model_spec(tiny, REG)
    settings = TrainingSettings(steps=1000, batch_size=4, seq_len=16, eval_batches=3)
    fp = sizeguard.footprint(spec, REG, "training", settings, "cpu")
    batch = 4 * 16 * 8 * 2  # int64 inputs and targets, (4, 16) each
    assert fp.held_bytes == batch * (1 + 2 * 3) + 1000 * 2 * sizeguard.ROW_BYTES
    assert fp.total == (fp.param_bytes + fp.buffer_bytes + fp.grad_bytes + fp.optimizer_bytes
                        + fp.activation_bytes + fp.held_bytes)
    assert fp.data_bytes == batch and fp.eval_bytes == batch * 6
    assert fp.rows_bytes == 1000 * 2 * sizeguard.ROW_BYTES
    assert ("batches 1.0 KiB, held-out scoring sets 6.0 KiB, per-step rows 1000.0 KiB over "
            "1,000 steps") in fp.describe()
    # a token budget counts the steps it works out to
    per_param = TrainingSettings(tokens_per_param=2.0, batch_size=4, seq_len=16,
                                 eval_batches=0)
    fp = sizeguard.footprint(spec, REG, "training", per_param, "cpu")
    non_embedding = sum(p.numel() for n, p in vl.build_model(spec, REG).named_parameters()
                        if not n.startswith("embed."))
    steps = -(-2 * non_embedding // 64)
    assert fp.held_bytes == batch + steps * 2 * sizeguard.ROW_BYTES


HUNGRY = """\
import torch
from pydantic import Field
from variantlab import ProbeSettings, hookimpl


class HungrySettings(ProbeSettings):
    how: str = Field("python")


def run(spec, settings, *, seed, registry, **_):
    if settings.how == "python":
        bytearray(2 ** 62)  # MemoryError
    torch.empty(2 ** 52, dtype=torch.uint8)  # torch's allocator refuses
    return []


@hookimpl
def register_probes(register):
    register("hungry", HungrySettings, run, device_free=True)
"""


def test_a_unit_out_of_memory_fails_alone_and_the_run_goes_on(tmp_path):
    (tmp_path / "hungry.py").write_text(HUNGRY)
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXP.replace("GRID", "plugins: [hungry.py]\ngrid: {measure.hungry.how: "
                                       "[python, torch]}")
                   + "  hungry: {}\n")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 1, lines
    con = sqlite3.connect(tmp_path / "runs" / "demo" / "results.sqlite")
    got = con.execute("select probe, status, error, traceback from units "
                      "order by variant, probe").fetchall()
    assert sorted((p, s) for p, s, _, _ in got if p == "hungry") == [("hungry", "failed")] * 2
    assert {s for p, s, _, _ in got if p == "training"} == {"ok"}  # the run went on
    errors = [e for _, s, e, _ in got if s == "failed"]
    assert errors[0].startswith("MemoryError: the unit ran out of memory; use a smaller")
    assert errors[1].startswith("RuntimeError: the unit ran out of memory: [enforce fail")
    assert all("Traceback" in tb for _, s, _, tb in got if s == "failed")
    assert all(any(e[:60] in line for line in lines) for e in errors), lines


def test_a_traceback_that_cannot_be_formatted_for_lack_of_memory_is_a_note(monkeypatch):
    def refuse(*_a, **_k):
        raise MemoryError
    monkeypatch.setattr(units.traceback, "format_exception", refuse)
    try:
        raise MemoryError("full")
    except MemoryError as exc:
        text = units.traceback_text(exc)
    assert text == "MemoryError (the traceback could not be formatted: out of memory)\n"
