"""variantlab's built-in probes, registered through ``register_probes`` like any plugin's.

Their report views are named as ``"module:attr"`` and imported only when a report is
written (``variantlab validate`` and ``run --no-report`` never import the report)."""

from typing import Any

from variantlab import hookimpl
from variantlab.probes import dynamics, gradients, params, timing, training
from variantlab.probes.dynamics import DynamicsSettings
from variantlab.probes.gradients import GradientsSettings
from variantlab.probes.params import ParamsSettings
from variantlab.probes.timing import TimingSettings
from variantlab.probes.training import TrainingSettings

_VIEWS = "variantlab.report.builtin.{}:views"


def dynamics_views() -> tuple[Any, ...]:
    """The dynamics probe's views: its heatmaps and lines, and the MoE routing views."""
    from variantlab.report.builtin.dynamics import dynamics_views as lines
    from variantlab.report.builtin.routing import routing_views

    return (*lines(), *routing_views())


def timing_passes(settings: TimingSettings) -> list[str]:
    """The passes a timing unit times (its ``passes:`` setting)."""
    return list(settings.passes)


@hookimpl
def register_probes(register):
    register("params", ParamsSettings, params.run, device_free=True,
             views=_VIEWS.format("params"))
    register("gradients", GradientsSettings, gradients.run, passes=("forward", "backward"),
             views=_VIEWS.format("gradients"))
    register("timing", TimingSettings, timing.run, serial=True, passes=timing_passes,
             views=_VIEWS.format("timing"))
    register("training", TrainingSettings, training.run, trains=True,
             views=_VIEWS.format("training"))
    register("dynamics", DynamicsSettings, dynamics.run, trains=True,
             views="variantlab_plugins.probes:dynamics_views")
