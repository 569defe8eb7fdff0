"""variantlab: a lab for transformer architecture variants.

The names below are imported when first used (PEP 562 ``__getattr__``), so ``import
variantlab`` (which every subpackage import runs first) costs neither torch nor the model
code: ``variantlab report`` never imports torch (issue 26.1-2). ``hookimpl``, the errors and
``__version__`` are cheap and imported at once."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import PluginLoadError, SpecError
from .plugin.hookspecs import hookimpl
from .version import __version__

if TYPE_CHECKING:
    from torch import nn

    from .config.yamlio import spec_yaml
    from .model.build import Parts, VariantWarning, build_model
    from .model.specs import ComponentSpec, ModelSpec, parse_model_spec
    from .model.tasks import Batch, Task, task_for
    from .plugin.registry import Registry, build_registry, get_registry
    from .plugin.settings import ProbeSettings

#: name -> the module that defines it, imported on first use
_LAZY = {
    "spec_yaml": "config.yamlio", "Parts": "model.build", "VariantWarning": "model.build",
    "build_model": "model.build", "ComponentSpec": "model.specs", "ModelSpec": "model.specs",
    "parse_model_spec": "model.specs", "Batch": "model.tasks", "Task": "model.tasks",
    "task_for": "model.tasks", "Registry": "plugin.registry",
    "build_registry": "plugin.registry", "get_registry": "plugin.registry",
    "ProbeSettings": "plugin.settings"}

__all__ = [
    "Batch", "ComponentSpec", "ModelSpec", "Parts", "PluginLoadError", "ProbeSettings", "SpecError",
    "Task", "VariantWarning", "build_model", "build_registry", "from_transformers", "get_registry",
    "hookimpl", "task_for",
    "spec_yaml", "to_transformers",
    "parse_model_spec", "results", "__version__",
]


def __getattr__(name: str) -> Any:
    """A lazily imported name of the package face, or a subpackage (``variantlab.model``)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # asked once
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def results(path):
    """Tidy DataFrame of every stored row, with a ``run`` column: ``path`` is a run folder,
    its results.sqlite, a folder of run folders (``run --out``), or a list of these. Its
    columns and dtypes: ``variantlab.store.contract.RESULTS``."""
    from .store.runs import results as _results

    return _results(path)


def from_transformers(hf_model: Any, registry: Registry | None = None, impl: str = "naive",
                      ) -> tuple[ModelSpec, nn.Module]:
    """``(spec, model)``: the variantlab spec equal to a Hugging Face transformers causal LM
    and a variantlab model holding copies of its weights (float32 logits equal within 1e-4),
    built with ``registry`` (``None``: ``variantlab.get_registry()``; the built-in components
    suffice).

    Classes: those ``variantlab families`` lists as converting (``variantlab.hf.CONVERTERS``),
    with their tied or untied embeddings, biases, grouped-query heads, rotary base, partial
    rotary and rope scaling (linear, dynamic, yarn, llama3, longrope), and the ``hidden_act``
    values that map to a registered activation. ``impl`` (``naive`` or ``sdpa``) picks the
    attention implementation. Any other class or an option variantlab cannot express exactly
    raises ``variantlab.hf.ConversionError`` naming it and why. See docs/transformers.md;
    needs the ``.[hf]`` extra."""
    from .hf import from_transformers as _convert
    from .plugin.registry import get_registry

    return _convert(hf_model, get_registry() if registry is None else registry, impl=impl)


def to_transformers(spec: ModelSpec | Mapping[str, Any], model: nn.Module,
                    registry: Registry | None = None) -> Any:
    """A Hugging Face transformers causal LM computing the same logits as ``model`` (a
    variantlab model built from ``spec``): ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``,
    ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``Olmo2ForCausalLM``, ``Gemma2ForCausalLM``
    or ``Gemma3ForCausalLM``, chosen from the spec's components. A component or option none
    of them has (e.g. batch norm, a post_norm residual, ALiBi) raises
    ``variantlab.hf.ConversionError`` naming its spec path. See docs/transformers.md,
    Export; needs the ``.[hf]`` extra."""
    from .hf import to_transformers as _export

    return _export(spec, model, registry)
