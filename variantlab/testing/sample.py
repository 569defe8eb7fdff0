"""A fixed synthetic run with known numbers: for tests, golden files and trying the report.

Nothing here is measured; every value follows a simple formula of the variant index ``i``
and the seed ``s`` so that tests can state the expected numbers exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from ..store.contract import RESULTS, UNITS, VARIANTS, RunData, RunMeta, conform, names

BASE_SPEC: dict[str, Any] = {
    "family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4,
    "n_layers": 3, "drop_rate": 0.0, "norm": {"kind": "layer", "eps": 1e-5},
    "residual": {"kind": "pre_norm", "shortcut": True},
}
# name, overrides, growth of the gradient norm per layer
DEFAULT_VARIANTS: tuple[tuple[str, dict[str, Any], float], ...] = (
    ("pre_norm", {}, 1.05),
    ("post_norm", {"residual.kind": "post_norm"}, 2.0),
    ("batch", {"norm.kind": "batch"}, 1.2),
)
SLOT_PARAMS = {"embedding": 3072, "attention": 12672, "feedforward": 24960, "norm": 448,
               "head": 2048}


def _apply(spec: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(spec))
    for path, value in overrides.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def _variant_rows(i: int, seed: int, growth: float, diverge: bool) -> dict[str, list[dict]]:
    def r(probe: str, metric: str, value: float, **kw: Any) -> dict[str, Any]:
        return {"probe": probe, "metric": metric, "value": float(value), "scope": "model",
                "name": "", "layer": None, "step": None, "unit": "", **kw}

    slots = {k: v + 32 * i * (k == "feedforward") for k, v in SLOT_PARAMS.items()}
    total = sum(slots.values())
    params = [r("params", "total", total, unit="count"),
              r("params", "trainable", total, unit="count"),
              r("params", "non_embedding", total - slots["embedding"], unit="count")]
    params += [r("params", "params", v, scope="slot", name=k, unit="count")
               for k, v in slots.items()]
    grads = [r("gradients", "loss", 4.16 + 0.01 * seed)]
    for layer in range(3):
        for name, scale in (("all", 1.0), ("weights", 0.9), ("attention", 0.5),
                            ("feedforward", 0.8)):
            value = 0.1 * scale * growth ** layer * (1 + 0.02 * seed)
            grads.append(r("gradients", "grad_norm", value, scope="layer", name=name,
                           layer=layer))
            grads.append(r("gradients", "mean_abs_grad", value / 100, scope="layer", name=name,
                           layer=layer))
        grads.append(r("gradients", "residual_rms", 1 + 0.5 * layer * (1 + i), scope="layer",
                       layer=layer))
    fwd = 0.010 * (1 + 0.5 * i) + 0.0002 * seed
    timing = []
    for key, factor in (("forward", 1.0), ("backward", 3.0)):
        timing += [r("timing", f"{key}_median_s", fwd * factor, unit="s"),
                   r("timing", f"{key}_iqr_s", 0.001 * factor, unit="s"),
                   r("timing", f"{key}_tokens_per_s", 512 / (fwd * factor), unit="tokens/s")]
    timing += [r("timing", "peak_memory_bytes", 2**20 * (3 + i), unit="bytes"),
               r("timing", "flops_per_token", 6 * total, unit="FLOP")]
    timing += [r("timing", m, math.nan, scope="info", name=t) for m, t in
               (("device", "cpu"), ("dtype", "float32"), ("torch_version", "2.13.0"),
                ("sdpa_backend", "math"), ("flop_formula", "6N + 12LTd"))]
    losses = [4.2 - 0.1 * step * (1 - 0.1 * i) + 0.01 * seed for step in range(10)]
    if diverge:
        losses[-2:] = [math.nan, math.nan]
    finite = [v for v in losses if not math.isnan(v)]
    training = [r("training", "loss", v, step=step) for step, v in enumerate(losses)]
    training += [r("training", "final_loss", losses[-1]), r("training", "best_loss", min(finite)),
                 r("training", "diverged", float(diverge))]
    if not diverge:
        training.append(r("training", "eval_loss", losses[-1] + 0.05))
    return {"params": params, "gradients": grads, "timing": timing, "training": training}


def sample_run(
    variants: Sequence[tuple[str, dict[str, Any], float]] = DEFAULT_VARIANTS,
    seeds: Sequence[int] = (0, 1),
    *,
    experiment: str = "sample",
    fail: tuple[str, int, str, str] | None = ("batch", 1, "timing",
                                              "RuntimeError: out of memory | <b>bad</b>"),
    diverge: tuple[str, int] | None = ("batch", 1),
) -> RunData:
    """A RunData shaped like ``store.load_run``'s, with the numbers of the formulas above."""
    meta = RunMeta(experiment=experiment, description="A fixed synthetic run for tests.",
                   created="2025-01-01T00:00:00+00:00", variantlab_version="0.1.0",
                   torch_version="2.13.0", seeds=list(seeds), baseline=variants[0][0],
                   data={"source": "synthetic"}, run=experiment)
    vrows, urows, rows = [], [], []
    for i, (name, overrides, growth) in enumerate(variants):
        spec = _apply(BASE_SPEC, overrides)
        label = ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"
        warn = ["norm: BatchNorm in a causal model pools statistics over future positions"] \
            if spec["norm"]["kind"] == "batch" else []
        vrows.append({"name": name, "label": label, "position": i, "spec": spec,
                      "overrides": dict(overrides), "warnings": warn})
        for seed in seeds:
            probes = _variant_rows(i, seed, growth, diverge == (name, seed))
            for probe, prows in probes.items():
                key = f"{name}-{seed}-{probe}"
                failed = fail is not None and fail[:3] == (name, seed, probe)
                urows.append(dict.fromkeys(names(UNITS)) | {
                    "key": key, "variant": name, "seed": seed, "probe": probe,
                    "settings_json": "{}", "status": "failed" if failed else "ok",
                    "error": fail[3] if fail and failed else None, "device": "cpu",
                    "current": True})
                if fail and failed:
                    rows.append({"variant": name, "label": label, "seed": seed, "probe": probe,
                                 "metric": "error", "scope": "model", "name": "", "layer": None,
                                 "step": None, "value": math.nan, "unit": "", "unit_key": key,
                                 "status": "failed", "error": fail[3]})
                    continue
                rows += [dict(x, variant=name, label=label, seed=seed, unit_key=key,
                              status="ok", error=None) for x in prows]
    frame = pd.DataFrame(rows).assign(experiment=experiment, run=experiment)
    return RunData(meta=meta, variants=conform(pd.DataFrame(vrows), VARIANTS, "sample variants"),
                   units=conform(pd.DataFrame(urows), UNITS, "sample units"),
                   rows=conform(frame, RESULTS, "sample rows"))


