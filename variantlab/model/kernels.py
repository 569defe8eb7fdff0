"""An experiment's ``kernels:``: which implementation a component runs when the experiment
leaves its ``impl`` unset.

- ``fast`` (the default): each such component with a fused kernel runs it
  (:attr:`~variantlab.model.specs.ComponentSpec.fast_impl`: LayerNorm's ``F.layer_norm``,
  GELU's ``F.gelu``, attention through ``scaled_dot_product_attention``);
- ``reference``: every component runs its written-out formula, the seeds' code and bits.

Training settings follow too: on ``fast``, a probe whose settings have a ``fused`` option
(the training recipe's, :class:`~variantlab.probes.recipe.RecipeSettings`) steps its
optimizer with torch's fused kernel where the experiment leaves ``fused`` unset
(:func:`settings_with_kernels`).

An ``impl`` (or ``fused``) the experiment writes (in ``model:`` or ``measure:``, a grid axis
or a variant's ``set:``) is kept either way. The chosen impl is part of the variant's spec,
and ``fused`` of its training settings, so both are in its unit keys: results of the two
never mix. A fused kernel is the same function up to float rounding (each is
tested equal to its reference); the differences grow with training at a high learning rate
(docs/running.md, "Kernels").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel

from ..errors import SpecError
from ..plugin.registry import Registry
from .specs import ComponentSpec, ModelSpec, parse_model_spec

Kernels = Literal["fast", "reference"]
KERNELS: tuple[str, ...] = get_args(Kernels)
#: what an experiment runs when it does not say
DEFAULT_KERNELS: Kernels = "fast"

Path = tuple[Any, ...]


def components(value: Any, path: Path = ()) -> Iterator[tuple[Path, ComponentSpec]]:
    """Every component spec in ``value`` (a model spec, a layout, a component holding others:
    an MLA's latent norm, a hybrid's attention) with its path of field names, keys and
    indices, outer before inner."""
    if isinstance(value, ComponentSpec):
        yield path, value
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from components(getattr(value, name), (*path, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from components(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from components(item, (*path, index))


def replaced(value: Any, path: Path, new: Any) -> Any:
    """``value`` with the item at ``path`` replaced by ``new`` (copies along the path; the
    whole is validated again by the caller)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, BaseModel):
        return value.model_copy(update={head: replaced(getattr(value, head), rest, new)})
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    items = list(value)
    items[head] = replaced(items[head], rest, new)
    return type(value)(items)


def unset_reference(spec: ComponentSpec) -> bool:
    """Whether ``spec`` has a fast kernel and runs its reference only because nothing set
    its ``impl``."""
    fast = type(spec).fast_impl
    if fast is None or "impl" in spec.model_fields_set:
        return False
    return getattr(spec, "impl", None) == type(spec).model_fields["impl"].default


def with_kernels(spec: ModelSpec, kernels: str, registry: Registry) -> ModelSpec:
    """``spec`` with every component whose ``impl`` it leaves unset on ``kernels``' choice:
    ``reference`` keeps ``spec`` as it is; ``fast`` switches each such component to its
    :attr:`~variantlab.model.specs.ComponentSpec.fast_impl`: all at once when the whole
    model validates so, else one at a time, each kept only if the model still validates (a
    soft-capped attention keeps its written-out softmax, which torch's fused kernel cannot
    cap)."""
    if kernels == "reference":
        return spec
    if kernels != "fast":
        raise ValueError(f"kernels: {kernels!r} is not one of {', '.join(KERNELS)}")
    switches = []  # (path, the component on its fast kernel) where that validates alone
    for path, component in components(spec):
        if not unset_reference(component):
            continue
        data = {**component.model_dump(), "impl": type(component).fast_impl}
        try:
            switches.append((path, type(component).model_validate(
                data, context={"registry": registry})))
        except (SpecError, ValueError):
            continue
    if not switches:
        return spec
    try:  # all at once: one validation of the whole model, as almost always suffices
        return whole(spec, switches, registry)
    except (SpecError, ValueError):
        pass
    out = spec
    for switch in switches:  # one at a time, each kept only if the model still validates
        try:
            out = whole(out, [switch], registry)
        except (SpecError, ValueError):
            continue
    return out


def whole(spec: ModelSpec, switches: list[tuple[Path, ComponentSpec]],
          registry: Registry) -> ModelSpec:
    """``spec`` with each switch's component in place, validated as a whole model (outer
    paths before inner ones, so an inner switch lands in its switched parent)."""
    out: Any = spec
    for path, component in switches:
        inner = [(p[len(path):], c) for p, c in switches if len(p) > len(path)
                 and p[:len(path)] == path]
        for rest, child in inner:
            component = replaced(component, rest, child)
        if not any(len(p) < len(path) and path[:len(p)] == p for p, _ in switches):
            out = replaced(out, path, component)
    return parse_model_spec(out.model_dump(), registry)


def settings_with_kernels(probes: Mapping[str, Any], kernels: str) -> dict[str, Any]:
    """Probe name -> settings, with ``fused: true`` on ``fast`` wherever a probe's settings
    have that option and the experiment left it unset; ``reference`` keeps them as given."""
    if kernels != "fast":
        return dict(probes)
    return {name: s.model_copy(update={"fused": True})
            if "fused" in type(s).model_fields and "fused" not in s.model_fields_set else s
            for name, s in probes.items()}


def kernel_line(kernels: str, specs: list[ModelSpec], settings: Iterable[Any] = ()) -> str:
    """``kernels: fast (attention: sdpa; norm: fused; optimizer: fused)``: the experiment's
    choice, the impl of every component with a fast kernel in any of its variants (``a | b``
    where they differ) and the optimizer step of the probe settings in ``settings`` that
    train (every variant's), for ``variantlab validate``."""
    found: dict[str, list[str]] = {}
    for spec in specs:
        for path, component in components(spec):
            if type(component).fast_impl is None:
                continue
            impls = found.setdefault(".".join(map(str, path)), [])
            if component.impl not in impls:  # type: ignore[attr-defined]
                impls.append(component.impl)  # type: ignore[attr-defined]
    parts = [f"{p}: {' | '.join(i)}" for p, i in sorted(found.items())]
    fused = sorted({"fused" if s.fused else "default" for s in settings
                    if "fused" in type(s).model_fields}, reverse=True)
    parts += [f"optimizer: {' | '.join(fused)}"] if fused else []
    return f"kernels: {kernels}" + (f" ({'; '.join(parts)})" if parts else "")


__all__ = ["DEFAULT_KERNELS", "KERNELS", "Kernels", "components", "kernel_line", "replaced",
           "settings_with_kernels", "unset_reference", "with_kernels"]
