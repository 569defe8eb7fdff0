"""Probes: each measures one aspect of a variant and returns tidy rows; none prints.

``run_probe(name, spec, settings, seed=..., data=..., base_dir=...)`` builds the model itself
(``torch.manual_seed(seed); build_model(spec, registry)``) and returns ``list[Row]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..build import resolve_spec
from ..registry import Registry
from ..rows import Row
from ..settings import (
    DataSpec, GradientsSettings, ParamsSettings, SyntheticData, TimingSettings, TrainingSettings,
)
from ..specs import ModelSpec
from . import gradients, params, timing, training

PROBES: tuple[str, ...] = ("params", "gradients", "timing", "training")

_MODULES = {"params": params, "gradients": gradients, "timing": timing, "training": training}
_SETTINGS = {"params": ParamsSettings, "gradients": GradientsSettings,
             "timing": TimingSettings, "training": TrainingSettings}


def run_probe(
    name: str,
    spec: ModelSpec | Mapping[str, Any],
    settings: Any = None,
    *,
    seed: int,
    data: DataSpec | None = None,
    base_dir: Path | str = ".",
    device: str | None = None,
    registry: Registry | None = None,
) -> list[Row]:
    """Run probe ``name`` on the variant ``spec``; ``device`` overrides the settings' device.

    ``settings`` may be the probe's settings object, a mapping of its fields, or None for
    the defaults. Raises (never returns partial rows) when the variant cannot be measured.
    """
    if name not in _MODULES:
        raise ValueError(f"unknown probe {name!r}; probes are {', '.join(PROBES)}")
    cls = _SETTINGS[name]
    if settings is None:
        settings = cls()
    elif isinstance(settings, Mapping):
        settings = cls.model_validate(dict(settings))
    elif not isinstance(settings, cls):
        raise TypeError(f"probe {name!r} takes {cls.__name__} settings, got {type(settings)}")
    spec = resolve_spec(spec, registry)
    rows = _MODULES[name].run(
        spec, settings, seed=seed, data=data if data is not None else SyntheticData(),
        base_dir=Path(base_dir), device=device, registry=registry,
    )
    return rows


__all__ = ["PROBES", "run_probe"]
