"""A compiled sweep on a cold inductor cache: inductor's compile processes at its default
(one per core, in every worker) against one per worker, its torch thread count under
``--workers 2``. Capping them looked like it would stop two workers from oversubscribing 2
cores; measured, it made the cold sweep slower (benchmarks/throughput.md, eleventh round),
so the workers keep inductor's default.

The job is throughput.py's tuned sweep (gelu-vs-relu's design at width 32, 100 steps) cut
to one seed and two learning rates, with ``compile: true`` so that every training unit
compiles (``compile: auto`` would leave 100 steps eager), ``--workers 2``. Each run gets an
empty ``TORCHINDUCTOR_CACHE_DIR``: a cold cache is when inductor compiles C++ and starts its
compile pool (with a warm one it starts none, and the cap changes nothing).

- **default**: ``TORCHINDUCTOR_COMPILE_THREADS`` unset: inductor compiles with one process
  per core in each worker (a compile pool beside each worker);
- **capped**: ``TORCHINDUCTOR_COMPILE_THREADS=1``: each worker compiles in its own process,
  with no compile pool.

Runs alternate (default, capped, default, ...) so that drift of the machine hits both
alike. Printed: each run's wall time and the load average at its start, each condition's
median, and the largest difference of a training unit's final loss between any two runs
(the compiled code is the same, so 0).

    .venv/bin/python benchmarks/compile_threads.py [--repeats 2] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import ROOT, sweep_yaml  # noqa: E402

CONDITIONS = ("default", "capped")


def job_yaml() -> dict:
    doc = sweep_yaml(smoke=False)
    doc["name"] = "compile-threads"
    doc["seeds"] = [0]
    lrs = [3.0e-3, 3.0e-2]
    doc["grid"]["measure.training.lr"] = lrs
    doc["variants"] = [v for v in doc["variants"] if v["set"]["measure.training.lr"] in lrs]
    doc["measure"]["training"]["compile"] = True
    return doc


def run_once(condition: str, yaml_file: Path, work: Path) -> dict:
    out, cache = work / "out", work / "inductor-cache"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "VARIANTLAB_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    if condition == "capped":
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    command = [sys.executable, "-m", "variantlab", "run", str(yaml_file), "--out", str(out),
               "--no-report", "--workers", "2"]
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"variantlab run failed ({done.returncode}):\n{done.stderr}")
    with sqlite3.connect(out / "compile-threads" / "results.sqlite") as db:
        losses = dict(db.execute(
            "select u.variant, r.value from rows r join units u on u.key = r.unit_key "
            "where r.probe = 'training' and r.metric = 'final_loss'").fetchall())
        compiled = {v for (v,) in db.execute(
            "select r.value from rows r where r.probe = 'training' and r.metric = 'compiled'")}
    if compiled != {1.0}:
        raise SystemExit(f"{condition}: not every training unit compiled ({compiled})")
    return {"wall": wall, "load0": load0, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {c: [] for c in CONDITIONS}
    with tempfile.TemporaryDirectory() as tmp:
        yaml_file = Path(tmp) / "compile-threads.yaml"
        yaml_file.write_text(yaml.safe_dump(job_yaml(), sort_keys=False))
        for repeat in range(args.repeats):
            for condition in CONDITIONS:
                work = Path(tmp) / f"{condition}-{repeat}"
                runs[condition].append(run_once(condition, yaml_file, work))
                last = runs[condition][-1]
                print(f"{condition} #{repeat}: {last['wall']:.1f} s wall, "
                      f"load at start {last['load0']:.2f}", flush=True)
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, Python "
             f"{platform.python_version()}; {args.repeats} alternating repeat(s), each on an "
             "empty inductor cache.", "",
             "| compile processes per worker | wall (s) per run | median wall (s) | "
             "load at start |", "|---|---|---:|---|"]
    for condition in CONDITIONS:
        rs = runs[condition]
        label = (f"inductor's default ({os.cpu_count()})" if condition == "default"
                 else "one (TORCHINDUCTOR_COMPILE_THREADS=1)")
        walls = ", ".join(f"{r['wall']:.1f}" for r in rs)
        loads = ", ".join(f"{r['load0']:.2f}" for r in rs)
        lines.append(f"| {label} | {walls} | {statistics.median(r['wall'] for r in rs):.1f} | "
                     f"{loads} |")
    ratio = (statistics.median(r["wall"] for r in runs["capped"])
             / statistics.median(r["wall"] for r in runs["default"]))
    every = [r["losses"] for c in CONDITIONS for r in runs[c]]
    diff = max(abs(a[v] - b[v]) for a in every for b in every for v in a)
    lines += ["", f"- capped / default, median wall: {ratio:.2f}",
              f"- largest difference of a training unit's final loss between any two runs: "
              f"{diff:.3g} over {len(every[0])} units"]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
