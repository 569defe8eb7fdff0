"""How long ``variantlab report`` takes on a large sweep, as a user runs it, and how big its HTML is.

A synthetic grid of 6 axes (4 x 3 x 2 x 4 x 3 x 4 = 1,152 variants, 1 seed, the params and
gradients probes' rows of :func:`variantlab.testing.sample.sample_grid`) is written into a
real results store (not timed). Then, interleaved for ``--repeats`` rounds (the order
rotating each round), each a fresh process: ``python -c "import torch"`` (the floor every
command pays) and ``variantlab report STORE --out DIR`` (reading the store, report.md,
report.html, the SVG plots, summary.csv and effects.csv); with ``--compare ROOT``, also the
same command run with another checkout's code (``PYTHONPATH=ROOT``, e.g. the code before a
change). The children run with Python's bytecode cache on, as a user's do, kept in a
temporary folder (``PYTHONPYCACHEPREFIX``) rather than in the checkouts. Medians of wall
and CPU time; the machine's load and cores before and after.
``--scale 10`` adds a run with ten times the variants (a 7th axis of 10 values; once, the
in-process call timed).

    .venv/bin/python benchmarks/report_scale.py [--repeats 5] [--compare /path/to/checkout]
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

import variantlab as vl
from variantlab.report import write_report
from variantlab.store.store import Store, UnitRecord
from variantlab.testing.sample import sample_grid

REG = vl.get_registry()
BIN = Path(sys.executable).parent / "variantlab"
CACHE = Path(tempfile.gettempdir()) / "variantlab-bench-pycache"  # the children's bytecode

AXES: dict[str, list] = {"activation.kind": ["gelu", "relu", "silu", "tanh"],
        "norm.kind": ["layer", "rms", "batch"], "residual.shortcut": [True, False],
        "emb_dim": [32, 48, 64, 96], "residual.kind": ["pre_norm", "post_norm", "sandwich"],
        "drop_rate": [0.0, 0.05, 0.1, 0.2]}  # labels only: nothing is built


def grid(scale: int) -> dict[str, list]:
    axes: dict[str, list] = dict(AXES)
    if scale > 1:
        axes["n_layers"] = list(range(1, scale + 1))
    return axes


def store_run(run, folder: Path) -> Path:
    """A RunData written through the store's own API, unit by unit."""
    with Store(folder) as store:
        variants = [{"name": r["name"], "label": r["label"], "spec": r["spec"],
                     "overrides": r["overrides"], "warnings": []}
                    for r in run.variants.to_dict("records")]
        plan = [(u["key"], u["variant"], int(u["seed"]), u["probe"])
                for u in run.units.to_dict("records")]
        store.write_experiment(run.meta, variants, plan)
        by_unit = {k: g for k, g in run.rows.groupby("unit_key", sort=False)}
        for u in run.units.to_dict("records"):
            rows = by_unit[u["key"]].to_dict("records")
            for r in rows:
                for k in ("layer", "step"):
                    r[k] = None if r[k] is None or r[k] != r[k] else int(r[k])
            store.save_unit(UnitRecord(key=u["key"], variant=u["variant"], seed=int(u["seed"]),
                                       probe=u["probe"], settings_json="{}", status="ok",
                                       error=None, device="cpu"), rows)
    return folder


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; exit code 0 required."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return (f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min), "
            f"{os.cpu_count()} cores")


def env_for(root: Path) -> dict[str, str]:
    """The environment of a child using the code at ``root`` (bytecode cache on, as a
    user's is)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(root)
    env["PYTHONPYCACHEPREFIX"] = str(CACHE)  # outside the checkouts
    return env


def cli_rounds(store: Path, work: Path, repeats: int, compare: Path | None) -> dict:
    """name -> (walls, cpus, report.html bytes) over interleaved rounds."""
    here = env_for(Path(__file__).resolve().parent.parent)
    commands = {"import torch": ([sys.executable, "-c", "import torch"], here, None)}
    commands["variantlab report"] = ([str(BIN), "report", str(store), "--out",
                                      str(work / "cli")], here, work / "cli")
    if compare is not None:
        commands[f"variantlab report ({compare})"] = (
            [str(BIN), "report", str(store), "--out", str(work / "other")], env_for(compare),
            work / "other")
    names = list(commands)
    for name in names:  # fill the bytecode and file caches, not counted
        timed(*commands[name][:2])
    got: dict = {n: ([], [], 0) for n in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = timed(*commands[name][:2])
            got[name][0].append(wall)
            got[name][1].append(cpu)
    for name, (_, _, out) in commands.items():
        if out is not None:
            got[name] = (*got[name][:2], (out / "report.html").stat().st_size)
    return got


def measure(scale: int, work: Path) -> dict:
    """One in-process ``write_report`` of the ``scale`` grid (building its store untimed)."""
    store, run = build_store(scale, work)
    start = time.perf_counter()
    files = write_report([store], work / f"report{scale}", registry=REG)
    seconds = time.perf_counter() - start
    return {"scale": scale, "variants": len(run.variants), "rows": len(run.rows),
            "seconds": seconds, "html_bytes": files.html.stat().st_size,
            "md_bytes": files.markdown.stat().st_size,
            "svg_bytes": sum(p.stat().st_size for p in files.plots)}


def build_store(scale: int, work: Path):
    run = sample_grid(grid(scale), {("residual.shortcut", False): 0.3}, seeds=(0,),
                      probes=("params", "gradients"))
    return store_run(run, work / f"grid{scale}"), run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare", type=Path, default=None, metavar="ROOT",
                        help="also time the command with the code of this checkout")
    parser.add_argument("--scale", type=int, nargs="*", default=[],
                        help="also time write_report in process at these scales (e.g. 10)")
    args = parser.parse_args(argv)
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"before: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store, run = build_store(1, work)
        got = cli_rounds(store, work, args.repeats, args.compare)
        extra = [measure(scale, work) for scale in args.scale]
    print(f"after: {load()}")
    print(f"\n{len(run.variants):,} variants, {len(run.rows):,} stored rows; "
          f"{args.repeats} interleaved rounds, medians\n")
    print("| command | wall (s) | CPU (s) | report.html (MB) |")
    print("|---|---:|---:|---:|")
    for name, (walls, cpus, html) in got.items():
        size = f"{html / 1e6:.2f}" if html else ""
        print(f"| {name} | {statistics.median(walls):.2f} | {statistics.median(cpus):.2f} "
              f"| {size} |")
    for r in extra:
        print(f"\nin process, scale {r['scale']}: {r['variants']:,} variants, "
              f"{r['rows']:,} rows: {r['seconds']:.1f} s, report.html "
              f"{r['html_bytes'] / 1e6:.2f} MB, SVGs {r['svg_bytes'] / 1e6:.2f} MB")
    report = statistics.median(got["variantlab report"][0])
    return 0 if report <= 4.0 else 1


if __name__ == "__main__":
    sys.exit(main())
