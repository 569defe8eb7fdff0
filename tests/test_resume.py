"""Units that resume mid-training (issue 27.3): a training or dynamics unit killed after a
checkpoint resumes from it and ends with exactly the rows of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import variantlab as vl
from variantlab.config.experiment import load_experiment
from variantlab.data.sources import BatchStream, SyntheticData
from variantlab.executors.runner import run_experiment
from variantlab.probes import checkpoint, run_probe
from variantlab.sweep.units import plan_units

REG = vl.get_registry()
SETTINGS = {"steps": 9, "lr": 3e-3, "batch_size": 2, "seq_len": 8, "device": "cpu",
            "warmup_steps": 2, "schedule": "cosine", "eval_batches": 1}


class Killed(BaseException):
    """Stands for the process dying (raised where no probe code catches it)."""


def killed_at(monkeypatch, draw: int) -> None:
    """The stream's ``draw``-th batch kills the unit (steps before it were done)."""
    original = BatchStream.next

    def next_or_die(self):
        if self.drawn == draw and self.n > 1:
            raise Killed
        return original(self)
    monkeypatch.setattr(BatchStream, "next", next_or_die)


MOE = {"feedforward": {"kind": "moe", "n_experts": 4, "top_k": 2, "bias_update_rate": 0.01}}


@pytest.mark.parametrize("probe", ["training", "dynamics", "training-moe", "training-curve"])
def test_a_unit_killed_after_a_checkpoint_resumes_to_the_same_rows(tmp_path, tiny, monkeypatch,
                                                                   probe):
    spec = {**tiny, "drop_rate": 0.1}  # dropout: the RNG state must come back too
    settings = {**SETTINGS, **({"every": 2} if probe == "dynamics" else {})}
    if probe == "training-moe":  # routing logs and the experts' bias buffers come back too
        spec, probe = {**spec, **MOE}, "training"
    if probe == "training-curve":  # the validation points scored before the kill come back
        settings, probe = {**settings, "eval_every": 2, "eval_tokens": 64}, "training"
    data = SyntheticData(task="recall")
    clean = run_probe(probe, spec, settings, seed=2, data=data, registry=REG)
    monkeypatch.setenv(checkpoint.DIR_VAR, str(tmp_path))
    monkeypatch.setenv(checkpoint.STEPS_VAR, "3")
    with monkeypatch.context() as m:
        killed_at(m, 7)  # after the checkpoints at 3 and 6 steps
        with checkpoint.for_unit("k1"), pytest.raises(Killed):
            run_probe(probe, spec, settings, seed=2, data=data, registry=REG)
    (only,) = tmp_path.glob("*.pt")  # one checkpoint per unit, the last
    assert only.name == "k1.pt"
    assert checkpoint.Checkpoints(only).load()["done"] == 6
    with checkpoint.for_unit("k1"):
        resumed = run_probe(probe, spec, settings, seed=2, data=data, registry=REG)
    assert resumed == clean  # every row, bit for bit
    if settings.get("eval_every"):  # steps 2, 4, 6 before the kill; 8 and 9 after it
        assert [r["step"] for r in clean if r["metric"] == "val_loss_curve"] == [2, 4, 6, 8, 9]
    # and the resumed run did start from the checkpoint: the first 6 batches are not drawn
    drawn = []
    original = BatchStream.next
    monkeypatch.setattr(BatchStream, "next", lambda self: (  # the training stream's draws
        drawn.append(self.drawn) if self.n == SETTINGS["steps"] else None) or original(self))
    with checkpoint.for_unit("k1"):
        run_probe(probe, spec, settings, seed=2, data=data, registry=REG)
    assert drawn[:3] == [6, 7, 8]


