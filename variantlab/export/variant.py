"""A stored variant of a run, exported as ``save_pretrained`` output.

A run stores results, not weights (no probe keeps a checkpoint), so what is exported is the
variant's model as every probe built it: ``torch.manual_seed(seed)`` then ``build_model``
of its stored spec. That initialisation is deterministic, so the export is too; the
exported model is where training the winning variant at scale starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..hf import to_transformers
from ..model.build import make_model
from ..model.specs import parse_model_spec
from ..plugin.registry import Registry, get_registry
from ..store.runs import find_runs
from ..store.store import load_run

#: written beside the weights: where they came from
PROVENANCE_FILE = "variantlab.json"


@dataclass(frozen=True)
class Exported:
    """What :func:`export_variant` wrote: the folder, the transformers class, the seed."""

    folder: Path
    cls: str
    seed: int


def export_variant(run: str | Path, variant: str, out_dir: str | Path, seed: int | None = None,
                   registry: Registry | None = None) -> Exported:
    """Write variant ``variant`` of the run at ``run`` (a run folder or its results.sqlite),
    initialised with ``seed`` (default: the run's first seed), into ``out_dir`` as
    ``save_pretrained`` output with :data:`PROVENANCE_FILE` (run, variant, seed, spec)."""
    refs = find_runs(run)
    if len(refs) > 1:
        raise SpecError.at(["RUN"], f"{run} holds {len(refs)} runs; give one run folder")
    data = load_run(refs[0].store)
    names = list(data.variants["name"])
    if variant not in names:
        raise SpecError.at(["--variant"], f"{variant!r} is not a variant of run "
                           f"{refs[0].label}; its variants: {', '.join(names)}")
    stored = data.variants.loc[data.variants["name"] == variant, "spec"].iloc[0]
    registry = registry or get_registry()
    spec = parse_model_spec(stored, registry)
    seed = seed if seed is not None else (data.meta.seeds or [0])[0]
    model = make_model(spec, seed, registry).eval()
    hf = to_transformers(spec, model, registry)
    folder = Path(out_dir)
    hf.save_pretrained(folder)
    (folder / PROVENANCE_FILE).write_text(json.dumps(provenance(
        data.meta.experiment, str(refs[0].folder), variant, seed, spec.to_data()), indent=2))
    return Exported(folder, type(hf).__name__, seed)


def provenance(experiment: str, run: str, variant: str, seed: int,
               spec: dict[str, Any]) -> dict[str, Any]:
    return {"experiment": experiment, "run": run, "variant": variant, "seed": seed,
            "weights": "initialisation: torch.manual_seed(seed), then build_model(spec); "
                       "runs store results, not trained weights",
            "spec": spec}
