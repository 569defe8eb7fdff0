"""How long a report of a large sweep takes to write, and how big its HTML is.

A synthetic grid of 6 axes (4 x 3 x 2 x 4 x 3 x 4 = 1,152 variants, 1 seed, the params and
gradients probes' rows of :func:`variantlab.testing.sample.sample_grid`) is written into a
real results store; ``write_report`` then reads that store and writes report.md, report.html,
the SVG plots, summary.csv and effects.csv. The time is the wall time of that call (reading
the store included); building the store is not timed. ``--scale 10`` repeats it with ten
times the variants (a 7th axis of 10 values).

    .venv/bin/python benchmarks/report_scale.py [--scale 1 10] [--markdown F]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import variantlab as vl
from variantlab.report import write_report
from variantlab.store.store import Store, UnitRecord
from variantlab.testing.sample import sample_grid

REG = vl.get_registry()

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


def measure(scale: int, work: Path) -> dict:
    axes = grid(scale)
    run = sample_grid(axes, {("residual.shortcut", False): 0.3}, seeds=(0,),
                      probes=("params", "gradients"))
    store = store_run(run, work / f"grid{scale}")
    start = time.perf_counter()
    files = write_report([store], work / f"report{scale}", registry=REG)
    seconds = time.perf_counter() - start
    return {"scale": scale, "variants": len(run.variants), "rows": len(run.rows),
            "seconds": seconds, "html_bytes": files.html.stat().st_size,
            "md_bytes": files.markdown.stat().st_size,
            "svg_bytes": sum(p.stat().st_size for p in files.plots)}


def table(results: list[dict]) -> str:
    lines = ["| variants | stored rows | write time (s) | report.html (MB) | report.md (MB) "
             "| SVG files (MB) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['variants']:,} | {r['rows']:,} | {r['seconds']:.1f} | "
                     f"{r['html_bytes'] / 1e6:.2f} | {r['md_bytes'] / 1e6:.2f} | "
                     f"{r['svg_bytes'] / 1e6:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the results table to this file")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in args.scale:
            results.append(measure(scale, Path(tmp)))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
            f"{load:.1f} at the end\n\n" + table(results))
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    limit = results[0]
    ok = limit["scale"] != 1 or (limit["seconds"] <= 10 and limit["html_bytes"] <= 2e6)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
