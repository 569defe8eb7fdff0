"""What a probe is: its name, settings spec, measuring function and report views.

A plugin registers probes through the ``register_probes(register)`` hook
(:mod:`variantlab.plugin.hookspecs`); the registry keeps one :class:`Probe` per name. Everything
the runner, the experiment loader, the JSON schema and the report need to know about a probe
is here, so none of them names a probe.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..plugin.settings import Strict

#: what a unit may run on each batch (:attr:`Probe.passes`)
PASSES = frozenset({"forward", "backward", "step"})

#: ``run(spec, settings, *, seed, data, base_dir, device, registry) -> list[Row]``
RunFn = Callable[..., list]
#: ``view(data: variantlab.report.ReportData) -> list[Table | Plot]``
ViewFn = Callable[[Any], Sequence[Any]]


@dataclass(frozen=True)
class ProbeView:
    """A probe's part of the report's shared pieces; every piece is optional.

    ``data`` is :class:`variantlab.report.ReportData`, ``summary`` the report's summary frame
    (one line per variant and metric; see :func:`variantlab.report.tables.summarize`).

    - ``metrics(data) -> DataFrame``: one value per variant, seed and metric
      (:class:`variantlab.report.tables.MetricRows`), which the summary and ``summary.csv``
      aggregate (a grid's effects and the variant browser take the headline metrics,
      ``variantlab.report.effects.HEADLINE``, among them);
    - ``section(data, summary) -> Table | None``: the probe's summary table;
    - ``plots(data) -> list[Plot]``: figures of the variants the report draws (it narrows
      ``data`` to them when there are many); a plot with nothing to draw says why
      (``Plot(..., skipped=...)``);
    - ``reading(data, summary) -> list[str | None]``: sentences for the report's reading;
      ``aside``: the same, shown only when the report is not a grid's (a grid's effects say it);
    - ``warnings(data) -> list[[variant, source, text]]``: lines of the Warnings table;
    - ``fair(data) -> variantlab.report.fair.compare.FairParts``: for a probe that trains, its losses
      compared at each architecture's best setting and across model sizes
      (``variantlab.report.fair.compare.fair_piece``);
    - ``claims(data) -> list[dict]``: the probe's comparisons as claims rows
      (``variantlab.report.claims.measured_row``, its ``kind`` naming the probe's kind of
      comparison), appended to the report's ``verdicts.csv``; the probe's reading says them
      with ``variantlab.report.words``;
    - ``rank``: where these pieces go among every probe's (lower first; ties in registration
      order); the built-in probes use ranks below 100, the default.

    Unlike a plain view function (asked only when the probe has rows), every piece is asked
    for every report, so a piece returns nothing (or a skipped plot) when there is nothing
    to show.
    """

    metrics: Callable[[Any], Any] | None = None
    section: Callable[[Any, Any], Any] | None = None
    plots: Callable[[Any], Sequence[Any]] | None = None
    reading: Callable[[Any, Any], Sequence[str | None]] | None = None
    aside: Callable[[Any, Any], Sequence[str | None]] | None = None
    warnings: Callable[[Any], Sequence[Sequence[str]]] | None = None
    fair: Callable[[Any], Any] | None = None
    claims: Callable[[Any], Sequence[dict[str, Any]]] | None = None
    rank: int = 100

    def pieces(self) -> dict[str, Callable[..., Any] | None]:
        """The pieces by name (None: not given)."""
        return {"metrics": self.metrics, "section": self.section, "plots": self.plots,
                "reading": self.reading, "aside": self.aside, "warnings": self.warnings,
                "fair": self.fair, "claims": self.claims}


@dataclass(frozen=True)
class Probe:
    """One registered probe.

    - ``settings_cls``: a :class:`variantlab.ProbeSettings` subclass (strict, frozen, no
      unknown keys): the keys the probe takes under ``measure: {name: ...}``;
    - ``run``: measures one variant and returns rows (:func:`variantlab.plugin.rows.row`);
      both may be registered as ``"module:attr"`` (:data:`LazyRef`, kept in
      ``settings_given`` / ``run_given``) and are imported when first asked, so a command
      that needs neither (``variantlab report``) never imports the probe's code (or torch);
    - ``views``: functions of the report's data returning the probe's tables and plots,
      and :class:`ProbeView` objects giving its pieces of the report's shared parts (summary
      metrics, section, plots, reading, warnings); none: the report shows its rows in a
      generic table. Registered as ``"module:attr"`` (:data:`LazyViews`), they are imported
      when the report first asks, so commands that write no report never import them;
    - ``serial``: its units run last, one at a time, never beside other work (timing);
    - ``device_free``: its numbers do not depend on the device (no device in the unit key);
    - ``trains``: it takes optimizer steps (the size guard counts optimizer state);
    - ``passes``: what a unit runs on each batch, for the size guard: a subset of
      :data:`PASSES`, or a function of the settings giving one (timing's ``passes:``);
      empty (the default): forward, backward and step for a probe that ``trains``, else
      forward only. See :meth:`memory_passes`;
    - ``metrics``: ``(metric, "lower" | "higher")`` pairs, which way each of its metrics is
      better (:mod:`variantlab.config.metrics`); a metric ``M`` declared here may be an
      experiment's ``compare_on`` when the probe records ``val_M`` and ``test_M``.
    """

    name: str
    settings_given: type[Strict] | LazyRef
    run_given: RunFn | LazyRef = field(repr=False)
    plugin: str
    views_given: tuple[ViewFn | ProbeView, ...] | str = field(default=(), repr=False)
    serial: bool = False
    device_free: bool = False
    trains: bool = False
    passes: frozenset[str] | Callable[[Any], Iterable[str]] = frozenset()
    metrics: tuple[tuple[str, str], ...] = ()

    def memory_passes(self, settings: Any) -> frozenset[str]:
        """What a unit with ``settings`` runs on each batch (``forward``, ``backward``,
        ``step``): the memory the size guard counts."""
        if callable(self.passes):
            return frozenset(self.passes(settings))
        if self.passes:
            return self.passes
        return frozenset(PASSES if self.trains else {"forward"})

    @cached_property
    def settings_cls(self) -> type[Strict]:
        """The settings class; a ``"module:attr"`` reference is imported (and checked) here,
        once. :class:`variantlab.errors.PluginLoadError` when it cannot be."""
        return self._resolved("settings", self.settings_given, check_settings)

    @cached_property
    def run(self) -> RunFn:
        """The measuring function; a ``"module:attr"`` reference is imported (and checked)
        here, once."""
        return self._resolved("run", self.run_given, check_run)

    def _resolved(self, what: str, given: Any, check: Callable[[str, Any], None]) -> Any:
        if not isinstance(given, str):
            return given
        found = resolve_ref(self.plugin, self.name, what, given)
        check(f"plugin {self.plugin!r}: probe {self.name!r}", found)
        return found

    @cached_property
    def views(self) -> tuple[ViewFn | ProbeView, ...]:
        """The views; a ``"module:attr"`` reference is imported (and checked) here, once.
        :class:`variantlab.errors.PluginLoadError` when it cannot be."""
        if not isinstance(self.views_given, str):
            return self.views_given
        return resolve_views(self.plugin, self.name, self.views_given)

    def settings(self, value: Any = None) -> Strict:
        """The probe's settings from None (defaults), a mapping, or a settings object."""
        if value is None:
            return self.settings_cls()
        if isinstance(value, self.settings_cls):
            return value
        if isinstance(value, dict):
            return self.settings_cls.model_validate(value)
        raise TypeError(f"probe {self.name!r} takes {self.settings_cls.__name__} settings, "
                        f"got {type(value).__name__}")


def check_declared(metrics: Mapping[str, Any] | None, where: str) -> tuple[tuple[str, str], ...]:
    """A probe's ``metrics=`` as ``((name, direction), ...)``; ValueError saying what is
    wrong (a name that is not a string, a direction other than lower/higher)."""
    out: list[tuple[str, str]] = []
    for name, dirn in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: metric names must be non-empty strings, got {name!r}")
        if dirn not in ("lower", "higher"):
            raise ValueError(f"{where}: metric {name!r} has direction {dirn!r}; use 'lower' "
                             "or 'higher' (which way is better)")
        out.append((name, dirn))
    return tuple(out)


#: ``"package.module:attr"``: a probe's settings class, run function or views, imported
#: when first needed (a report needs only the views; validate only the settings)
LazyRef = str
#: the views as a reference; ``attr`` is a sequence of views or a function of no arguments
#: returning one
LazyViews = LazyRef


def resolve_ref(plugin: str, name: str, what: str, ref: LazyRef) -> Any:
    """The object ``ref`` (``"module:attr"``) names, or
    :class:`variantlab.errors.PluginLoadError` saying it cannot be imported."""
    from ..errors import PluginLoadError

    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise PluginLoadError(f"plugin {plugin!r}: probe {name!r}: {what} {ref!r} cannot be "
                              f"imported: {type(exc).__name__}: {exc}") from exc


def resolve_views(plugin: str, name: str, ref: LazyViews) -> tuple[ViewFn | ProbeView, ...]:
    """The views ``ref`` names (``"module:attr"``), checked as :func:`make_probe` checks
    views given directly."""
    from ..errors import PluginLoadError

    where = f"plugin {plugin!r}: probe {name!r}"
    found = resolve_ref(plugin, name, "views", ref)
    views = found() if callable(found) and not isinstance(found, ProbeView) else found
    if isinstance(views, (str, bytes)) or not isinstance(views, Sequence):
        raise PluginLoadError(f"{where}: views {ref!r} must be a sequence of views (or a "
                              "function returning one)")
    check_views(where, views)
    return tuple(views)


def check_views(where: str, views: Sequence[Any]) -> None:
    """:class:`variantlab.errors.PluginLoadError` unless every view is callable or a
    :class:`ProbeView` with callable pieces and an int rank."""
    from ..errors import PluginLoadError

    if not all(callable(v) or isinstance(v, ProbeView) for v in views):
        raise PluginLoadError(f"{where}: every view must be callable (or a ProbeView)")
    for view in views:
        if isinstance(view, ProbeView):
            bad = [k for k, f in view.pieces().items() if f is not None and not callable(f)]
            if bad or not isinstance(view.rank, int):
                raise PluginLoadError(f"{where}: ProbeView pieces must be callable and its "
                                      f"rank an int ({', '.join(bad) or 'rank'})")


def check_settings(where: str, settings_cls: Any) -> None:
    """:class:`variantlab.errors.PluginLoadError` unless ``settings_cls`` subclasses
    :class:`variantlab.ProbeSettings`."""
    from ..errors import PluginLoadError

    if not (isinstance(settings_cls, type) and issubclass(settings_cls, Strict)):
        raise PluginLoadError(f"{where}: settings must subclass variantlab.ProbeSettings")


def check_run(where: str, run: Any) -> None:
    """:class:`variantlab.errors.PluginLoadError` unless ``run`` is callable."""
    from ..errors import PluginLoadError

    if not callable(run):
        raise PluginLoadError(f"{where}: run must be callable")


def check_ref(where: str, what: str, ref: str) -> None:
    """:class:`variantlab.errors.PluginLoadError` unless ``ref`` reads
    ``"package.module:attr"``."""
    from ..errors import PluginLoadError

    if not _REF.fullmatch(ref):
        raise PluginLoadError(f"{where}: {what} {ref!r} must be 'package.module:attr'")


def make_probe(plugin: str, name: str, settings_cls: type[Strict] | LazyRef,
               run: RunFn | LazyRef, *,
               views: Sequence[ViewFn | ProbeView] | LazyViews = (), serial: bool = False,
               device_free: bool = False, trains: bool = False,
               passes: Iterable[str] | Callable[[Any], Iterable[str]] = (),
               metrics: Mapping[str, str] | None = None) -> Probe:
    """A :class:`Probe`, or :class:`variantlab.errors.PluginLoadError` saying what is wrong."""
    from ..errors import PluginLoadError

    where = f"plugin {plugin!r}: probe {name!r}"
    if not isinstance(name, str) or not name.isidentifier():
        raise PluginLoadError(f"plugin {plugin!r}: probe name {name!r} must be an identifier")
    for what, given, check in (("settings", settings_cls, check_settings),
                               ("run", run, check_run)):
        if isinstance(given, str):  # imported when first needed (Probe.settings_cls, .run)
            check_ref(where, what, given)
        else:
            check(where, given)
    if isinstance(views, str):
        check_ref(where, "views", views)
    else:
        check_views(where, views)
        views = tuple(views)
    if not callable(passes):
        passes = frozenset(passes)
        if not passes <= PASSES:
            raise PluginLoadError(f"{where}: passes must be among {', '.join(sorted(PASSES))} "
                                  f"(or a function of the settings), got {sorted(passes)}")
    try:
        declared = check_declared(metrics, where)
    except ValueError as exc:
        raise PluginLoadError(str(exc)) from None
    return Probe(name, settings_cls, run, plugin, views, bool(serial),
                 bool(device_free), bool(trains), passes, declared)


_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")

__all__ = ["PASSES", "LazyRef", "LazyViews", "Probe", "ProbeView", "RunFn", "ViewFn",
           "check_views", "make_probe", "resolve_ref", "resolve_views"]
