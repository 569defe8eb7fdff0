"""Pydantic specs: component references and the model spec (YAML -> spec -> modules)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from ..errors import SpecError, SpecIssue, pydantic_issues
from ..plugin.registry import SLOTS, Registry, get_registry
from .layout import LAYER_SLOTS, LayoutSpec
from .positions import accepts


def context_registry(info: ValidationInfo, what: str) -> Registry:
    """The registry a validator resolves kinds in: the one passed as validation context
    (``model_validate(data, context={"registry": registry})``); there is no default."""
    registry = (info.context or {}).get("registry")
    if registry is None:
        raise TypeError(f"validating {what} resolves component kinds, which needs a registry: "
                        "use variantlab.parse_model_spec(data, registry) or pass "
                        "context={'registry': registry} to model_validate")
    return registry


class ComponentSpec(BaseModel):
    """Base of every component spec: ``kind`` plus the component's own parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # no silent coercion
    variantlab_spec_base: ClassVar[str] = "ComponentSpec"  # what the registry checks
    #: options added after the component was first released: left out of its data while at
    #: their defaults, so a spec written before they existed keeps its data and unit keys
    added_options: ClassVar[tuple[str, ...]] = ()
    #: a norm whose statistics pool over positions (BatchNorm): in a causal model each
    #: token's output then depends on later tokens; warned wherever it sits in the spec
    #: (:meth:`ModelSpec.warnings`)
    pools_positions: ClassVar[bool] = False
    #: the ``impl`` that runs a fused kernel, for a spec whose ``impl`` field defaults to its
    #: written-out reference: an experiment's ``kernels: fast`` (the default) switches to it
    #: where the experiment leaves ``impl`` unset (:mod:`variantlab.model.kernels`)
    fast_impl: ClassVar[str | None] = None
    kind: str

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: Any) -> Any:
        return omit_added_defaults(self, handler(self))

    def warnings(self, model: ModelSpec) -> list[str]:
        """Combinations that run but mislead, given the whole model (none by default)."""
        return []

    def errors(self, model: ModelSpec) -> list[tuple[str, str]]:
        """Combinations that cannot work, given the whole model, as ``(field, message)``
        pairs; the model spec then fails validation at ``<slot>.<field>`` (none by default)."""
        return []


def omit_added_defaults(spec: BaseModel, data: Any) -> Any:
    """``data`` (a spec's serialised fields) without the spec class's ``added_options`` that
    hold their defaults."""
    if isinstance(data, dict):
        fields = type(spec).model_fields
        for name in getattr(type(spec), "added_options", ()):
            if name in data and getattr(spec, name) == fields[name].default:
                del data[name]
    return data


DEFAULT_COMPONENTS: dict[str, dict[str, Any]] = {
    "norm": {"kind": "layer", "eps": 1e-5},
    "activation": {"kind": "gelu", "approximate": "tanh"},
    "feedforward": {"kind": "mlp", "hidden_mult": 4},
    "attention": {"kind": "mha"},
    "residual": {"kind": "pre_norm", "shortcut": True},
    "positional": {"kind": "learned"},
    "init": {"kind": "default"},
}


def resolve_component(
    slot: str, value: Any, registry: Registry, loc: tuple = ()
) -> ComponentSpec:
    """Validate ``{kind: NAME, ...}`` (or ``"NAME"``) against that kind's own spec class."""
    if isinstance(value, ComponentSpec):
        return value
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, Mapping):
        raise SpecError.at(loc, f"expected a mapping like {{kind: NAME, ...}}, got {value!r}")
    if "kind" not in value:
        kinds = ", ".join(registry.kinds(slot))
        raise SpecError.at(loc + ("kind",), f"missing; registered {slot} kinds: {kinds}")
    comp = registry.get(slot, value["kind"], loc + ("kind",))
    try:
        return cast(ComponentSpec,
                    comp.spec_cls.model_validate(dict(value), context={"registry": registry}))
    except ValidationError as exc:
        raise SpecError(pydantic_issues(exc, loc, list(comp.spec_cls.model_fields))) from None