def test_checkpoints_by_time_and_none_when_both_triggers_are_off(tmp_path, monkeypatch):
    saver = checkpoint.Checkpoints(tmp_path / "a.pt", every_steps=0, every_seconds=0.05)
    assert not saver.due(1)
    time.sleep(0.06)
    assert saver.due(1)
    saver.save(1, {"x": 1})
    assert not saver.due(2) and saver.load()["done"] == 1
    monkeypatch.setenv(checkpoint.DIR_VAR, str(tmp_path))
    monkeypatch.setenv(checkpoint.STEPS_VAR, "0")
    monkeypatch.setenv(checkpoint.SECONDS_VAR, "0")
    with checkpoint.for_unit("k") as found:
        assert found is None and checkpoint.current() is None
    monkeypatch.delenv(checkpoint.STEPS_VAR)
    monkeypatch.delenv(checkpoint.SECONDS_VAR)
    with checkpoint.for_unit("k") as found:
        assert (found.every_steps, found.every_seconds) == (500, 60.0)  # the defaults
    assert checkpoint.current() is None


EXP = """\
name: demo
seeds: [0]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, n_layers: 2,
        drop_rate: 0.0}
grid: {norm.kind: [layer, rms]}
measure:
  training: {steps: STEPS, batch_size: 2, seq_len: 8, eval_batches: 1}
"""


def test_a_run_removes_checkpoints_when_units_are_stored_and_keys_ignore_them(tmp_path,
                                                                             monkeypatch):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXP.replace("STEPS", "4"))
    exp = load_experiment(exp_file)
    keys = [u.key for u in plan_units(exp)]
    folder = tmp_path / "runs" / "demo" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "0123stale.pt").write_bytes(b"from a unit no longer in the run")
    monkeypatch.setenv(checkpoint.STEPS_VAR, "1")
    written = []
    original = checkpoint.Checkpoints.save
    monkeypatch.setattr(checkpoint.Checkpoints, "save", lambda self, done, state: (
        written.append((self.path, done)), original(self, done, state)))
    summary = run_experiment(exp, tmp_path / "runs")
    assert summary.ok
    assert {p.name for p, _ in written} == {f"{k}.pt" for k in keys}
    assert sorted({d for _, d in written}) == [1, 2, 3]
    assert list(folder.iterdir()) == []  # stored units leave none; the stale one went too
    assert [u.key for u in plan_units(load_experiment(exp_file))] == keys
    assert checkpoint.DIR_VAR not in os.environ


def test_a_run_keeps_only_what_its_units_can_use_in_the_checkpoint_folder(tmp_path):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXP.replace("STEPS", "4"))
    exp = load_experiment(exp_file)
    keys = [u.key for u in plan_units(exp)]
    rms = next(u.key for u in plan_units(exp) if u.variant.name != exp.variants[0].name)
    folder = tmp_path / "runs" / "demo" / "checkpoints"
    folder.mkdir(parents=True)
    files = {
        "old.pt": False, "old.weights": False,  # keys no longer planned
        f"{rms}.pt": True,  # the variant --only leaves out: still planned, still usable
        f"{rms}.weights": True,
        f".{keys[0]}.weights.x1.tmp": False,  # this run's key: a write that was cut off
        ".other.pt.x2.tmp": True,  # another run's key, fresh: it may be writing it now
        ".other.weights.x3.tmp": False,  # another run's, hours old: left from a kill
        "notes.txt": True,  # not the folder's kind of file
    }
    for name in files:
        (folder / name).write_bytes(b"x")
    hours_ago = time.time() - 2 * checkpoint.STALE_TMP_S
    os.utime(folder / ".other.weights.x3.tmp", (hours_ago, hours_ago))
    summary = run_experiment(exp, tmp_path / "runs", only=[exp.variants[0].name])
    assert summary.ok
    assert {p.name for p in folder.iterdir()} == {n for n, kept in files.items() if kept}


def frame_rows(run: Path):
    frame = vl.results(run).drop(columns=["run"], errors="ignore")
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


