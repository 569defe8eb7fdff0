"""Checks of an experiment file that need more than its schema, made while it is read
(:mod:`variantlab.config.experiment` calls them): numbers that are not finite, seeds
(duplicates, SQLite's integer range) and the grid's size, computed from the axis lengths
before anything is expanded. Every message reads ``FILE:LINE:COL: key.path: message``.
The checks made before a run are in :mod:`variantlab.sweep.preflight`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .yamlio import YamlDoc

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # SQLite INTEGER; torch.manual_seed takes -2**63..2**64-1
MAX_VARIANTS = 10_000


# -- while reading --------------------------------------------------------------------------
def nonfinite(doc: YamlDoc) -> list[str]:
    """A message for every ``.inf`` / ``.nan`` anywhere in the file."""
    out: list[str] = []

    def walk(node: Any, loc: tuple) -> None:
        if isinstance(node, float) and not math.isfinite(node):
            out.append(doc.message(loc, f"{node} is not a finite number; write a finite one "
                                        "(.inf, .nan and numbers beyond 1.8e308 are refused)"))
        elif isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, loc + (key,))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, loc + (i,))

    walk(doc.data, ())
    return out


def seed_problems(seeds: list[Any], doc: YamlDoc) -> list[str]:
    """Duplicate seeds and seeds outside SQLite's integer range."""
    out: list[str] = []
    first: dict[int, int] = {}
    if not isinstance(seeds, list):
        return out  # the schema reports it
    for i, seed in enumerate(seeds):
        if isinstance(seed, bool) or not isinstance(seed, int):
            continue  # the schema reports it
        if not SEED_MIN <= seed <= SEED_MAX:
            out.append(doc.message(("seeds", i), f"seed {seed} is outside the range the results "
                                   f"store keeps ({SEED_MIN} .. {SEED_MAX}); use a smaller one"))
        elif seed in first:
            out.append(doc.message(("seeds", i), f"seed {seed} is listed twice (first as "
                                   f"seeds[{first[seed]}]); each seed once"))
        else:
            first[seed] = i
    return out


def grid_size(grid: Mapping[str, list], n_named: int) -> int:
    """Number of variants: the product of the axis lengths (1 without a grid) plus the
    named variants, from the lengths alone."""
    return math.prod(len(v) for v in grid.values()) + n_named


def grid_cap_message(doc: YamlDoc, grid: Mapping[str, list], n_named: int, cap: int) -> str:
    axes = " x ".join(f"{len(v)} ({k})" for k, v in grid.items()) or "1"
    where = ("grid",) if grid else ("variants",)
    return doc.message(where, f"{grid_size(grid, n_named):,} variants ({axes}"
                       + (f" + {n_named} named" if n_named and grid else "")
                       + f") is more than the limit of {cap:,}; split the experiment or raise "
                         "the limit with --max-variants N", at="key")
