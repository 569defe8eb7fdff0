"""Experiments: read the YAML, expand the grid and named variants, validate everything.

Nothing is computed here. Every problem in the file, in every variant, is collected and
raised as one :class:`InputError` whose messages read ``FILE:LINE:COL: key.path: message``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..data.sources import DataSpec, SyntheticData
from ..errors import InputError, PluginLoadError, SpecError
from ..model.kernels import DEFAULT_KERNELS, Kernels, settings_with_kernels
from ..plugin.registry import Registry, build_registry
from .axes import effective, seq_len_problems
from .checks import MAX_VARIANTS, grid_cap_message, grid_size, nonfinite, seed_problems
from .expand import Collector, Variant, expand_variants
from .hints import plugin_hint
from .measure import MeasureSpec, ProbeResources
from .metrics import DEFAULT_COMPARE_ON, compare_on_checks
from .named import named_axes, value_names
from .overrides import (
    expansions,
    fit_tuned,
)
from .roles import MAX_EXTENSIONS, Role, axis_mappings, axis_roles, extensions, role_checks, spec_axes
from .yamlio import YamlDoc, YamlError, load_yaml, read_text

SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_NAME = 100  # characters (ASCII, so bytes): well under a folder name's 255
MAX_QUESTION = 200  # characters: one line of the findings table


class NamedVariant(BaseModel):
    """``{name: ..., set: {dotted.path: value}}``: overrides applied to the base model."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


