"""Units and their planning: what identifies a unit and the order a run computes them in.

A unit is one (variant, seed, probe). Its key is the sha256 of canonical JSON of everything
that decides its numbers: the variant's resolved spec, the probe and its settings, the
effective device, the data spec and what it reads, the seed, the variantlab and torch
versions and the source code of the core, the built-in plugins and every other plugin the
variant uses (:mod:`variantlab.sweep.keys`). Computing a unit and storing it is the
executors' (:mod:`variantlab.executors.unit`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..version import __version__
from .keys import data_fingerprint, environment, probe_code, variant_code

if TYPE_CHECKING:
    from ..config.experiment import Experiment, Variant
    from ..plugin.probe import Probe


def plain(obj: Any) -> Any:
    """JSON-safe data of a pydantic model (or plain data)."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    return obj


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def resolve_device(probe: Probe | str, settings: Any, override: str | None) -> str | None:
    """The device a probe runs on: ``--device``, else the settings' own, else CPU;
    ``auto`` means CUDA when present. ``None`` for a registered probe (``probe``, a
    :class:`variantlab.plugin.probe.Probe`) that no device changes; a probe's name alone
    gives the device its settings ask for."""
    if getattr(probe, "device_free", False):
        return None
    device = override or getattr(settings, "device", None) or "cpu"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device


def unit_key(spec_data: Any, probe: str, settings_data: Any, device: str | None,
             data_data: Any, seed: int, version: str = __version__,
             code: Mapping[str, Any] | None = None) -> str:
    """Content hash of one unit. ``code`` is what the numbers depend on besides the
    arguments (:mod:`variantlab.sweep.keys`); by default the core code and versions."""
    payload = {
        "spec": spec_data, "probe": probe, "settings": settings_data, "device": device,
        "data": data_data, "seed": seed, "version": version,
        "code": dict(code) if code is not None else environment(),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


@dataclass(frozen=True)
class Unit:
    key: str
    variant: Variant
    seed: int
    probe: str
    settings: Any
    device: str | None
    serial: bool = False  # the probe's units run last, one at a time (timing)

    @property
    def title(self) -> str:
        return f"{self.variant.name} seed={self.seed} {self.probe}"


def plan_units(experiment: Experiment, device: str | None = None) -> list[Unit]:
    """Every unit of the experiment in a fixed order: variant, then seed, then probe; the
    units of serial probes (timing) last, interleaved (seed, then variant): a variant's
    timings then sit next to the other variants' in time, so the machine's drift hits
    them alike (the process pool also keeps them out)."""
    def data_key(data: Any) -> Any:
        out = plain(data)
        content = data_fingerprint(data, experiment.base_dir)
        return out if content is None else {**out, "content": content}

    data_data = data_key(experiment.data)
    base = experiment.measure.probes()
    registry = experiment.registry
    found = {name: registry.probe(name, ("measure", name)) for name in base}
    units = []
    for variant in experiment.variants:
        spec_data = variant.spec.to_data()
        # a variant's setting axes (measure.<probe>.<key>) change its probes' settings
        probes = experiment.probes_of(variant) if getattr(variant, "settings", None) else base
        variant_data = getattr(variant, "data", None)
        data_in_key = data_data if variant_data is None else data_key(variant_data)
        for seed in experiment.seeds:
            for name, settings in probes.items():
                probe = found[name]
                plugins = {**variant_code(spec_data, registry),
                           **probe_code(probe, registry)}
                code = {**environment(), "plugins": plugins} if plugins else environment()
                dev = resolve_device(probe, settings, device)
                key = unit_key(spec_data, name, plain(settings), dev, data_in_key, seed,
                               code=code)
                units.append(Unit(key, variant, seed, name, settings, dev, probe.serial))
    seeds = list(experiment.seeds)
    rank = {v.name: i for i, v in enumerate(experiment.variants)}
    first = [u for u in units if not u.serial]
    last = sorted((u for u in units if u.serial),
                  key=lambda u: (seeds.index(u.seed), rank[u.variant.name], u.probe))
    return first + last
