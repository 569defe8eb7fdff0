"""The tidy row every probe returns; the runner adds experiment, variant, seed and unit."""

from __future__ import annotations

import math
from typing import TypedDict

SCOPES = ("model", "slot", "layer", "parameter", "info")


class Row(TypedDict):
    probe: str  # params | gradients | timing | training
    metric: str  # e.g. total, mean_abs_grad, forward_median_s, loss
    scope: str  # one of SCOPES
    name: str  # parameter or slot name, "" at model scope
    layer: int | None  # layer index for per-layer rows
    step: int | None  # training step for curves
    value: float  # NaN allowed (a diverged loss); text goes in name with scope "info"
    unit: str  # "count", "s", "tokens/s", "bytes", "FLOP/s", "ratio", "" ...


def row(
    probe: str,
    metric: str,
    value: float,
    *,
    scope: str = "model",
    name: str = "",
    layer: int | None = None,
    step: int | None = None,
    unit: str = "",
) -> Row:
    """One row; ``value`` is stored as a float."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r} is not one of {SCOPES}")
    value = float(value) if value is not None else math.nan
    return Row(probe=probe, metric=metric, scope=scope, name=name, layer=layer, step=step,
               value=value, unit=unit)
