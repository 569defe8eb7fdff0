"""variantlab's built-in executors, registered through ``register_executors`` like any
plugin's (a Slurm or Kubernetes executor is a plugin of the same shape)."""

from variantlab import hookimpl
from variantlab.executors.inprocess import InProcessExecutor, InProcessOptions
from variantlab.executors.pool import PoolExecutor, PoolOptions
from variantlab.executors.ray import RayExecutor, RayOptions


@hookimpl
def register_executors(register):
    register("inprocess", InProcessOptions, InProcessExecutor)
    register("pool", PoolOptions, PoolExecutor)
    register("ray", RayOptions, RayExecutor)
