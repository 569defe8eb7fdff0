"""Probes: each measures one aspect of a variant and returns tidy rows; none prints.

Probes are registered through the ``register_probes`` hook (:mod:`variantlab.plugin.hookspecs`);
the built-ins (params, gradients, timing, training, dynamics) live in this package and are
registered by ``variantlab_plugins.probes``. ``run_probe(name, spec, settings, seed=...,
data=..., base_dir=...)`` runs the registered probe ``name`` and returns ``list[Row]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported by run_probe: the package itself stays light (the report
    # imports its metric names, probes.metricnames, without torch)
    from ..data.sources import DataSpec
    from ..model.specs import ModelSpec
    from ..plugin.registry import Registry
    from ..plugin.rows import Row


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
    """Run probe ``name`` (registered in ``registry``; default :func:`variantlab.get_registry`)
    on the variant ``spec``; ``device`` overrides the settings' device.

    ``settings`` may be the probe's settings object, a mapping of its fields, or None for
    the defaults. Raises (never returns partial rows) when the variant cannot be measured.
    """
    from ..data.sources import SyntheticData
    from ..model.build import resolve_spec
    from ..plugin.registry import get_registry

    if registry is None:
        registry = get_registry()
    try:
        probe = registry.probe(name)
    except Exception:
        raise ValueError(f"unknown probe {name!r}; probes are "
                         f"{', '.join(registry.probe_names())}") from None
    settings = probe.settings(dict(settings) if isinstance(settings, Mapping) else settings)
    spec = resolve_spec(spec, registry)
    return list(probe.run(
        spec, settings, seed=seed, data=data if data is not None else SyntheticData(),
        base_dir=Path(base_dir), device=device, registry=registry,
    ))


__all__ = ["run_probe"]
