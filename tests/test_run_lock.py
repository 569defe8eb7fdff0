"""One writer per run folder (issue 10, item 3): two concurrent `variantlab run`s on one folder,
the second refuses at once naming the first's pid; the first completes with a clean run's
numbers; reading the store while it writes works."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from variantlab.store.store import results
from variantlab.sweep.runfolder import LOCK_FILE

# an activation that waits in forward until the file "go" exists beside it: the first run
# holds its folder for as long as the test needs, and computes the same numbers as tanh
WAITING = '''
import time
from pathlib import Path
from typing import Literal

import torch
from torch import nn

import variantlab

GO = Path(__file__).with_name("go")


class WaitingSpec(variantlab.ComponentSpec):
    kind: Literal["waiting"] = "waiting"


class Waiting(nn.Module):
    def forward(self, x):
        deadline = time.monotonic() + 240
        # the size guard's forward on the meta device (before the run starts) does not wait
        while x.device.type != "meta" and not GO.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return torch.tanh(x)


@variantlab.hookimpl
def register_activations(register):
    register("waiting", WaitingSpec, lambda spec: Waiting())
'''

EXPERIMENT = textwrap.dedent("""\
    name: locked
    seeds: [0, 1]
    model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
            n_layers: 2, drop_rate: 0.0}
    grid:
      activation.kind: [waiting, relu]
    plugins: [waiting.py]
    measure:
      params: {}
      gradients: {batch_size: 2, seq_len: 16, batches: 2}
    """)


def setup(folder: Path, go: bool) -> None:
    folder.mkdir()
    (folder / "waiting.py").write_text(WAITING)
    (folder / "exp.yaml").write_text(EXPERIMENT)
    if go:
        (folder / "go").touch()


def command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "variantlab", "run", str(folder / "exp.yaml"),
            "--out", str(folder / "runs"), "--no-report"]


def values(run_dir: Path) -> pd.DataFrame:
    frame = results(run_dir)
    cols = ["variant", "seed", "probe", "metric", "scope", "name", "layer", "step"]
    return frame.sort_values(cols, na_position="first")[cols + ["value", "status"]] \
        .reset_index(drop=True)


@pytest.mark.slow
def test_second_concurrent_run_refuses_and_the_first_completes(tmp_path):
    setup(tmp_path / "a", go=False)
    first = subprocess.Popen(command(tmp_path / "a"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "a" / "runs" / "locked" / LOCK_FILE
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:
            if lock.is_file() and lock.read_text().strip() == str(first.pid):
                break
            time.sleep(0.1)
        assert lock.read_text().strip() == str(first.pid), "the first run never took the lock"

        second = subprocess.run(command(tmp_path / "a"), capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"another variantlab run (pid {first.pid})" in second.stderr
        assert "runs/locked" in second.stderr and "another --out" in second.stderr
        assert "Traceback" not in second.stdout + second.stderr
        assert "computed" not in second.stdout

        # reading while the first run writes (it waits inside its first gradients unit)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            frame = results(tmp_path / "a" / "runs" / "locked")
            if len(frame):
                break
            time.sleep(0.2)
        assert set(frame.probe) == {"params"} and (frame.status == "ok").all()
    finally:
        (tmp_path / "a" / "go").touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    assert "8 unit(s): 8 computed, 0 stored already, 0 failed" in out
    assert lock.read_text() == ""  # released: no pid left behind

    setup(tmp_path / "b", go=True)
    clean = subprocess.run(command(tmp_path / "b"), capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    got, want = values(tmp_path / "a" / "runs" / "locked"), values(tmp_path / "b" / "runs" / "locked")
    assert len(got) == len(want) > 20 and (got.status == "ok").all()
    pd.testing.assert_frame_equal(got, want)
