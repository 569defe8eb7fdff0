"""What a unit's numbers depend on beyond its spec: code, library versions and data.

A unit key (:func:`variantlab.sweep.units.unit_key`) hashes, besides the resolved spec, the probe
settings, the device and the seed:

* ``code``: sha256 over the files (content, never mtime) of the folders of the core whose
  code computes numbers (``NUMBER_FOLDERS``: the plugin system, model assembly, data and the
  probes) and of the built-in ``variantlab_plugins`` package, plus the versions of variantlab
  and torch (:func:`environment`). Every other folder only reads, checks, schedules, stores or
  presents numbers (config, sweep, store, executors, hf, report, export, testing, cli, and
  the top-level modules such as errors.py and version.py): editing them never makes stored results stale;
* ``plugins``: for each third-party or local plugin that registered a component the variant
  uses (its family and every slot), a sha256 of the plugin's source: the ``.py`` file of a
  plugin file or module, every ``.py`` file of its top-level package when it lives in one
  (:func:`variant_code`), and likewise for the plugin that registered the unit's probe
  (:func:`probe_code`);
* ``data``: for ``source: text`` the size and sha256 of each matched file, for
  ``source: stdlib`` the running Python's version (:func:`data_fingerprint`).

Hashes are computed once per process and file (a file is hashed again only when its size
or modification time changes) and depend on nothing else, so the worker processes of
``--workers`` compute the keys the driver computed.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data.cache import file_digest
from ..errors import SpecError
from ..plugin.registry import CORE_PACKAGES
from ..version import __version__

if TYPE_CHECKING:
    from ..plugin.probe import Probe
    from ..plugin.registry import Registry

_SKIP_DIRS = {"__pycache__"}
#: the folders of ``variantlab`` whose code can change a number; the rest of the core (and its
#: top-level modules) is left out of unit keys. ``variantlab_plugins`` counts whole.
NUMBER_FOLDERS = {"variantlab": ("plugin", "model", "data", "probes")}


def tree_digest(files: Iterable[Path], root: Path) -> str:
    """One sha256 over ``(path relative to root, content digest)`` of every file, sorted."""
    h = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(file_digest(path).encode() + b"\n")
    return h.hexdigest()


def _package_files(root: Path, pattern: str = "*") -> Iterator[Path]:
    for path in root.rglob(pattern):
        if path.is_file() and not _SKIP_DIRS & set(path.relative_to(root).parts) \
                and path.suffix not in (".pyc", ".pyo"):
            yield path


def core_files(name: str) -> dict[Path, list[Path]]:
    """The files of core package ``name`` that can change a number, by package folder: the
    folders of ``NUMBER_FOLDERS`` for a package listed there, else every file."""
    module = importlib.import_module(name)
    keep = NUMBER_FOLDERS.get(name)
    return {Path(folder): number_files(Path(folder), keep)
            for folder in getattr(module, "__path__", [])}


def number_files(root: Path, keep: Sequence[str] | None) -> list[Path]:
    """The files below ``root`` in the top-level folders ``keep`` (every file: None)."""
    return [f for f in _package_files(root)
            if keep is None or f.relative_to(root).parts[0] in keep]


@lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """The code and versions every unit depends on: the core and built-in plugin packages'
    files, variantlab's and torch's versions (computed once per process)."""
    h = hashlib.sha256()
    for name in CORE_PACKAGES:
        for root, files in core_files(name).items():
            h.update(name.encode() + b"\0" + tree_digest(files, root).encode())
    return {"code": h.hexdigest(), "variantlab": __version__, "torch": torch.__version__}


def module_digest(module: Any) -> str | None:
    """sha256 of a plugin module's source: its file, or every ``.py`` file of the
    top-level package it belongs to. ``None`` for a module without a file."""
    top_name = getattr(module, "__name__", "").partition(".")[0]
    top = sys.modules.get(top_name, module)
    folders = list(getattr(top, "__path__", None) or [])
    if folders and top_name not in CORE_PACKAGES:
        return hashlib.sha256("".join(
            tree_digest(_package_files(Path(f), "*.py"), Path(f)) for f in folders
        ).encode()).hexdigest()
    file = getattr(module, "__file__", None)
    return file_digest(Path(file)) if file else None


def _used_components(data: Any, slot: str | None = None) -> Iterator[tuple[str, str]]:
    """``(slot, kind)`` of every component in a spec's plain data, nested ones included."""
    from ..plugin.registry import ALL_SLOTS

    if isinstance(data, Mapping):
        if slot is not None and isinstance(data.get("kind"), str):
            yield slot, data["kind"]
        for key, value in data.items():
            yield from _used_components(value, key if key in ALL_SLOTS else None)
    elif isinstance(data, list):
        for value in data:
            yield from _used_components(value)


def variant_code(spec_data: Mapping[str, Any], registry: Registry) -> dict[str, str]:
    """Plugin name -> source digest for each non-core plugin that registered a component
    of this spec (its family and every slot); empty for built-in components only."""
    used: set[tuple[str, Any]] = {("family", spec_data.get("family"))}
    used |= set(_used_components(spec_data))
    out: dict[str, str] = {}
    for slot, kind in sorted(used, key=str):
        try:
            comp = registry.get(slot, kind)
        except SpecError:  # not a registered kind: the spec would not have validated
            continue
        if comp.plugin in out or comp.plugin.startswith("variantlab_plugins."):
            continue
        module = registry.pm.get_plugin(comp.plugin)
        out[comp.plugin] = module_digest(module) or f"unhashable:{comp.plugin}"
    return out


def probe_code(probe: Probe, registry: Registry) -> dict[str, str]:
    """Plugin name -> source digest of the non-core plugin that registered ``probe``
    (a :class:`variantlab.plugin.probe.Probe`); empty for a built-in probe."""
    if probe.plugin.startswith("variantlab_plugins."):
        return {}
    module = registry.pm.get_plugin(probe.plugin)
    return {probe.plugin: module_digest(module) or f"unhashable:{probe.plugin}"}


def data_fingerprint(data: Any, base_dir: Path | str) -> dict[str, Any] | None:
    """What a data source reads besides its settings: the text files' sizes and contents,
    a dataset's files and column, or the Python version whose stdlib is read; ``None`` for
    synthetic data."""
    from ..data.cache import files_hash
    from ..data.hfdisk import hf_corpus
    from ..data.sources import DataError, HFDiskData, StdlibData, TextData, text_files

    if isinstance(data, StdlibData):
        return {"python": sys.version}
    if isinstance(data, TextData):
        try:
            files = text_files(data.path, base_dir)
        except DataError as exc:  # the probe fails with this message; the key says so
            return {"files": None, "error": str(exc)}
        return {"files": files_hash(files), "n": len(files)}
    if isinstance(data, HFDiskData):
        try:
            return {"dataset": hf_corpus(data.path, data.column, base_dir)[0]}
        except DataError as exc:
            return {"dataset": None, "error": str(exc)}
    return None
