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
from collections.abc import Collection, Mapping
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
    runs: str | None = None  # the registered probe it runs, when not ``probe`` (test units)

    @property
    def title(self) -> str:
        return f"{self.variant.name} seed={self.seed} {self.probe}"

    @property
    def measures(self) -> str:
        """The registered probe the unit runs."""
        return self.runs or self.probe


#: a test unit's probe name in the store: the test split of a deferred training unit
TEST = "test"
TRAINING = "training"


def defers_test(experiment: Experiment) -> bool:
    """Whether a run that can add units as it goes (the in-process and pool executors)
    scores the test split of the experiment's training units only at each group's chosen
    setting: when the experiment has a tuned axis (:mod:`variantlab.config.roles`), so that
    its report chooses settings on validation and reports the test split of the chosen one
    alone (:mod:`variantlab.report.fair.tuned`)."""
    from ..config.roles import TUNED

    roles = getattr(experiment, "roles", None) or {}
    return any(role == TUNED for role in roles.values())


def deferrable(probe: str, settings: Any) -> bool:
    """Whether a unit of ``probe`` with ``settings`` scores a test split that can be
    deferred: the training probe, scoring held-out splits."""
    from ..probes.heldout import scores_held_out

    return probe == TRAINING and getattr(settings, "test_split", None) == "scored" \
        and scores_held_out(settings)


def plan_units(experiment: Experiment, device: str | None = None, *, defer: bool = False,
               tested: Collection[tuple[str, int]] = ()) -> list[Unit]:
    """Every unit of the experiment in a fixed order: variant, then seed, then probe; the
    units of serial probes (timing) last, interleaved (seed, then variant): a variant's
    timings then sit next to the other variants' in time, so the machine's drift hits
    them alike (the process pool also keeps them out).

    ``defer`` (a run that can add units as it goes) and an experiment with a tuned axis
    (:func:`defers_test`): the training units score no test split (``test_split:
    deferred`` in their settings, so in their keys) and keep their final weights; for each
    (variant, seed) of ``tested`` (the run's choice: :class:`~variantlab.report.fair.
    extension.EdgeFeed`) a *test* unit after them scores that model's test split (probe
    ``test`` in the store, its rows the training probe's; its key hashes the training
    unit's)."""
    def data_key(data: Any) -> Any:
        out = plain(data)
        content = data_fingerprint(data, experiment.base_dir)
        return out if content is None else {**out, "content": content}

    data_data = data_key(experiment.data)
    base = experiment.measure.probes()
    registry = experiment.registry
    found = {name: registry.probe(name, ("measure", name)) for name in base}
    deferring = defer and defers_test(experiment)
    asked = set(tested)
    units, tests = [], []
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
                later = deferring and deferrable(name, settings)
                if later:
                    settings = settings.model_copy(update={"test_split": "deferred"})
                key = unit_key(spec_data, name, plain(settings), dev, data_in_key, seed,
                               code=code)
                units.append(Unit(key, variant, seed, name, settings, dev, probe.serial))
                if later and (variant.name, seed) in asked:
                    only = settings.model_copy(update={"test_split": "only", "trained": key})
                    tests.append(Unit(unit_key(spec_data, TEST, plain(only), dev, data_in_key,
                                               seed, code=code),
                                      variant, seed, TEST, only, dev, runs=name))
    seeds = list(experiment.seeds)
    rank = {v.name: i for i, v in enumerate(experiment.variants)}
    first = [u for u in units if not u.serial]
    last = sorted((u for u in units if u.serial),
                  key=lambda u: (seeds.index(u.seed), rank[u.variant.name], u.probe))
    return first + tests + last
