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
    "VariantWarning", "build_model", "build_registry", "get_registry", "hookimpl",
    "parse_model_spec", "results", "__version__",
]


def results(path):
    """Tidy DataFrame of every stored row, with a ``run`` column: ``path`` is a run folder,
    its results.sqlite, a folder of run folders (``run --out``), or a list of these."""
    from .runs import results as _results

    return _results(path)