class ExperimentSpec(BaseModel):
    """The experiment file's top level."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str
    description: str = ""
    question: str = Field(
        default="", max_length=MAX_QUESTION,
        description="the experiment's question in one line: the findings table "
                    "(variantlab findings) opens its row with it")
    note: str = Field(
        default="",
        description="hand-written context for the findings table; every number it quotes "
                    "must be in the report's CSVs")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    model: dict[str, Any]
    kernels: Kernels = Field(
        default=DEFAULT_KERNELS,
        description="fast: components whose impl the experiment leaves unset run torch's "
                    "fused kernels (F.layer_norm, F.gelu, scaled_dot_product_attention), "
                    "and training steps its optimizer fused where fused is unset; "
                    "reference: their written-out formulas and torch's default step, the "
                    "seeds' bits "
                    "(docs/running.md, \"Kernels\")")
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)
    variants: list[NamedVariant] = Field(default_factory=list)
    baseline: str | None = None
    plugins: list[str] = Field(default_factory=list)
    data: DataSpec = Field(default_factory=SyntheticData)
    measure: dict[str, dict[str, Any] | None] = Field(
        default_factory=lambda: dict[str, dict[str, Any] | None](params={}),
        description="the probes to run, each with its settings; an absent probe is skipped")
    compare_on: str = Field(
        default=DEFAULT_COMPARE_ON,
        description="the headline metric: tuned axes are chosen on its validation value and "
                    "reported on its test value (loss, recall_accuracy, or a metric a plugin "
                    "probe declares)")
    equivalence_margin: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="headline metric -> the margin δ within which the report calls two "
                    "variants equal (their paired 90% interval inside ±δ); default loss: "
                    "0.02 nats, recall_accuracy: 0.02 (2 points); not part of unit keys")
    tune: list[str] = Field(
        default_factory=list,
        description="model keys tuned for each compared variant (its best value is chosen "
                    "on the headline metric's validation value), besides the measure.* axes")
    conditions: list[str] = Field(
        default_factory=list,
        description="axes that are conditions (variants are compared only within one), "
                    "besides data.*, emb_dim and n_layers")
    extend: dict[str, Annotated[int, Field(ge=1, le=MAX_EXTENSIONS)]] = Field(
        default_factory=dict,
        description="tuned axis -> extensions per edge while a compared variant's best sits "
                    "there (a grid axis written {values: [...], extend: true | N} sets it)")
    resources: dict[str, ProbeResources] = Field(
        default_factory=dict,
        description="probe name -> the CPUs and GPUs each of its units reserves under "
                    "--executor ray (not part of unit keys)")

    @model_validator(mode="before")
    @classmethod
    def _axis_mappings(cls, data: Any) -> Any:
        """A grid axis written ``{values: [...], extend: true | N}``: its values, and its
        extensions under ``extend`` (:func:`variantlab.config.roles.axis_mappings`); a grid
        axis written ``{name: value, ...}``: its values (:mod:`variantlab.config.named`)."""
        return axis_mappings(named_axes(data))

    @field_validator("question")
    @classmethod
    def _one_line(cls, question: str) -> str:
        if "\n" in question.strip():
            raise ValueError("the question is one line; write it as `question: ...` on one "
                             "line (a longer text goes in description: or note:)")
        return question.strip()

    @field_validator("name")
    @classmethod
    def _folder_safe(cls, name: str) -> str:
        if not re.match(SAFE_NAME, name) or name in (".", ".."):
            raise ValueError(
                f"{name!r} cannot name a results folder; use letters, digits, '.', '_' and '-' "
                "(e.g. 'pre-vs-post-norm')"
            )
        if len(name) > MAX_NAME:
            raise ValueError(f"the name is {len(name)} characters long; results folders are "
                             f"named after it: use at most {MAX_NAME}")
        return name


@dataclass
class Experiment:
    spec: ExperimentSpec
    path: Path | None
    base_dir: Path
    source_text: str
    registry: Registry
    variants: list[Variant]
    doc: YamlDoc | None = None
    measure_spec: MeasureSpec | None = None  # ``measure:`` validated against the registry

    @property
    def base_note(self) -> str | None:
        """Why a variant named ``base`` is in the list when the file has ``variants:`` and
        no ``grid:`` (expansion adds the model as written, then the named variants)."""
        if self.spec.grid or not self.spec.variants:
            return None
        return ("base: the model as written under `model:`, with no changes; added as the "
                "first variant because `variants:` lists changes to it and there is no `grid:`")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.seeds)

    @property
    def roles(self) -> dict[str, Role]:
        """Every axis (grid, then named variants' set: paths) -> its role
        (:mod:`variantlab.config.roles`)."""
        axes = spec_axes(self.spec.grid, [v.set for v in self.spec.variants])
        return axis_roles(axes, self.spec.tune, self.spec.conditions)

    @property
    def partial_axes(self) -> dict[str, int]:
        """Tuned model axis -> how many grid combinations left it out because their model has
        no such field (:func:`~variantlab.config.overrides.fit_tuned`: DyT's alpha0 beside
        LayerNorm)."""
        combos = expansions(self.spec.grid, [v.set for v in self.spec.variants])
        return fit_tuned(combos, self.spec.tune, self.spec.model, self.registry)[1]

    def extensions(self, edges: bool = False) -> dict[str, int]:
        """Tuned axis -> extensions per edge: ``extend:`` on the axes, and with ``edges``
        (``--extend-edges``) :data:`DEFAULT_EXTENSIONS` for every other tuned grid axis on a
        log or linear grid."""
        return extensions(self.spec.extend, self.roles, self.spec.grid, edges)

    @property
    def measure(self) -> MeasureSpec:
        if self.measure_spec is None:
            given = MeasureSpec(self.spec.measure, registry=self.registry).probes()
            self.measure_spec = MeasureSpec(settings_with_kernels(given, self.spec.kernels))
        return self.measure_spec

    @property
    def data(self) -> Any:
        return self.spec.data

    @property
    def baseline(self) -> str:
        return self.spec.baseline or self.variants[0].name

    def probes_of(self, variant: Variant) -> dict[str, Any]:
        """Probe name -> the settings ``variant``'s units run with: ``measure:``'s, with
        the variant's setting axes applied."""
        return effective(self.measure.probes(), variant.settings)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


# -- loading ----------------------------------------------------------------------------
def _parse_spec(doc: YamlDoc, out: Collector) -> ExperimentSpec | None:
    data = doc.data
    if not isinstance(data, Mapping):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        out.add((), f"expected a mapping with at least 'name' and 'model', got {got}")
        return None
    known = list(ExperimentSpec.model_fields)
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        out.add_pydantic(exc, (), known)
        bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
    # go on with what is valid, so that variant errors are reported in the same pass
    lenient = {k: v for k, v in data.items() if k not in bad and k in known}
    if "model" not in lenient:
        return None
    lenient.setdefault("name", "unnamed")
    try:
        return ExperimentSpec.model_validate(lenient)
    except ValidationError:
        return None


def _registry(spec: ExperimentSpec, base_dir: Path, extra: Sequence[str], out: Collector,
              paths: Mapping[str, str] | None = None) -> Registry | None:
    """The registry with the experiment's plugins and ``extra``; ``paths``: plugin target ->
    the file to import it from instead (a worker's shipped copy)."""
    registry = build_registry(base_dir=base_dir, defer=True)  # validate needs no executor
    paths = paths or {}
    ok = True
    wanted: list[tuple[tuple[str, int] | None, str, Path]] = [
        (("plugins", i), p, base_dir) for i, p in enumerate(spec.plugins)]
    wanted += [(None, p, Path.cwd()) for p in extra]
    for loc, target, where in wanted:
        def load(t: str = target, w: Path = where) -> None:
            registry.load(t, "module", w, paths.get(t))

        try:
            registry.load_guarded(target, "module", load, True)
        except PluginLoadError as exc:
            ok = False
            cause = exc.__cause__ or exc
            msg = f"plugin {target!r} could not be loaded: {type(cause).__name__}: {cause}"
            if loc is None:
                out.messages.append(f"--plugin {target}: {msg}")
            else:
                out.add(loc, msg + "; check the module name or file path (relative to the experiment file)")
    return registry if ok else None


def _measure(spec: ExperimentSpec, registry: Registry | None, out: Collector) -> MeasureSpec:
    """``measure:`` validated against the registered probes: an unknown probe or a bad
    setting is a located message; what is valid is kept."""
    valid = {}
    for name, raw in spec.measure.items():
        if registry is None:
            break
        try:
            probe = registry.probe(name, ("measure", name))
        except SpecError as exc:
            for issue in exc.issues:
                out.add(issue.loc, issue.message, at="key")
            continue
        if raw is None:
            continue
        try:
            valid[name] = probe.settings_cls.model_validate(raw)
        except ValidationError as exc:
            out.add_pydantic(exc, ("measure", name), list(probe.settings_cls.model_fields))
    return MeasureSpec(settings_with_kernels(valid, spec.kernels), registry=registry)


def _named(short: dict[str, int], contexts: dict[str, int]) -> str:
    """The variants of ``short`` in words: every variant, or their names."""
    return ("every variant" if len(short) == len(contexts) > 1 else
            "variant(s) " + ", ".join(map(repr, short)))


def _cross_checks(
    spec: ExperimentSpec, measure: MeasureSpec, contexts: dict[str, int], doc: YamlDoc,
    out: Collector,
) -> None:
    """seq_len of every probe against every variant's context_length; the baseline."""
    for probe, settings in measure.probes().items():
        seq_len = getattr(settings, "seq_len", None)
        if seq_len is None:
            continue
        short = {n: c for n, c in contexts.items() if seq_len > c}
        if short:
            ctx = min(short.values())
            names = _named(short, contexts)
            given = doc.get(("measure", probe, "seq_len")) is not None
            what = "seq_len" if given else f"seq_len (default {seq_len})"
            out.add(("measure", probe, "seq_len"),
                    f"{what} is above context_length={ctx} of {names}; "
                    f"use seq_len <= {ctx} or raise context_length")
        for length in getattr(settings, "eval_lengths", None) or ():
            short = {n: c for n, c in contexts.items() if length > c}
            if short:
                ctx = min(short.values())
                out.add(("measure", probe, "eval_lengths"),
                        f"eval_lengths: {length} is above context_length={ctx} of "
                        f"{_named(short, contexts)}; score at most {ctx} tokens or raise "
                        "context_length")
    for probe in spec.resources:
        if probe not in measure:
            out.add(("resources", probe), f"no probe {probe!r} runs in this experiment; "
                    f"resources are set per probe of measure: "
                    f"({', '.join(measure.probes()) or 'none'})", at="key")
    variant_names = list(contexts)
    if spec.baseline is not None and variant_names and spec.baseline not in variant_names:
        close = difflib.get_close_matches(spec.baseline, variant_names, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else "choose one of the variants."
        out.add(("baseline",), f"{spec.baseline!r} names no variant; {hint} "
                               f"Variants: {', '.join(variant_names)}")


def experiment_from_text(
    text: str, path: str | Path = "<string>", *, base_dir: str | Path | None = None,
    extra_plugins: Sequence[str] = (), max_variants: int | None = MAX_VARIANTS,
    plugin_paths: Mapping[str, str] | None = None,
) -> Experiment:
    """Parse, expand and validate an experiment; raises :class:`InputError` listing all problems.

    A grid of more than ``max_variants`` variants is refused before anything is expanded
    (None: no limit, for a worker process rebuilding an experiment its driver accepted).
    ``plugin_paths``: plugin (as named in ``plugins:`` or ``extra_plugins``) -> the file to
    import it from, for a worker on another machine; the plugin keeps its name."""
    real = None if str(path).startswith("<") else Path(path)
    base = Path(base_dir) if base_dir is not None else (real.parent if real else Path.cwd())
    try:
        doc = load_yaml(text, str(path))
    except YamlError as exc:
        raise InputError(exc.messages) from None
    out = Collector(doc)
    spec = _parse_spec(doc, out)
    if spec is None:
        raise InputError(out.messages)
    not_finite = nonfinite(doc)  # said once, instead of the range errors they also cause
    heads = [m.partition(" is not a finite")[0].rsplit(": ", 1)[0] + ": " for m in not_finite]
    out.messages = [m for m in out.messages if not any(map(m.startswith, heads))]
    out.messages += not_finite + seed_problems(doc.get(("seeds",), []) or [], doc)
    n_named = len(spec.variants)
    if max_variants is not None and grid_size(spec.grid, n_named) > max_variants:
        raise InputError(out.messages + [grid_cap_message(doc, spec.grid, n_named, max_variants)])
    registry = _registry(spec, base, extra_plugins, out, plugin_paths)
    variants, contexts = (expand_variants(spec, registry, out, ("model",), value_names(doc.data))
                          if registry else ([], {}))
    measure = _measure(spec, registry, out)
    _cross_checks(spec, measure, contexts, doc, out)
    for loc, msg, at in [*compare_on_checks(spec, measure, registry, variants),
                         *role_checks(spec, doc)]:
        out.add(loc, msg, at)
    for loc, msg in seq_len_problems(spec, variants):  # seq_len axes vs context_length
        out.add(loc, msg)
    if out.messages:  # an unknown kind says how to load the plugin that has it
        raise InputError([plugin_hint(m, base, [*spec.plugins, *extra_plugins], registry)
                          for m in out.messages])
    assert registry is not None  # else _registry added a message and InputError was raised
    return Experiment(spec, real, base, text, registry, variants, doc, measure)


def _read(path: str | Path) -> str:
    try:
        return read_text(path)
    except YamlError as exc:
        raise InputError(exc.messages) from None


def load_experiment(path: str | Path, *, extra_plugins: Sequence[str] = (),
                    max_variants: int = MAX_VARIANTS) -> Experiment:
    """Load ``path`` (an experiment YAML); raises :class:`InputError`."""
    return experiment_from_text(_read(path), path, extra_plugins=extra_plugins,
                                max_variants=max_variants)


def load_model_file(path: str | Path, *, extra_plugins: Sequence[str] = ()) -> list[Variant]:
    """Variants of an experiment YAML, or the single model of a bare model mapping
    (optionally with a ``plugins:`` list), for ``variantlab describe``."""
    return loadexpand_variants(path, extra_plugins=extra_plugins)[0]


def loadexpand_variants(
    path: str | Path, *, extra_plugins: Sequence[str] = (), max_variants: int = MAX_VARIANTS,
) -> tuple[list[Variant], Registry]:
    """:func:`load_model_file`'s variants with the registry that builds them."""
    variants, registry, _ = load_model_doc(path, extra_plugins=extra_plugins,
                                           max_variants=max_variants)
    return variants, registry


def load_model_doc(
    path: str | Path, *, extra_plugins: Sequence[str] = (), max_variants: int = MAX_VARIANTS,
) -> tuple[list[Variant], Registry, Experiment | None]:
    """:func:`load_variants` plus the experiment (None for a bare model mapping)."""
    text = _read(path)
    try:
        doc = load_yaml(text, str(path))
    except YamlError as exc:
        raise InputError(exc.messages) from None
    if isinstance(doc.data, Mapping) and isinstance(doc.data.get("model"), Mapping):
        exp = experiment_from_text(text, path, extra_plugins=extra_plugins,
                                   max_variants=max_variants)
        return exp.variants, exp.registry, exp
    out = Collector(doc)
    out.messages += nonfinite(doc)
    if not isinstance(doc.data, Mapping):
        out.add((), "expected a model mapping (family, emb_dim, ...) or an experiment")
        raise InputError(out.messages)
    model = dict(doc.data)
    plugins = model.pop("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        out.add(("plugins",), "expected a list of plugin module names or .py files")
        raise InputError(out.messages)
    shell = ExperimentSpec(name="model", model=model, plugins=plugins)
    registry = _registry(shell, Path(path).parent, extra_plugins, out)
    variants = expand_variants(shell, registry, out, ())[0] if registry is not None else []
    if out.messages:
        raise InputError(out.messages)
    assert registry is not None  # else _registry added a message and InputError was raised
    return variants, registry, None
