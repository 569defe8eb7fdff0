"""Start-up of the ``variantlab`` command against ``python -c "import torch"`` (issue 26.1).

Five commands, each a fresh process as a user runs it, interleaved (one of each per round,
the order rotating every round so drift hits all alike), ``--repeats`` rounds; the table gives
the median wall time and the median CPU time (user + system of the child) and their ratios to
``import torch``. The machine's load average and cores are printed before and after. The
children run with Python's bytecode cache on, as a user's do (``PYTHONDONTWRITEBYTECODE`` is
dropped from their environment; the cache goes to a temporary folder,
``PYTHONPYCACHEPREFIX``; one untimed warm-up run of each command fills it).

- ``import torch``: the floor every command pays (variantlab builds torch models);
- ``import torch, no final GC``: the same with ``gc.freeze`` at exit, as the ``variantlab``
  command does (:func:`variantlab.cli.main._no_final_collection`): the interpreter's last
  garbage collection, which walks every object torch made, is skipped. The last column
  gives each command's CPU against this floor: what variantlab itself adds;
- ``validate (params)``: a 6-line experiment with the default probe (params), two variants;
- ``validate (training)``: the same with a training probe (the size guard then runs a
  forward on the meta device per variant at 1 and at 2 layers);
- ``refusal``: the training experiment with ``vocab_size: 10**9``, refused (exit 2); the
  guard also builds each variant at half the vocabulary to name the largest that fits.

    .venv/bin/python benchmarks/startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "variantlab"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "variantlab-bench-pycache")
SIX = """\
name: startup
model: {{emb_dim: 32, n_layers: 2, n_heads: 2, vocab_size: {vocab}, context_length: 32}}
grid: {{norm.kind: [layer, rms]}}
seeds: [0]
data: {{source: synthetic}}
{measure}
"""

NO_FINAL_GC = "import atexit, gc; atexit.register(gc.freeze); import torch"


def commands(folder: Path) -> dict[str, tuple[list[str], int]]:
    """name -> (argv, expected exit code)."""
    files = {"params": ("256", "measure: {params: {}}"),
             "training": ("256", "measure: {params: {}, training: {steps: 2, seq_len: 16}}"),
             "refusal": (str(10**9), "measure: {params: {}, training: {steps: 2, seq_len: 16}}")}
    paths = {}
    for name, (vocab, measure) in files.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(SIX.format(vocab=vocab, measure=measure))
    return {"import torch": ([sys.executable, "-c", "import torch"], 0),
            "import torch, no final GC": ([sys.executable, "-c", NO_FINAL_GC], 0),
            "validate (params)": ([str(BIN), "validate", str(paths["params"])], 0),
            "validate (training)": ([str(BIN), "validate", str(paths["training"])], 0),
            "refusal (vocab 10^9)": ([str(BIN), "validate", str(paths["refusal"])], 2)}


def timed(argv: list[str], code: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != code:
        raise SystemExit(f"{argv}: exit {proc.returncode}, expected {code}\n{proc.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min), {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"before: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(Path(tmp))
        names = list(cmds)
        for name in names:  # fill the bytecode and file caches, not counted
            timed(*cmds[name])
        walls: dict[str, list[float]] = {n: [] for n in names}
        cpus: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                wall, cpu = timed(*cmds[name])
                walls[name].append(wall)
                cpus[name].append(cpu)
    print(f"after: {load()}")
    base_w, base_c = statistics.median(walls[names[0]]), statistics.median(cpus[names[0]])
    floor = statistics.median(cpus[names[1]])
    print(f"\n{args.repeats} interleaved rounds, medians\n")
    print("| command | wall (s) | CPU (s) | wall / import torch | CPU / import torch "
          "| CPU / no-final-GC floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        w, c = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"| {name} | {w:.2f} | {c:.2f} | {w / base_w:.2f} | {c / base_c:.2f} "
              f"| {c / floor:.2f} |")


if __name__ == "__main__":
    main()
