"""Edges that resolve themselves: extending a tuned axis beyond the grid where a best sits.

A tuned axis on a log or linear grid may be extended (``extend: true`` on the axis, or
``variantlab run --extend-edges``; :mod:`variantlab.config.roles`). After the grid has run,
the tuned comparison (:mod:`.tuned`) is read from the store: for every compared variant
in every condition whose chosen value of such an axis is the smallest or largest it tried,
one more value beyond that edge is run (the grid's own ratio or step,
:func:`variantlab.config.roles.next_value`), with its other axes at the chosen values.
Rounds repeat until no best sits at an extendable edge or an edge has been extended its
number of times (``extend: N``; ``true``: :data:`~variantlab.config.roles.DEFAULT_EXTENSIONS`).

Within one run (:class:`EdgeFeed`, what ``variantlab run`` does with the in-process and
pool executors) a group's extension does not wait for the whole grid: as soon as every
training unit of that group is stored, its next value beyond an edge is added and its units
are scheduled beside the grid's still running; a further value follows once those are
stored. :func:`run_extended` runs the same rounds as runs of their own, after the whole grid
(executors that cannot add units to a run, such as Ray).

The added values run as named variants appended to the experiment (so a worker process
rebuilds them from the experiment's text like any other); their units are ordinary units
with ordinary keys, stored beside the grid's, and a rerun finds them stored. The report
says what was added (tuned.csv ``extended``) and calls a best that still sits at an edge
*unresolved*.

An added value passes the checks a grid value passes before it is scheduled
(:func:`extension_problems`: the experiment's budget checks, the steps bound, the size
guard); one that fails is not added, and the run says why (``Extended.skipped``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ...config.experiment import Experiment, experiment_from_text
from ...config.named import key_of, value_names
from ...config.roles import next_value, numeric
from ...config.yamlio import YamlDoc
from ...errors import InputError
from ..frame import gather
from ..labels import value_text
from .tuned import Sweep, at_edge, choose, find_sweep, tried

TRAINING = "training"


@dataclass
class Extension:
    """One value added beyond an edge: for ``group``, ``axis`` at ``value`` (``side``)."""

    group: str
    axis: str
    side: str
    value: Any
    overrides: dict[str, Any]
    names: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # named axis values

    @property
    def name(self) -> str:
        """The added variant's name: every override, ``path=value``, as a grid names its
        variants (a named axis's value by its name)."""
        return ",".join(f"{p}={self.names.get(p, {}).get(key_of(v)) or value_text(v)}"
                        for p, v in self.overrides.items())


@dataclass
class Extended:
    """What the extension rounds did: the experiment with its added variants, each
    round's added values, and what could not be added (and why)."""

    experiment: Experiment
    rounds: list[list[Extension]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    summaries: list[Any] = field(default_factory=list)


def beyond(sweep: Sweep, overrides: Mapping[str, Mapping[str, Any]], extend: Mapping[str, int],
           order: list[str] | None = None,
           names: Mapping[str, Mapping[str, str]] | None = None) -> list[Extension]:
    """The values to run next: one per (group, extendable axis) whose chosen value sits at
    an edge the group has not yet extended ``extend[axis]`` times. ``overrides``: each
    variant's overrides; ``order``: the axes in the order the added variants name them
    (the experiment's); ``names``: the named axis values
    (:func:`variantlab.config.named.value_names`), which name the added variants."""
    out = []
    for group in sweep.archs:
        chosen = choose(sweep, group)
        if chosen is None:
            continue
        for axis in at_edge(sweep, chosen):
            limit, grid = extend.get(axis, 0), sweep.grid.get(axis) or []
            values, lo_hi = numeric(tried(sweep, group, axis)), numeric(grid)
            if not limit or values is None or lo_hi is None:
                continue
            side = "low" if float(chosen[axis]) == values[0] else "high"
            done = sum(v < lo_hi[0] for v in values) if side == "low" else \
                sum(v > lo_hi[-1] for v in values)
            new = next_value(values, grid, side)
            if done >= limit or new is None:
                continue
            over = {**dict(overrides.get(str(chosen["variant"])) or {}), axis: new}
            rank = {a: i for i, a in enumerate(order or [])}
            over = dict(sorted(over.items(), key=lambda kv: rank.get(kv[0], len(rank))))
            out.append(Extension(group, axis, side, new, over, names or {}))
    return out


def with_variants(experiment: Experiment, added: list[Extension],
                  extra_plugins: tuple[str, ...] = ()) -> Experiment:
    """``experiment`` with ``added`` as named variants after its own (rebuilt from its text
    with them appended, so workers can rebuild it too); InputError when one is refused."""
    data = dict(experiment.doc.data) if experiment.doc is not None else {}
    named = list(data.get("variants") or [])
    have = {n.get("name") for n in named if isinstance(n, Mapping)}
    named += [{"name": e.name, "set": e.overrides} for e in added if e.name not in have]
    text = yaml.safe_dump({**data, "variants": named}, sort_keys=False)
    return experiment_from_text(text, experiment.path or "<string>",
                                base_dir=experiment.base_dir, extra_plugins=extra_plugins,
                                max_variants=None)


class _Unplaced(YamlDoc):
    """Messages about an added variant without a place: its YAML is generated, so a line,
    a column or a key path would point nowhere the user wrote."""

    def message(self, loc: Sequence[object], message: str, at: str = "auto") -> str:
        return message


def extension_problems(experiment: Experiment, name: str) -> list[str]:
    """Why the added variant ``name`` of ``experiment`` may not run (empty: it may): the
    checks a grid value passes before a run (:mod:`variantlab.sweep.preflight`: the budget
    in steps, its bound and warmup, and the size guard on its probes' devices)."""
    from ...sweep.preflight import budget_problems, size_problems  # torch: only when run

    only = {name}
    doc = _Unplaced({})
    found = budget_problems(experiment, doc, only) + size_problems(experiment, doc, None,
                                                                   only=only)
    return [message.removeprefix(f"variant {name!r}: ") for message in found]


def run_extended(experiment: Experiment, run: Callable[[Experiment], Any],
                 extend: Mapping[str, int], extra_plugins: tuple[str, ...] = (),
                 on_round: Callable[[int, list[Extension]], None] | None = None) -> Extended:
    """Run ``experiment`` (``run(experiment) -> RunSummary``, e.g. ``run_experiment`` with
    its options), then extension rounds while a best sits at an extendable edge (module
    docstring). Stops early when a run is interrupted or cannot write."""
    out = Extended(experiment)
    summary = run(experiment)
    out.summaries.append(summary)
    for number in range(1, max(extend.values(), default=0) * 2 + 1):
        if summary.interrupted or summary.write_error is not None:
            break
        data = gather([summary.run_dir])
        sweep = find_sweep(data, TRAINING)
        if sweep is None:
            break
        overrides = dict(zip(data.variants["variant"], data.variants["overrides"]))
        names = value_names(experiment.doc.data) if experiment.doc is not None else {}
        added = beyond(sweep, overrides, extend, list(experiment.roles), names)
        if not added:
            break
        accepted: list[Extension] = []
        for ext in added:  # each value on its own: one the model or probe refuses is skipped
            try:
                trial = with_variants(out.experiment, [*accepted, ext], extra_plugins)
            except InputError as exc:
                out.skipped.append(f"{ext.name}: {'; '.join(exc.messages)}")
                continue
            problems = extension_problems(trial, ext.name)
            if problems:
                out.skipped.append(f"{ext.name}: {'; '.join(problems)}")
            else:
                accepted.append(ext)
        if not accepted:
            break
        added = accepted
        bigger = with_variants(out.experiment, added, extra_plugins)
        out.rounds.append(added)
        if on_round is not None:
            on_round(number, added)
        out.experiment = bigger
        summary = run(bigger)
        out.summaries.append(summary)
    return out


class EdgeFeed:
    """Edge extension inside one run (``run_experiment(grow=EdgeFeed(...))``): called after
    each stored unit (``None``: at the start), it adds, for every group whose training units
    are all stored, what :func:`beyond` gives that group (each value once; one a model or
    probe refuses is skipped, as in :func:`run_extended`). It reads the run's store only
    when a group may have just been completed: at the start, and when the stored unit was
    the last training unit of its group still missing. Returns the experiment with the
    added variants, or None when nothing was added.

    It also makes each group's choice as soon as the group is complete and extends no
    further: the chosen variant's (variant, seed) pairs join :attr:`tested`, whose test
    units the run then adds (:func:`variantlab.sweep.units.plan_units`: a tuned sweep's
    training units score their test split only there) when ``defer`` is set (the run then
    plans its training units that way); with ``extend`` empty that is all it does."""

    def __init__(self, experiment: Experiment, run_dir: Path | str, extend: Mapping[str, int],
                 extra_plugins: Sequence[str] = (),
                 on_added: Callable[[int, list[Extension]], None] | None = None,
                 defer: bool = False) -> None:
        self.experiment, self.run_dir, self.defer = experiment, Path(run_dir), defer
        self.extend, self.extra_plugins = dict(extend), tuple(extra_plugins)
        self.on_added = on_added
        self.rounds: list[list[Extension]] = []  # what each call added, in order
        self.skipped: list[str] = []
        self.tried: set[str] = set()  # added variants' names, accepted or not
        self.group_of: dict[str, str] | None = None  # variant -> group (None: not read yet)
        self.stored: set[str] = set()  # training unit keys stored in this run
        #: (variant, seed) pairs whose test split is scored: each finished group's choice
        self.tested: set[tuple[str, int]] = set()
        self.settled: set[str] = set()  # the variants of those groups
        self.keys = self._training_keys()

    def _training_keys(self) -> dict[str, list[str]]:
        """Variant -> the keys of its training units (one per seed), as the run plans them
        (``defer``: their test splits scored at the chosen settings only)."""
        from ...sweep.units import plan_units

        out: dict[str, list[str]] = {}
        for unit in plan_units(self.experiment, defer=self.defer):
            if unit.probe == TRAINING:
                out.setdefault(unit.variant.name, []).append(unit.key)
        return out

    def _maybe_complete(self, unit: Any) -> bool:
        """Whether ``unit``'s group may be complete now that ``unit`` is stored."""
        self.stored.add(unit.key)
        if self.group_of is None:
            return True
        group = self.group_of.get(unit.variant.name)
        mates = [v for v, g in self.group_of.items() if g == group]
        if mates and all(v in self.settled for v in mates):
            return False  # chosen already, nothing added since (a rerun's stored units)
        return group is not None and all(k in self.stored for v in mates
                                         for k in self.keys.get(v, []))

    def __call__(self, unit: Any = None) -> Experiment | None:
        if unit is not None and (getattr(unit, "probe", None) != TRAINING
                                 or not self._maybe_complete(unit)):
            return None
        data = self._read()
        sweep = find_sweep(data, TRAINING)
        if sweep is None:
            return None
        shown = dict(zip(sweep.cells["variant"], sweep.cells["arch"]))
        # what this feed added keeps its group even where the store does not list it yet
        # (the pool's driver writes a decision's variants while the next one reads)
        self.group_of = {**self._added(),
                         **{str(stored): shown[name] for stored, name in
                            zip(data.variants["stored_name"], data.variants["variant"])
                            if name in shown}}
        units = data.units
        self.stored |= set(units.loc[(units["probe"] == TRAINING)
                                     & units["status"].isin(["ok", "failed"]), "key"])
        ready = complete_groups(data, sweep, self.experiment.seeds) - self._running()
        overrides = dict(zip(data.variants["variant"], data.variants["overrides"]))
        doc = self.experiment.doc
        names = value_names(doc.data) if doc is not None else {}
        order = list(self.experiment.roles)
        new = [e for e in beyond(sweep, overrides, self.extend, order, names)
               if e.group in ready and e.name not in self.tried] if self.extend else []
        bigger = self._extend(new)
        growing = {e.group for e in self.rounds[-1]} if bigger is not None else set()
        self._choose(data, sweep, ready - growing)  # the others have their choice: test it
        return bigger

    def _read(self) -> Any:
        """The run's store, as the report reads it (:func:`gather`), cut to this feed's
        experiment's variants: a resumed run's store still lists what an earlier run added
        until this feed has added it again (``write_experiment(keep_stored=True)``), and the
        feed decides from its own experiment, so that it adds the same values again."""
        from ...store.store import load_run

        run = load_run(self.run_dir)
        mine = {v.name for v in self.experiment.variants}
        rows = run.rows[run.rows["variant"].isin(mine)]
        units = run.units[run.units["variant"].isin(mine)
                          | run.units["key"].isin(set(rows["unit_key"]))]
        return gather([replace(run, variants=run.variants[run.variants["name"].isin(mine)],
                               units=units, rows=rows)])

    def _running(self) -> set[str]:
        """The groups with a variant this feed added whose training units are not all
        stored yet: not complete, whatever the store's own variants table says."""
        return {group for name, group in self._added().items()
                if not all(k in self.stored for k in self.keys.get(name, []))}

    def _added(self) -> dict[str, str]:
        """Each variant this feed added -> its group."""
        return {e.name: e.group for r in self.rounds for e in r}

    def _choose(self, data: Any, sweep: Sweep, ready: set[str]) -> None:
        """Give the chosen setting of each group of ``ready`` (complete, extending no
        further) its test units: one per seed (:attr:`tested`); the group's variants are
        :attr:`settled`."""
        stored = dict(zip(data.variants["variant"], data.variants["stored_name"]))
        for group in ready:
            members = {str(stored.get(v, v))
                       for v in sweep.cells.loc[sweep.cells["arch"] == group, "variant"]}
            if members <= self.settled:
                continue  # chosen at an earlier read, and nothing was added to it since
            self.settled |= members
            chosen = choose(sweep, group)
            if chosen is not None:
                name = str(stored.get(chosen["variant"], chosen["variant"]))
                self.tested |= {(name, int(seed)) for seed in self.experiment.seeds}

    def _extend(self, new: list[Extension]) -> Experiment | None:
        """Add the values of ``new`` that pass the checks (:func:`extension_problems`);
        the experiment with them, or None when none was added."""
        accepted: list[Extension] = []
        for ext in new:
            self.tried.add(ext.name)
            try:
                trial = with_variants(self.experiment, [*accepted, ext], self.extra_plugins)
            except InputError as exc:
                self.skipped.append(f"{ext.name}: {'; '.join(exc.messages)}")
                continue
            problems = extension_problems(trial, ext.name)
            if problems:
                self.skipped.append(f"{ext.name}: {'; '.join(problems)}")
            else:
                accepted.append(ext)
        if not accepted:
            return None
        self.experiment = with_variants(self.experiment, accepted, self.extra_plugins)
        self.keys = self._training_keys()
        self.group_of = {**(self.group_of or {}), **{ext.name: ext.group for ext in accepted}}
        self.rounds.append(accepted)
        if self.on_added is not None:
            self.on_added(len(self.rounds), accepted)
        return self.experiment


def complete_groups(data: Any, sweep: Sweep, seeds: Sequence[int]) -> set[str]:
    """The groups of ``sweep`` whose every variant has a stored (ok or failed) training
    unit for every seed."""
    units = data.units
    stored = units[(units["probe"] == TRAINING) & units["status"].isin(["ok", "failed"])]
    have = {(str(v), int(s)) for v, s in zip(stored["variant"], stored["seed"])}
    out = set()
    for group in sweep.archs:
        variants = sweep.cells.loc[sweep.cells["arch"] == group, "variant"]
        if all((str(v), int(s)) in have for v in variants for s in seeds):
            out.add(group)
    return out


__all__ = ["EdgeFeed", "Extended", "Extension", "beyond", "complete_groups",
           "extension_problems", "run_extended",
           "with_variants"]