def sample_grid(
    grid: dict[str, list[Any]],
    shifts: dict[tuple[str, Any], float] | None = None,
    seeds: Sequence[int] = (0, 1),
    *,
    experiment: str = "grid",
    probes: Sequence[str] | None = None,
) -> RunData:
    """A synthetic grid run: one variant per combination of ``grid``'s values (named by
    its label, as ``variantlab run`` names them), the grid in the meta, and the eval and
    final loss of each variant ``3 + 0.01 * seed`` plus the sum of ``shifts[(axis, value)]``
    of its values (so each axis value's main effect on them is its shift minus the baseline
    value's).
    ``probes``: keep only these probes' rows (default: all)."""
    import itertools

    shifts = shifts or {}
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    variants = [(",".join(f"{k}={_show(v)}" for k, v in c.items()), c, 1.0 + 0.01 * (i % 7))
                for i, c in enumerate(combos)]
    run = sample_run(variants, seeds, experiment=experiment, fail=None, diverge=None)
    run.meta = replace(run.meta, grid={k: list(v) for k, v in grid.items()})
    shift = {name: sum(shifts.get((k, v), 0.0) for k, v in c.items()
                       if not isinstance(v, (dict, list)))  # unhashable values: no shift
             for (name, c, _) in variants}
    rows = run.rows
    moved = rows["metric"].isin(["eval_loss", "final_loss"])
    level = 3.0 + 0.01 * rows.loc[moved, "seed"].astype(float)
    rows.loc[moved, "value"] = level + rows.loc[moved, "variant"].map(shift)
    if probes is not None:
        run.rows = rows[rows["probe"].isin(list(probes))].reset_index(drop=True)
        run.units = run.units[run.units["probe"].isin(list(probes))].reset_index(drop=True)
    return run


def _show(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