def resolve_layout(value: Any, registry: Registry, loc: tuple = ("layout",),
                   n_layers: Any = None) -> Any:
    """``layout`` data with every layer kind's components validated against their own spec
    classes; raises :class:`SpecError` with every issue, the pattern's and layers' names
    included when ``n_layers`` is given (a LayoutSpec passes through)."""
    if value is None or isinstance(value, LayoutSpec) or not isinstance(value, Mapping):
        return value
    kinds = value.get("kinds", {})
    if not isinstance(kinds, Mapping):
        return value  # the schema reports it
    issues: list[SpecIssue] = []
    resolved: dict[str, Any] = {}
    for name, slots in kinds.items():
        if not isinstance(slots, Mapping):
            issues.append(SpecIssue(loc + ("kinds", name), (
                f"expected a mapping of slot overrides like {{attention: {{kind: mha}}}}, "
                f"got {slots!r}; {{}} for the model's own components")))
            continue
        resolved[name] = {}
        for slot, comp in slots.items():
            if slot not in LAYER_SLOTS:
                close = difflib.get_close_matches(str(slot), LAYER_SLOTS, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}? " if close else ""
                issues.append(SpecIssue(loc + ("kinds", name, slot), (
                    f"{slot!r} cannot vary per layer; {hint}a layer kind overrides "
                    f"{', '.join(LAYER_SLOTS)}")))
                continue
            try:
                resolved[name][slot] = resolve_component(
                    slot, comp, registry, loc + ("kinds", name, slot))
            except SpecError as exc:
                issues += exc.issues
    if issues:
        if isinstance(n_layers, int):
            try:
                names = LayoutSpec.model_validate({**value, "kinds": dict.fromkeys(kinds, {})})
                issues += names.problems(n_layers)
            except ValidationError:
                pass  # the model's validation reports these
        raise SpecError(issues)
    return {**value, "kinds": resolved}


def _slot_help(slot: str) -> str:
    return f"the {slot}: {{kind: NAME, ...}}; kinds: `variantlab plugins --slot {slot}`"


