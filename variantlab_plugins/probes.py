"""variantlab's built-in probes, registered through ``register_probes`` like any plugin's.

Their settings classes, run functions and report views are named as ``"module:attr"``
(:data:`variantlab.plugin.probe.LazyRef`) and imported when first asked: ``variantlab
validate`` and ``run --no-report`` never import the report, and ``variantlab report`` never
imports the probes' code (nor torch with it)."""

from typing import Any

from variantlab import hookimpl

_PROBE = "variantlab.probes.{0}:{1}"
_VIEWS = "variantlab.report.builtin.{}:views"


def dynamics_views() -> tuple[Any, ...]:
    """The dynamics probe's views: its heatmaps and lines, and the MoE routing views."""
    from variantlab.report.builtin.dynamics import dynamics_views as lines
    from variantlab.report.builtin.routing import routing_views

    return (*lines(), *routing_views())


def timing_passes(settings: Any) -> list[str]:
    """The passes a timing unit times (its ``passes:`` setting, a
    :class:`variantlab.probes.timing.TimingSettings`)."""
    return list(settings.passes)


def _code(module: str, settings: str) -> tuple[str, str]:
    """(settings class, run function) of a built-in probe module, as references."""
    return _PROBE.format(module, settings), _PROBE.format(module, "run")


@hookimpl
def register_probes(register):
    register("params", *_code("params", "ParamsSettings"), device_free=True,
             views=_VIEWS.format("params"))
    register("gradients", *_code("gradients", "GradientsSettings"),
             passes=("forward", "backward"), views=_VIEWS.format("gradients"))
    register("timing", *_code("timing", "TimingSettings"), serial=True, passes=timing_passes,
             views=_VIEWS.format("timing"))
    register("training", *_code("training", "TrainingSettings"), trains=True,
             views=_VIEWS.format("training"))
    register("dynamics", *_code("dynamics", "DynamicsSettings"), trains=True,
             views="variantlab_plugins.probes:dynamics_views")
