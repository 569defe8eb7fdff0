"""variantlab's built-in probes, registered through ``register_probes`` like any plugin's."""

from variantlab import hookimpl
from variantlab.probes import dynamics, gradients, params, timing, training
from variantlab.probes.dynamics_report import dynamics_views
from variantlab.settings import (
    DynamicsSettings,
    GradientsSettings,
    ParamsSettings,
    TimingSettings,
    TrainingSettings,
)


@hookimpl
def register_probes(register):
    register("params", ParamsSettings, params.run, device_free=True)
    register("gradients", GradientsSettings, gradients.run)
    register("timing", TimingSettings, timing.run, serial=True)
    register("training", TrainingSettings, training.run, trains=True)
    register("dynamics", DynamicsSettings, dynamics.run, trains=True, views=dynamics_views())