@pytest.mark.slow
def test_a_killed_3000_step_unit_resumes_and_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL a `variantlab run` in the middle of a 3,000-step unit; the rerun resumes it
    from its checkpoint, and the rows equal those of a run never killed."""
    killed_midway(tmp_path, 3000, 250)


def killed_midway(tmp_path: Path, steps: int, every: int) -> None:
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXP.replace("STEPS", str(steps)).replace("[layer, rms]", "[layer]"))
    env = {**os.environ, checkpoint.STEPS_VAR: str(every), checkpoint.SECONDS_VAR: "0"}
    command = [sys.executable, "-m", "variantlab", "run", str(exp_file), "--no-report"]
    clean = subprocess.run([*command, "--out", str(tmp_path / "clean")], env=env,
                           capture_output=True, text=True, timeout=1200)
    assert clean.returncode == 0, clean.stderr
    folder = tmp_path / "killed" / "demo" / "checkpoints"
    proc = subprocess.Popen([*command, "--out", str(tmp_path / "killed")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(folder.glob("*.pt")) if folder.is_dir() else []
        if found and checkpoint.Checkpoints(found[0]).load() is not None \
                and checkpoint.Checkpoints(found[0]).load()["done"] >= steps // 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be killed mid-way"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (left,) = folder.glob("*.pt")
    done = checkpoint.Checkpoints(left).load()["done"]
    assert steps // 2 <= done < steps
    again = subprocess.run([*command, "--out", str(tmp_path / "killed")], env=env,
                           capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stderr
    assert list(folder.glob("*.pt")) == []
    killed, fresh = frame_rows(tmp_path / "killed" / "demo"), frame_rows(tmp_path / "clean" / "demo")
    assert killed.equals(fresh)


DIES_ONCE = '''
import os
import signal
from pathlib import Path
from typing import Literal

from torch import nn

import variantlab

CALLS = [0]


class DiesOnceSpec(variantlab.ComponentSpec):
    kind: Literal["dies_once"] = "dies_once"


class DiesOnce(nn.Module):
    """An identity norm whose process dies at its 30th call, once (a marker file remembers)."""

    def forward(self, x):
        CALLS[0] += 1
        marker = Path(os.environ["DIES_ONCE_MARKER"])
        if CALLS[0] == 30 and not marker.exists():
            marker.write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)
        return x


@variantlab.hookimpl
def register_norms(register):
    register("dies_once", DiesOnceSpec, lambda spec, dim: DiesOnce())
'''


@pytest.mark.slow
def test_a_unit_whose_pool_worker_died_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """The pool's worker is killed mid-training (SIGKILL at the 30th norm call: step 6 of
    12, 5 norms a step); the unit fails, keeps its checkpoint (step 5) and the rerun resumes
    it: the rows equal a run that never died."""
    (tmp_path / "dies.py").write_text(DIES_ONCE)
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXP.replace("STEPS", "12").replace("grid: {norm.kind: [layer, rms]}",
                                                           "plugins: [dies.py]")
                        .replace("drop_rate: 0.0}", "drop_rate: 0.0, norm: {kind: dies_once}}"))
    monkeypatch.setenv(checkpoint.STEPS_VAR, "5")
    from conftest import invoke

    monkeypatch.setenv("DIES_ONCE_MARKER", str(tmp_path / "clean-marker"))
    (tmp_path / "clean-marker").write_text("never dies")
    assert invoke("run", exp_file, "--out", tmp_path / "clean", "--no-report").exit_code == 0
    monkeypatch.setenv("DIES_ONCE_MARKER", str(tmp_path / "marker"))
    pool = ["--executor", "pool", "--workers", "1"]
    first = invoke("run", exp_file, "--out", tmp_path / "pool", "--no-report", *pool)
    assert first.exit_code == 1 and "worker process died" in first.output, first.output
    (left,) = (tmp_path / "pool" / "demo" / "checkpoints").glob("*.pt")
    assert checkpoint.Checkpoints(left).load()["done"] == 5
    again = invoke("run", exp_file, "--out", tmp_path / "pool", "--no-report", *pool)
    assert again.exit_code == 0, again.output
    assert not list((tmp_path / "pool" / "demo" / "checkpoints").glob("*.pt"))
    assert frame_rows(tmp_path / "pool" / "demo").equals(frame_rows(tmp_path / "clean" / "demo"))
