"""Gather one or more stored runs into one frame of variants, units and rows for a report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from ..config.yamlio import UNSAFE
from ..store.contract import RESULTS, UNITS, VARIANTS, RunData, RunMeta, conform
from .labels import display_names


@dataclass
class ReportData:
    """Everything a report shows, with one display name per variant (``variant`` column)."""

    runs: list[RunMeta]  # each run's meta, in the order given; ``run`` is its unique label
    variants: pd.DataFrame  # run, experiment, variant, stored_name, label, spec, overrides, warnings
    units: pd.DataFrame  # run, experiment, variant, seed, probe, status, error, device, ...
    rows: pd.DataFrame  # ok rows only; ``variant`` is the display name
    baseline: str
    order: list[str] = field(default_factory=list)  # display names in report order
    registry: Any = None  # the report's registry: plugin probes' metric directions

    @property
    def seeds(self) -> list[int]:
        return sorted({int(s) for s in self.rows["seed"].dropna()}) if len(self.rows) else []


def load_runs(runs: Sequence[Any]) -> list[tuple[RunData, str]]:
    """Each run loaded, with a label unique among them (see :mod:`variantlab.store.runs`).

    Paths may name a store, a run folder or a folder of run folders; one store given twice
    (in any spelling) is read once. A ``RunData`` is labelled by its experiment's name.
    """
    from ..store.runs import find_runs
    from ..store.store import load_run

    paths = [r for r in runs if not isinstance(r, RunData)]
    refs = iter(find_runs(paths)) if paths else iter(())
    loaded: list[tuple[RunData, str]] = []
    for run in runs:
        if isinstance(run, RunData):
            if not isinstance(run.meta, RunMeta):
                raise TypeError(f"a RunData's meta is a {type(run.meta).__name__}, not a "
                                "variantlab.store.contract.RunMeta; build it with RunMeta(...) or "
                                "RunMeta.decode(stored) as store.load_run does")
            loaded.append((run, run.meta.experiment or "run"))
        else:  # every path's runs at the first path's place, in order
            loaded.extend((load_run(ref.store), ref.label) for ref in refs)
    labels = [label for _, label in loaded]
    for i, label in enumerate(labels):  # two in-memory runs of one experiment
        if labels[:i].count(label):
            labels[i] = f"{label}#{labels[:i].count(label) + 1}"
    return [(run, label) for (run, _), label in zip(loaded, labels)]


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested spec mapping -> ``{"norm.kind": "layer", ...}``; lists become JSON text."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, path + "."))
        elif isinstance(value, (list, tuple)):
            flat[path] = json.dumps(list(value))
        else:
            flat[path] = value
    return flat


def checked(run: RunData, label: str) -> RunData:
    """``run`` with frames of the contract's columns and dtypes (:mod:`variantlab.store.contract`);
    ContractError (a ValueError) naming the run and what its frames lack."""
    return RunData(meta=run.meta,
                   variants=conform(run.variants, VARIANTS, f"run {label}: variants"),
                   units=conform(run.units, UNITS, f"run {label}: units"),
                   rows=conform(run.rows, RESULTS, f"run {label}: rows"))


def visible(text: Any) -> Any:
    """``text`` with each control or bidirectional formatting character written as its
    escape (``\\x1b``, ``\\u202e``), so no report shows it raw; other values as they are.
    Experiment files refuse such characters (:data:`variantlab.config.yamlio.UNSAFE`); a
    store written another way may still hold them."""
    if not isinstance(text, str) or UNSAFE.search(text) is None:
        return text
    return UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _variants_frame(variants: pd.DataFrame, experiment: str, label: str) -> pd.DataFrame:
    return pd.DataFrame({
        "experiment": experiment,
        "stored_name": variants["name"].tolist(),
        "label": [visible(x) for x in variants["label"].tolist()],
        "spec": variants["spec"].tolist(),
        "overrides": variants["overrides"].tolist(),
        "warnings": variants["warnings"].tolist(),
        "run": label,
    }, columns=["experiment", "stored_name", "label", "spec", "overrides", "warnings", "run"])


def gather(runs: Sequence[Any], baseline: str | None = None) -> ReportData:
    """Load every run and give each variant a display name: a grid variant's label naming
    every axis's value (:mod:`.labels`), else its stored name; ``run/name`` when variants
    of several runs share a name, so that nothing is pooled across runs."""
    if not runs:
        raise ValueError("no runs given: pass at least one results store or its folder")
    metas, frames, unit_frames, row_frames = [], [], [], []
    for i, (given, label) in enumerate(load_runs(list(runs))):
        run = checked(given, label)
        experiment = visible(run.meta.experiment) or f"run{i + 1}"
        metas.append(replace(run.meta, experiment=experiment, run=label,
                             description=visible(run.meta.description)))
        frame = _variants_frame(run.variants, experiment, label)
        frame["display"] = [visible(name) for name in display_names(
            run.meta, frame["stored_name"].tolist(), frame["overrides"].tolist())]
        frames.append(frame)
        units = run.units[run.units["current"]]  # units of an older YAML version stay out
        units = units.assign(experiment=experiment, run=label)
        rows = run.rows.assign(experiment=experiment, run=label)
        rows["invocation"] = _invocations(rows, units)
        rows["machine"] = _invocations(rows, units, "machine")
        unit_frames.append(units)
        row_frames.append(rows)
    variants = pd.concat(frames, ignore_index=True)
    clash = variants["display"].duplicated(keep=False)
    variants["variant"] = [
        f"{r}/{n}" if c else n
        for r, n, c in zip(variants["run"], variants["display"], clash)
    ]
    variants = variants.drop(columns="display")
    names = {(r, n): d for r, n, d in zip(variants["run"], variants["stored_name"],
                                          variants["variant"])}

    def rename(frame: pd.DataFrame) -> pd.DataFrame:
        """Display names; each frame holds one run's units or rows (one label)."""
        if len(frame):
            run = str(frame["run"].iloc[0])
            stored = frame["variant"].astype(str)
            mine = {n: d for (r, n), d in names.items() if r == run}
            frame["variant"] = stored.map(mine).fillna(f"{run}/" + stored).astype(object)
        return frame

    units = pd.concat([rename(u) for u in unit_frames], ignore_index=True)
    rows = pd.concat([rename(r) for r in row_frames], ignore_index=True)
    rows = rows[(rows["status"] == "ok") & (rows["metric"] != "error")].reset_index(drop=True)
    rows["stack"], rows["name"] = split_stacks(rows)
    order = list(variants["variant"])
    chosen = _baseline(baseline, metas, variants, order)
    return ReportData(runs=metas, variants=variants, units=units, rows=rows, baseline=chosen,
                      order=order)


