"""variantlab's built-in probes, registered through ``register_probes`` like any plugin's."""

from variantlab import hookimpl
from variantlab.probes import dynamics, gradients, params, timing, training
from variantlab.probes.dynamics import DynamicsSettings
from variantlab.probes.gradients import GradientsSettings
from variantlab.probes.params import ParamsSettings
from variantlab.probes.timing import TimingSettings
from variantlab.probes.training import TrainingSettings
from variantlab.report.dynamics import dynamics_views
from variantlab.report.routing import routing_views


@hookimpl
def register_probes(register):
    register("params", ParamsSettings, params.run, device_free=True)
    register("gradients", GradientsSettings, gradients.run)
    register("timing", TimingSettings, timing.run, serial=True)
    register("training", TrainingSettings, training.run, trains=True)
    register("dynamics", DynamicsSettings, dynamics.run, trains=True,
             views=(*dynamics_views(), *routing_views()))