class ModelSpec(BaseModel):
    """A model: the seeds' GPT_CONFIG_124M keys, a family, and one component per slot.

    Plain data: families subclass it with a ``family`` literal and their own fields; how a
    family's models are fed and scored is the family's :class:`variantlab.model.tasks.Task`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # no silent coercion
    variantlab_spec_base: ClassVar[str] = "ModelSpec"  # what the registry checks

    family: str = Field(
        "gpt", description="the model family (`variantlab plugins --slot family`)")
    vocab_size: PositiveInt = Field(
        50257, description="number of token ids: embedding rows and output logits")
    context_length: PositiveInt = Field(
        1024, description="longest sequence the model takes (positional table, causal mask)")
    emb_dim: PositiveInt = Field(
        768, description="model width D: embedding and residual stream size")
    n_heads: PositiveInt = Field(12, description="attention heads; must divide emb_dim")
    n_layers: PositiveInt = Field(12, description="number of transformer blocks (per stack)")
    drop_rate: float = Field(
        0.1, ge=0.0, lt=1.0,
        description="dropout rate on embeddings, attention weights and residual branches")
    qkv_bias: bool = Field(False, description="bias in the query, key and value projections")
    tie_weights: bool = Field(
        False, description="share the token embedding matrix with the output projection")
    attn_out_bias: bool = Field(
        True, description="bias in the attention's output projection (false with qkv_bias "
        "false: Llama's and nanoGPT bias=False attention)")
    ffn_bias: bool = Field(
        True, description="biases in the feed-forward's Linear layers (kinds built without "
        "biases, e.g. glu, ignore it)")
    norm_bias: bool = Field(
        True, description="the norm's learned shift (norms without one, e.g. rms, ignore it)")
    final_norm: bool = Field(
        True, description="a norm after the last block, before the output projection")
    emb_drop_rate: float | None = Field(
        None, ge=0.0, lt=1.0, description="dropout on the embeddings; unset: drop_rate")
    attn_drop_rate: float | None = Field(
        None, ge=0.0, lt=1.0, description="dropout on the attention weights; unset: drop_rate")
    resid_drop_rate: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="dropout on each residual branch before it is added; unset: drop_rate")
    norm: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("norm"))
    activation: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("activation"))
    feedforward: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("feedforward"))
    attention: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("attention"))
    residual: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("residual"))
    positional: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("positional"))
    init: SerializeAsAny[ComponentSpec] = Field(description=_slot_help("init"))
    layout: LayoutSpec | None = Field(
        None, description="per-layer components: named layer kinds, a repeating pattern, "
        "explicit layers (docs/experiments.md, Layouts); unset: every layer alike")
    #: whether the family builds a stack of layers a layout can vary (block and mlp: no)
    layered: ClassVar[bool] = True
    #: whether the family's attention slot also cross-attends to a memory or runs in a
    #: bidirectional stack (decoder, encoder_decoder): a causal-only mixer cannot fill it
    cross_attention: ClassVar[bool] = False
    #: keys added after the first release: left out of the data while at their defaults
    #: (see :attr:`ComponentSpec.added_options`), so older specs keep their unit keys
    added_options: ClassVar[tuple[str, ...]] = ("layout",)

    @model_validator(mode="before")
    @classmethod
    def _resolve_components(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            return data
        registry = context_registry(info, "a model")
        out = dict(data)
        for slot in SLOTS:
            out[slot] = resolve_component(slot, out.get(slot, DEFAULT_COMPONENTS[slot]), registry)
        out["layout"] = resolve_layout(out.get("layout"), registry)
        return out

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: Any) -> Any:
        return omit_added_defaults(self, handler(self))

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_emb_dim(cls, n_heads: int, info: ValidationInfo) -> int:
        emb_dim = info.data.get("emb_dim")
        if emb_dim is not None and emb_dim % n_heads:
            divisors = [h for h in range(1, min(emb_dim, 64) + 1) if emb_dim % h == 0]
            raise ValueError(
                f"n_heads={n_heads} does not divide emb_dim={emb_dim}; "
                f"choose one of {divisors} or change emb_dim"
            )
        return n_heads

    @model_validator(mode="after")
    def _components_fit(self, info: ValidationInfo) -> ModelSpec:
        """Each component's :meth:`ComponentSpec.errors`, and a positional that acts inside
        attention (rotary, ALiBi) paired with an attention that cannot take it."""
        issues = [SpecIssue((slot, field), message) for slot, comp in self.components().items()
                  for field, message in comp.errors(self)]
        issues += mixer_issues(self.attention, self, ("attention", "kind"))
        issues += self._layout_issues()
        positional = self.positional
        if getattr(positional, "acts_in_attention", False):
            attention = context_registry(info, "a model").get(
                "attention", self.attention.kind, ("attention", "kind"))
            if attention is not None and not accepts(attention.build, "positions"):
                issues.append(SpecIssue(("positional", "kind"), (
                    f"positional {positional.kind!r} acts inside attention, but attention "
                    f"{self.attention.kind!r} (plugin {attention.plugin!r}) does not take "
                    "`positions` in its build; use attention 'mha' or a positional that adds "
                    "to the embeddings (learned, sinusoidal, none)")))
        if issues:
            raise SpecError(issues)
        return self

    def _layout_issues(self) -> list[SpecIssue]:
        """A layout's names and indices, a family without a layer stack, and each layer
        kind's components checked in the layer they build (``errors`` of the layer spec)."""
        if self.layout is None:
            return []
        if not self.layered:
            return [SpecIssue(("layout",), f"family {self.family!r} builds no stack of layers "
                                           "a layout could vary; remove layout")]
        issues = self.layout.problems(self.n_layers)
        acts = getattr(self.positional, "acts_in_attention", False)
        for name, slots in self.layout.kinds.items():
            layer = self.model_copy(update=slots)
            for slot, comp in slots.items():
                loc = ("layout", "kinds", name, slot)
                issues += [SpecIssue(loc + (f,), m) for f, m in comp.errors(layer)]
                if slot == "attention":
                    issues += mixer_issues(comp, layer, loc + ("kind",), in_layer=True)
                if slot == "positional" and not (acts and (
                        getattr(comp, "acts_in_attention", False)
                        or getattr(comp, "adds_nothing", False))):
                    issues.append(SpecIssue(loc + ("kind",), (
                        "a layer may change only a positional that acts inside attention "
                        "(rotary, alibi) or drop it (none: a NoPE layer), and only when the "
                        "model's own acts inside attention; the embeddings' positional is "
                        "the model's")))
        return issues

    def layer_spec(self, index: int) -> ModelSpec:
        """The spec layer ``index`` is built from: the model's, with its layer kind's slot
        overrides (the model itself without a layout)."""
        if self.layout is None:
            return self
        slots = self.layout.overrides(self.layout.kind_at(index))
        return self.model_copy(update=slots) if slots else self

    @property
    def causal(self) -> bool:
        """Whether a position may depend only on earlier ones (set per family)."""
        return True

    def drop(self, place: str) -> float:
        """The dropout rate at ``place`` (``emb``, ``attn`` or ``resid``): its own key if set,
        else ``drop_rate``."""
        if place not in ("emb", "attn", "resid"):
            raise ValueError(f"unknown dropout place {place!r}; choose emb, attn or resid")
        rate = getattr(self, f"{place}_drop_rate")
        return self.drop_rate if rate is None else rate

    def components(self) -> dict[str, ComponentSpec]:
        return {slot: getattr(self, slot) for slot in SLOTS}

    def warnings(self) -> list[str]:
        """Warnings of every component in this model and of each layer kind's components in
        the layer they build, and a norm that pools over positions in a causal model
        wherever it sits (:meth:`pooling_norms`)."""
        out = [w for comp in self.components().values() for w in comp.warnings(self)]
        for slots in (self.layout.kinds.values() if self.layout else ()):
            layer = self.model_copy(update=slots)
            out += [w for comp in slots.values() for w in comp.warnings(layer) if w not in out]
        if self.causal:
            out += [f"{path} {kind!r} in causal family {self.family!r}: its batch statistics "
                    "pool over future positions, so in training each token's output depends "
                    "on later tokens" for path, kind in self.pooling_norms()]
        return out

    def pooling_norms(self) -> list[tuple[str, str]]:
        """(where, kind) of every component spec whose class says it pools over positions
        (``pools_positions``): the model's slots, the specs inside them (an attention's
        ``qk_norm``, a mixer's norm) and each layout layer kind's, at any depth."""
        found: list[tuple[str, str]] = []

        def walk(value: Any, path: str) -> None:
            if isinstance(value, ComponentSpec):
                if type(value).pools_positions:
                    found.append((path, value.kind))
                for name in type(value).model_fields:
                    walk(getattr(value, name), f"{path}.{name}")
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    walk(item, f"{path}[{i}]")
            elif isinstance(value, dict):
                for key, item in value.items():
                    walk(item, f"{path}.{key}")

        for slot, comp in self.components().items():
            walk(comp, slot)
        for kind, slots in (self.layout.kinds.items() if self.layout else ()):
            for slot, comp in slots.items():
                walk(comp, f"layout.kinds.{kind}.{slot}")
        return found

    def to_data(self) -> dict[str, Any]:
        """Plain data (JSON-safe) that :func:`parse_model_spec` turns back into this spec."""
        return self.model_dump(mode="json")


