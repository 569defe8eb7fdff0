"""What the probes share: parameter attribution by slot/layer tags, device and dtype."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..model.specs import ModelSpec

EMBEDDING_SLOTS = frozenset({"embedding", "positional"})
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ParamInfo:
    name: str  # qualified name (first name of a tied tensor)
    param: nn.Parameter
    slot: str  # innermost ``variantlab_slot`` above it, "other" if none
    layer: int | None  # innermost ``variantlab_layer`` above it
    stack: str = ""  # the stack it belongs to ("encoder", "decoder"), "" in a one-stack model


def _has_layers(module: nn.Module) -> bool:
    return any(hasattr(m, "variantlab_layer") for m in module.modules())


def stack_roots(model: nn.Module) -> dict[str, str]:
    """Qualified module name -> stack name for the modules that start a stack of layers.

    A module tagged ``variantlab_stack = "name"`` starts one. Untagged, a model whose
    numbered layers sit under more than one of its direct children (an encoder and a
    decoder) has one stack per such child, named by its attribute name.
    """
    tagged = {name: str(m.variantlab_stack) for name, m in model.named_modules()
              if hasattr(m, "variantlab_stack")}
    if tagged:
        return tagged
    holders = [name for name, child in model.named_children() if _has_layers(child)
               and not hasattr(child, "variantlab_layer")]
    return {name: name for name in holders} if len(holders) > 1 else {}


def param_index(model: nn.Module) -> list[ParamInfo]:
    """Every parameter tensor once (tied weights under their first name), with the slot of
    the innermost tagged module that holds it, its layer index and its stack."""
    seen: set[int] = set()
    out: list[ParamInfo] = []
    roots = stack_roots(model)

    def walk(module: nn.Module, prefix: str, slot: str, layer: int | None, stack: str) -> None:
        slot = getattr(module, "variantlab_slot", slot)
        layer = getattr(module, "variantlab_layer", layer)
        stack = roots.get(prefix[:-1], stack)
        for pname, p in module.named_parameters(recurse=False):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append(ParamInfo(prefix + pname, p, slot, layer, stack))
        for cname, child in module.named_children():
            walk(child, f"{prefix}{cname}.", slot, layer, stack)

    walk(model, "", "other", None, "")
    return out


def layer_stacks(model: nn.Module) -> list[tuple[int, nn.Module, str]]:
    """``(layer index, module, stack)`` of each module tagged ``variantlab_layer``
    (outermost per branch), sorted by layer index; stack "" in a one-stack model."""
    found: list[tuple[int, nn.Module, str]] = []
    roots = stack_roots(model)

    def walk(module: nn.Module, prefix: str, stack: str) -> None:
        for cname, child in module.named_children():
            name = prefix + cname
            child_stack = roots.get(name, stack)
            if hasattr(child, "variantlab_layer"):
                found.append((int(getattr(child, "variantlab_layer")), child, child_stack))  # noqa: B009
            else:
                walk(child, name + ".", child_stack)

    walk(model, "", "")
    return sorted(found, key=lambda t: t[0])


def stacked(stack: str, name: str) -> str:
    """A layer row's ``name``: ``stack/name`` in a model of several stacks (``decoder/
    feedforward``, ``encoder/`` for a row without a slot), else ``name`` as it is."""
    return f"{stack}/{name}" if stack else name


def resolve_device(requested: str | None) -> torch.device:
    """``auto``/None -> CUDA when available, else CPU; a clear error for absent devices."""
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {requested!r} asked for, but torch {torch.__version__} sees no CUDA "
            "device; use device: cpu (or auto), or run on a machine with a GPU"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(f"device {requested!r} asked for, but MPS is not available here")
    return device


def check_dtype(dtype: str, device: torch.device) -> None:
    """Raise unless autocast to ``dtype`` works on ``device``."""
    if dtype == "float32":
        return
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if not torch.amp.is_autocast_available(device.type):
        raise RuntimeError(f"dtype {dtype}: torch.autocast does not support {device.type!r}")
    if device.type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"dtype bfloat16: {name} does not support bfloat16; use float16 or float32"
        )


def autocast(dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for bfloat16/float16 (checked first), nothing for float32."""
    check_dtype(dtype, device)
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


@contextlib.contextmanager
def forward_hooks(modules: list[tuple[int, nn.Module]], fn) -> Iterator[None]:
    """Register ``fn(layer, output)`` on each (layer, module) as a forward hook."""
    handles = [m.register_forward_hook(lambda _m, _i, out, i=i: fn(i, out)) for i, m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def first_tensor(out) -> torch.Tensor | None:
    """A module's output tensor (the first one, for modules that return tuples)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for item in out:
            t = first_tensor(item)
            if t is not None:
                return t
    return None


def describe(spec: ModelSpec) -> str:
    """A short description of a variant for error messages."""
    parts = [f"family {spec.family}"]
    for slot, comp in spec.components().items():
        extra = {k: v for k, v in comp.model_dump().items() if k != "kind"}
        parts.append(f"{slot} {comp.kind}" + (f" {extra}" if extra else ""))
    return ", ".join(parts)