def _invocations(rows: pd.DataFrame, units: pd.DataFrame, column: str = "invocation") -> list:
    """Per row: the invocation of ``variantlab run`` that measured its unit (``column``
    ``machine``: the machine that computed it); None if the store predates the record."""
    if column not in units.columns:
        return [None] * len(rows)
    known = {k: i for k, i in zip(units["key"], units[column]) if isinstance(i, str)}
    found = rows["unit_key"].map(known)
    return found.astype(object).where(found.notna(), None).tolist()


def invocation_numbers(rows: pd.DataFrame, probe: str) -> dict[str, int]:
    """Invocation id -> 1, 2, ... in time order, for the ``probe``'s rows (ids start with
    their UTC start time, so they sort in time order)."""
    if "invocation" not in rows.columns:
        return {}
    ids = rows.loc[rows["probe"] == probe, "invocation"].dropna()
    return {inv: i + 1 for i, inv in enumerate(sorted(set(ids)))}


def invocations_of(rows: pd.DataFrame, probe: str, metric: str, column: str = "invocation"
                   ) -> dict[tuple[str, int], str]:
    """(variant, seed) -> the invocation of ``variantlab run`` that measured its ``metric``
    rows of ``probe`` (``column`` ``machine``: the machine that did); empty for rows
    without that record."""
    if column not in rows.columns:
        return {}
    part = rows[(rows["probe"] == probe) & (rows["metric"] == metric) & rows[column].notna()]
    return {(v, int(s)): i for v, s, i in zip(part["variant"], part["seed"], part[column])}


def split_seeds(rows: pd.DataFrame | dict[tuple[str, int], str], probe: str, metric: str,
                a: str, b: str) -> list[int]:
    """Seeds on which variants ``a`` and ``b`` have ``metric`` rows of ``probe`` measured by
    different invocations of ``variantlab run`` (so not side by side). ``rows`` may be
    :func:`invocations_of` of them already (a report pairs every variant with the
    baseline, so it maps them once)."""
    inv = rows if isinstance(rows, dict) else invocations_of(rows, probe, metric)
    seeds = sorted({s for v, s in inv if v == a} & {s for v, s in inv if v == b})
    return [s for s in seeds if inv[(a, s)] != inv[(b, s)]]


def split_stacks(rows: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Layer rows of a model of several stacks are named ``stack/slot`` (see
    :func:`variantlab.probes.common.stacked`): their stack and their plain name."""
    if "scope" not in rows.columns or "name" not in rows.columns or not len(rows):
        return [], []
    name = rows["name"].astype(object).where(rows["name"].notna(), "").astype(str)
    split = (rows["scope"] == "layer").to_numpy() & name.str.contains("/", regex=False).to_numpy()
    parts = name[split].str.split("/", n=1)
    stacks = pd.Series("", index=rows.index, dtype=object)
    stacks[split] = parts.str[0]
    names = name.astype(object).copy()
    names[split] = parts.str[1]
    return stacks.tolist(), names.tolist()


def _baseline(given: str | None, metas: list[RunMeta], variants: pd.DataFrame,
              order: list[str]) -> str:
    if given is not None:
        if given in order:
            return given
        hits = variants.loc[variants["stored_name"] == given, "variant"].tolist()
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ValueError(f"--baseline {given!r} is in several runs; choose one of: "
                             + ", ".join(hits))
        raise ValueError(f"--baseline {given!r}: no such variant; choose one of: "
                         + ", ".join(order))
    stored = metas[0].baseline
    first = variants[variants["run"] == metas[0].run]
    hits = first.loc[first["stored_name"] == stored, "variant"].tolist()
    return hits[0] if hits else order[0]


def variant_flat(spec: Any, overrides: Any) -> dict[str, Any]:
    """A variant's flattened spec (its overrides when the spec is missing), plus its
    setting axes (``measure.<probe>.<key>`` overrides: architecture and settings side by
    side)."""
    over = dict(overrides) if isinstance(overrides, Mapping) else {}
    flat = flatten(spec) if isinstance(spec, Mapping) and spec else dict(over)
    return {**flat, **{k: v for k, v in over.items() if k.startswith("measure.")}}


def differing_axes(data: ReportData) -> list[str]:
    """Dotted spec paths (and setting axes) whose values are not the same for every
    variant."""
    flats = [variant_flat(s, o) for s, o in zip(data.variants["spec"], data.variants["overrides"])]
    keys: list[str] = []
    for flat in flats:
        keys.extend(k for k in flat if k not in keys)
    return [k for k in keys if len({json.dumps(f.get(k), default=str) for f in flats}) > 1]
