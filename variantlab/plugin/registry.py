"""The component registry: plugins loaded one at a time through pluggy.

Order: the built-ins (``variantlab_plugins``), installed entry points of group ``variantlab``,
then modules named by an experiment's ``plugins:`` list or ``--plugin``. A built-in or named
plugin that fails is fatal (:class:`PluginLoadError`); an entry point that fails is recorded
in :attr:`Registry.failures` and skipped, unless ``VARIANTLAB_STRICT_PLUGINS=1``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy
from pydantic import BaseModel

from ..errors import DuplicateKindError, PluginLoadError, SpecError, unknown_name_message
from . import hookspecs
from .probe import Probe, make_probe

SLOTS = ("norm", "activation", "feedforward", "attention", "residual", "positional", "init")
ALL_SLOTS = SLOTS + ("family",)
#: what ``variantlab plugins`` lists: every slot, then probes and executors
LISTED = (*ALL_SLOTS, "probe", "executor")
HOOKS = {**{slot: f"register_{slot}s" for slot in SLOTS}, "family": "register_families"}
BUILTIN_MODULES = (
    "norms", "activations", "feedforwards", "moe", "attentions", "mixers", "ssm", "deltanet", "mla", "hybrid",
    "residuals", "positionals",
    "inits", "families", "probes", "executors",
)
PROBES_MODULE, EXECUTORS_MODULE = "variantlab_plugins.probes", "variantlab_plugins.executors"
PROBE_HOOK = "register_probes"
EXECUTOR_HOOK = "register_executors"
ENTRY_POINT_GROUP = "variantlab"


@dataclass(frozen=True)
class Component:
    """One registered kind: its slot, spec class, build function and source plugin; a family
    also has its :class:`variantlab.model.tasks.Task` (how its models are fed and scored)."""

    slot: str
    kind: str
    spec_cls: type[BaseModel]  # a ComponentSpec (or, for the family slot, ModelSpec) subclass
    build: Callable[..., Any]
    plugin: str
    task: Any = None  # families only: a variantlab.model.tasks.Task


@dataclass(frozen=True)
class ExecutorEntry:
    """One registered executor: ``factory(options)`` makes it from an ``options_cls``."""

    name: str
    options_cls: type[BaseModel]
    factory: Callable[[Any], Any]
    plugin: str


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    source: str  # "builtin", "entry point" or "module"
    error: str
    traceback: str


def make_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("variantlab")
    pm.add_hookspecs(hookspecs)
    return pm


class Registry:
    """Components by slot and kind, with the plugins they came from."""

    def __init__(self) -> None:
        self.pm = make_plugin_manager()
        self._components: dict[str, dict[str, Component]] = {s: {} for s in ALL_SLOTS}
        self._plugins: list[tuple[str, str]] = []  # (name, source) in load order
        self.failures: list[PluginFailure] = []
        self._probes: dict[str, Probe] = {}
        self._executors: dict[str, ExecutorEntry] = {}
        self._deferred: list[str] = []  # built-in modules loaded when first needed

    @property
    def plugins(self) -> list[tuple[str, str]]:
        """``(name, source)`` of every loaded plugin, in load order."""
        self._complete()
        return self._plugins

    def _complete(self, executors: bool = True) -> None:
        """Load the built-in modules :func:`build_registry` deferred (``defer=True``), in
        their order, the probes' module already among them; ``executors`` False: all but
        the executors' (a component lookup)."""
        deferred = [m for m in self._deferred if executors or m != EXECUTORS_MODULE]
        if not deferred:
            return
        self._deferred = [m for m in self._deferred if m not in deferred]
        for name in deferred:
            self.load_guarded(name, "builtin", functools.partial(self.load, name, "builtin"), True)
        order = {f"variantlab_plugins.{mod}": i for i, mod in enumerate(BUILTIN_MODULES)}
        self._plugins.sort(key=lambda p: order.get(p[0], len(order)))  # only built-ins here

    # -- lookups ---------------------------------------------------------------------
    def kinds(self, slot: str) -> list[str]:
        self._complete(executors=False)
        return sorted(self._components[slot])

    def components(self, slot: str | None = None) -> list[Component]:
        self._complete(executors=False)
        slots = [slot] if slot else list(ALL_SLOTS)
        return [c for s in slots for _, c in sorted(self._components[s].items())]

    def get(self, slot: str, kind: str, loc: Sequence[object] = ("kind",)) -> Component:
        """The component for ``kind`` or a :class:`SpecError` that lists the choices."""
        self._complete(executors=False)
        try:
            return self._components[slot][kind]
        except (KeyError, TypeError):
            raise SpecError.at(loc, unknown_name_message(slot, kind, self.kinds(slot))) from None

    def probe_names(self) -> list[str]:
        """The registered probes' names, built-ins first, in registration order."""
        return list(self._probes)

    def probes(self) -> list[Probe]:
        """Every registered :class:`variantlab.plugin.probe.Probe`."""
        return list(self._probes.values())

    def probe(self, name: str, loc: Sequence[object] = ("measure",)) -> Probe:
        """The probe ``name`` or a :class:`SpecError` that lists the registered ones."""
        try:
            return self._probes[name]
        except (KeyError, TypeError):
            raise SpecError.at(loc, unknown_name_message("probe", name, self.probe_names())) \
                from None

    def executor_names(self) -> list[str]:
        self._complete()
        return sorted(self._executors)

    def executor(self, name: str, loc: Sequence[object] = ("--executor",)) -> ExecutorEntry:
        """The executor ``name`` or a :class:`SpecError` that lists the registered ones."""
        self._complete()
        try:
            return self._executors[name]
        except (KeyError, TypeError):
            raise SpecError.at(loc, unknown_name_message("executor", name,
                                                         self.executor_names())) from None

    # -- loading ---------------------------------------------------------------------
    def load_module(self, plugin: object, name: str, source: str) -> None:
        """Register one plugin object (usually a module); all or nothing."""
        if source != "builtin":  # the built-ins first
            self._complete()
        if self.pm.has_plugin(name):
            return
        self.pm.register(plugin, name=name)
        try:
            self.pm.check_pending()
            staged = self._collect(name)
            probes = self._collect_probes(name)
            executors = self._collect_executors(name)
            for comp in staged:
                self._check(comp)
            for comp in staged:
                self._components[comp.slot][comp.kind] = comp
            self._probes.update(probes)
            self._executors.update(executors)
        except BaseException:
            self.pm.unregister(name=name)
            raise
        self._plugins.append((name, source))

    def _collect(self, name: str) -> list[Component]:
        staged: list[Component] = []
        for slot, hook_name in HOOKS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name != name:
                    continue

                def register(kind: str, spec_cls: type, build: Callable, *, task: Any = None,
                             _slot: str = slot) -> None:
                    if (task is None) == (_slot == "family"):
                        what = "needs" if task is None else "is only for families, not"
                        raise PluginLoadError(f"plugin {name!r}: register({kind!r}, ...) task= "
                                              f"{what} {_slot} kinds")
                    staged.append(Component(_slot, kind, spec_cls, build, name, task))

                impl.function(register=register)
        seen: dict[tuple[str, str], Component] = {}
        for comp in staged:
            if (comp.slot, comp.kind) in seen:
                raise DuplicateKindError(
                    f"{comp.slot} kind {comp.kind!r} registered twice by plugin {name!r}"
                )
            seen[(comp.slot, comp.kind)] = comp
        return staged

    def _collect_probes(self, name: str) -> dict[str, Any]:
        """The probes plugin ``name`` registers, checked against each other and the loaded ones."""
        staged: dict[str, Any] = {}
        for impl in getattr(self.pm.hook, PROBE_HOOK).get_hookimpls():
            if impl.plugin_name != name:
                continue

            def register(probe: str, settings_cls: type, run: Callable, **props: Any) -> None:
                made = make_probe(name, probe, settings_cls, run, **props)
                old = staged.get(probe) or self._probes.get(probe)
                if old is not None:
                    raise DuplicateKindError(
                        f"probe {probe!r} is registered by both plugin {old.plugin!r} and "
                        f"plugin {name!r}; uninstall or rename one of them")
                staged[probe] = made

            impl.function(register=register)
        return staged

    def _collect_executors(self, name: str) -> dict[str, ExecutorEntry]:
        staged: dict[str, ExecutorEntry] = {}
        for impl in getattr(self.pm.hook, EXECUTOR_HOOK).get_hookimpls():
            if impl.plugin_name != name:
                continue

            def register(executor: str, options_cls: type[BaseModel],
                         factory: Callable[[Any], Any]) -> None:
                old = staged.get(executor) or self._executors.get(executor)
                if old is not None:
                    raise DuplicateKindError(
                        f"executor {executor!r} is registered by both plugin {old.plugin!r} "
                        f"and plugin {name!r}; uninstall or rename one of them")
                if not (isinstance(options_cls, type) and issubclass(options_cls, BaseModel)):
                    raise PluginLoadError(f"plugin {name!r}: the options of executor "
                                          f"{executor!r} must be a pydantic model class")
                if not callable(factory):
                    raise PluginLoadError(f"plugin {name!r}: the factory of executor "
                                          f"{executor!r} is not callable")
                staged[executor] = ExecutorEntry(executor, options_cls, factory, name)

            impl.function(register=register)
        return staged

    def _check(self, comp: Component) -> None:
        old = self._components[comp.slot].get(comp.kind)
        if old is not None:
            raise DuplicateKindError(
                f"{comp.slot} kind {comp.kind!r} is registered by both plugin {old.plugin!r} "
                f"and plugin {comp.plugin!r}; uninstall or rename one of them"
            )
        base = "ModelSpec" if comp.slot == "family" else "ComponentSpec"
        # the two bases declare which they are (variantlab.model.specs), so no import is needed here
        if getattr(comp.spec_cls, "variantlab_spec_base", None) != base:
            raise PluginLoadError(
                f"plugin {comp.plugin!r}: spec for {comp.slot} {comp.kind!r} must subclass "
                f"variantlab.{base}"
            )
        key = "family" if comp.slot == "family" else "kind"
        declared = comp.spec_cls.model_fields[key].default
        if declared != comp.kind:
            raise PluginLoadError(
                f"plugin {comp.plugin!r}: {comp.spec_cls.__name__}.{key} defaults to "
                f"{declared!r} but it is registered as {comp.kind!r}"
            )
        if not callable(comp.build):
            raise PluginLoadError(f"plugin {comp.plugin!r}: build for {comp.kind!r} is not callable")
        if comp.task is not None and not all(
                callable(getattr(comp.task, m, None)) for m in ("batch", "loss", "output_shape")):
            raise PluginLoadError(f"plugin {comp.plugin!r}: task of family {comp.kind!r} must be a "
                                  "variantlab.model.tasks.Task (batch, loss and output_shape methods)")

    def load(self, target: str, source: str = "module", base_dir: Path | None = None,
             path: str | None = None) -> None:
        """Import ``target`` (a module name or a ``.py`` file) and register it under that
        name; ``path``: the file to import instead (a copy shipped to another machine)."""
        module = import_target(path or target, base_dir)
        self.load_module(module, name=target, source=source)

    def load_guarded(self, name: str, source: str, loader: Callable[[], None], strict: bool) -> None:
        """Run ``loader``; on failure raise (strict) or record and warn."""
        try:
            loader()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a plugin may raise anything, sys.exit() included
            if isinstance(exc, SystemExit):
                exc = PluginExitError(exc)
            if strict:
                raise PluginLoadError(f"plugin {name!r} ({source}) failed to load: {exc}") from exc
            self.failures.append(
                PluginFailure(name, source, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            )
            warnings.warn(f"variantlab: skipped plugin {name!r} ({source}): {exc}", stacklevel=2)


class PluginExitError(RuntimeError):
    """A plugin that called ``sys.exit()`` (raised SystemExit) while it was imported."""

    def __init__(self, exc: SystemExit) -> None:
        super().__init__(f"it called sys.exit({exc.code!r}) (raised SystemExit) while being "
                         "imported; a plugin must not exit")


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Loads a plugin file from its source as it is now, never from ``__pycache__``:
    Python's cached bytecode is trusted when the file's size and its mtime in whole
    seconds match, so a plugin edited within the same second to the same size (scale
    1.0 -> 2.0) would run its old code under the new code's unit key. Nothing is
    written either."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


class SourceOnlyFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of the top-level packages in ``tops`` (plugins given by module
    name, ``plugins: [mylab.components]``, and everything in their package) as the path
    finder does, but loads their ``.py`` sources with :class:`SourceOnlyLoader`: a unit key
    hashes every ``.py`` file of such a package (:mod:`variantlab.sweep.keys`), so the code
    that runs must be those files as they are now, not bytecode cached from an edit before."""

    def __init__(self) -> None:
        self.tops: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.partition(".")[0] not in self.tops:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin is not None \
                and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = SourceOnlyLoader(fullname, spec.origin)
        return spec


#: the one :class:`SourceOnlyFinder` of this process, first on ``sys.meta_path`` once used
SOURCE_ONLY = SourceOnlyFinder()
#: variantlab's own packages (the core and the built-in plugins)
CORE_PACKAGES = ("variantlab", "variantlab_plugins")


def import_by_source(target: str) -> object:
    """``importlib.import_module(target)``, the modules of ``target``'s top-level package
    loaded from their sources (:class:`SourceOnlyFinder`); the core packages are imported as
    usual."""
    top = target.partition(".")[0]
    if top not in CORE_PACKAGES:
        if SOURCE_ONLY not in sys.meta_path:
            sys.meta_path.insert(0, SOURCE_ONLY)
        SOURCE_ONLY.tops.add(top)
    return importlib.import_module(target)


def import_target(target: str, base_dir: Path | None = None) -> object:
    """A module name (``pkg.mod``) or a path to a ``.py`` file, relative to ``base_dir``."""
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise FileNotFoundError(f"plugin file {str(path)!r} does not exist")
        mod_name = f"variantlab_local_{path.stem}_{abs(hash(str(path.resolve()))):x}"
        if path.suffix == ".py":  # its source as it is now
            spec = importlib.util.spec_from_file_location(
                mod_name, path, loader=SourceOnlyLoader(mod_name, str(path)))
        else:  # None for a file Python cannot load, which is said next
            spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import plugin file {str(path)!r} (not a Python source file?)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
        return module
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))  # a module beside the experiment file
    return import_by_source(target)


def strict_from_env() -> bool:
    return os.environ.get("VARIANTLAB_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def build_registry(
    extra: Iterable[str] = (),
    *,
    base_dir: Path | None = None,
    entry_points: bool = True,
    strict: bool | None = None,
    defer: bool = False,
) -> Registry:
    """A fresh registry: built-ins, entry points (unless disabled), then ``extra`` modules.

    Built-ins and ``extra`` modules that fail raise :class:`PluginLoadError`; entry points
    that fail are recorded and skipped unless ``strict`` (default: the environment's
    ``VARIANTLAB_STRICT_PLUGINS``).

    ``defer``: when nothing but the built-ins would load (no ``extra``, no installed entry
    point), load only their probes now (whose code, views and settings are themselves
    imported when first asked), the component modules, which import torch, at the first
    question about a component, and the executors' at the first about an executor or the
    plugins: the report's registry needs only the probes' views and metrics
    (:mod:`variantlab.cli.main`), ``validate`` no executor (:mod:`variantlab.config.experiment`).
    Otherwise, or once completed, the registry is the one ``defer=False`` builds (a module
    loaded later, ``--plugin``, completes it first).
    """
    strict = strict_from_env() if strict is None else strict
    reg = Registry()
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if entry_points else ()
    if defer and not extra and not found:
        load = functools.partial(reg.load, PROBES_MODULE, "builtin")
        reg.load_guarded(PROBES_MODULE, "builtin", load, True)
        reg._deferred = [m for m in (f"variantlab_plugins.{mod}" for mod in BUILTIN_MODULES)
                         if m != PROBES_MODULE]
        return reg
    for mod in BUILTIN_MODULES:
        name = f"variantlab_plugins.{mod}"
        reg.load_guarded(name, "builtin", functools.partial(reg.load, name, "builtin"), True)
    if entry_points:
        for ep in found:
            dist = getattr(ep.dist, "name", None)
            name = f"{dist}:{ep.name}" if dist else ep.name

            def load_ep(ep=ep, name=name) -> None:
                reg.load_module(ep.load(), name=name, source="entry point")

            reg.load_guarded(name, "entry point", load_ep, strict)
    for target in extra:
        loader = functools.partial(reg.load, target, "module", base_dir)
        reg.load_guarded(target, "module", loader, True)
    return reg


_DEFAULT: Registry | None = None


def get_registry() -> Registry:
    """The default registry (built-ins and entry points), built on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = build_registry()
    return _DEFAULT

