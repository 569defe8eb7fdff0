"""variantlab's built-in probes, registered through ``register_probes`` like any plugin's."""

from variantlab import hookimpl
from variantlab.probes import dynamics, gradients, params, timing, training
from variantlab.probes.dynamics import DynamicsSettings
from variantlab.probes.gradients import GradientsSettings
from variantlab.probes.params import ParamsSettings
from variantlab.probes.timing import TimingSettings
from variantlab.probes.training import TrainingSettings
from variantlab.report.builtin import gradients as gradients_views
from variantlab.report.builtin import params as params_views
from variantlab.report.builtin import timing as timing_views
from variantlab.report.builtin import training as training_views
from variantlab.report.builtin.dynamics import dynamics_views
from variantlab.report.builtin.routing import routing_views


def timing_passes(settings: TimingSettings) -> list[str]:
    """The passes a timing unit times (its ``passes:`` setting)."""
    return list(settings.passes)


@hookimpl
def register_probes(register):
    register("params", ParamsSettings, params.run, device_free=True, views=params_views.views())
    register("gradients", GradientsSettings, gradients.run, passes=("forward", "backward"),
             views=gradients_views.views())
    register("timing", TimingSettings, timing.run, serial=True, passes=timing_passes,
             views=timing_views.views())
    register("training", TrainingSettings, training.run, trains=True,
             views=training_views.views())
    register("dynamics", DynamicsSettings, dynamics.run, trains=True,
             views=(*dynamics_views(), *routing_views()))
