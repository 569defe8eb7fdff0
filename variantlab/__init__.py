"""variantlab: a lab for transformer architecture variants."""

from .hookspecs import hookimpl
from .specs import Batch, ComponentSpec, ModelSpec, parse_model_spec
from .build import Parts, VariantWarning, build_model
from .errors import PluginLoadError, SpecError
from .registry import build_registry, get_registry
from .settings import ProbeSettings

__version__ = "0.1.0"

__all__ = [
    "Batch", "ComponentSpec", "ModelSpec", "Parts", "PluginLoadError", "ProbeSettings", "SpecError",
    "VariantWarning", "build_model", "build_registry", "from_transformers", "get_registry", "hookimpl",
    "spec_yaml",
    "parse_model_spec", "results", "__version__",
]


def results(path):
    """Tidy DataFrame of every stored row, with a ``run`` column: ``path`` is a run folder,
    its results.sqlite, a folder of run folders (``run --out``), or a list of these."""
    from .runs import results as _results

    return _results(path)


def from_transformers(hf_model, impl="naive"):
    """``(spec, model)`` equal to a Hugging Face transformers causal LM (Llama, Qwen3); see
    docs/transformers.md. Needs the ``.[hf]`` extra."""
    from .hfimport import from_transformers as _convert

    return _convert(hf_model, impl=impl)


def spec_yaml(spec, name="imported"):
    """``spec`` as a minimal experiment YAML text whose ``model`` loads back equal."""
    from .hfimport import spec_yaml as _spec_yaml

    return _spec_yaml(spec, name)