def mixer_issues(comp: ComponentSpec, model: ModelSpec, loc: tuple,
                 in_layer: bool = False) -> list[SpecIssue]:
    """Where a causal-only sequence mixer (an attention-slot spec with ``causal_only``, see
    docs/plugins.md) cannot work: a bidirectional family, a family that cross-attends, and,
    in a layer of a layout, a positional that biases attention scores (ALiBi). The model's
    own attention slot refuses every positional acting inside attention already (the build
    takes no ``positions``); a mixer layer of a layout leaves rotary to the attention
    layers (Qwen3-Next's linear-attention layers use no rotary)."""
    if not getattr(type(comp), "causal_only", False):
        return []
    what = f"attention {comp.kind!r} is a causal sequence mixer"
    if type(model).cross_attention:
        return [SpecIssue(loc, f"{what}; family {model.family!r} also cross-attends to a "
                               "memory (or runs a bidirectional encoder) through this slot; "
                               "use family gpt, or attention mha")]
    if not model.causal:
        return [SpecIssue(loc, f"{what}; family {model.family!r} runs it bidirectionally "
                               "(not causal); use a causal family (gpt), or attention mha")]
    if in_layer and getattr(type(model.positional), "biases_scores", False):
        return [SpecIssue(loc, f"{what} and computes no attention scores for positional "
                               f"{model.positional.kind!r} to bias; use rotary, learned or "
                               "none, or attention mha in this layer")]
    return []


def parse_model_spec(data: Any, registry: Registry | None = None, loc: tuple = ()) -> ModelSpec:
    """Validate a mapping against its family's spec class in ``registry`` (``None``: the
    default registry, :func:`variantlab.get_registry`); every issue has its key path."""
    registry = get_registry() if registry is None else registry
    if isinstance(data, ModelSpec):
        data = data.model_dump()
    if not isinstance(data, Mapping):
        raise SpecError.at(loc, f"expected a mapping of model settings, got {data!r}")
    family = data.get("family", ModelSpec.model_fields["family"].default)
    fam = registry.get("family", family, loc + ("family",))
    issues = []
    resolved = dict(data)
    for slot in SLOTS:
        if slot in data:
            try:
                resolved[slot] = resolve_component(slot, data[slot], registry, loc + (slot,))
            except SpecError as exc:
                issues += exc.issues
                resolved.pop(slot)
    try:
        resolved["layout"] = resolve_layout(data.get("layout"), registry, loc + ("layout",),
                                           data.get("n_layers"))
    except SpecError as exc:
        issues += exc.issues
        resolved.pop("layout", None)
    try:
        spec = cast(ModelSpec, fam.spec_cls.model_validate(resolved, context={"registry": registry}))
    except ValidationError as exc:
        issues += pydantic_issues(exc, loc, list(fam.spec_cls.model_fields))
    if issues:
        raise SpecError(issues)
    return spec
