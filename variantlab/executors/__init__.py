"""Executors: what computes the units of a run (``variantlab run --executor NAME``).

Every executor implements :class:`variantlab.executors.base.Executor` and is registered
through the ``register_executors`` plugin hook, the built-ins by ``variantlab_plugins.executors``:

- ``inprocess`` (:mod:`.inprocess`): one unit after another in the run's own process;
- ``pool`` (:mod:`.pool`): ``--workers N`` worker processes on this machine;
- ``ray`` (:mod:`.ray`): Ray tasks on a local Ray instance or a cluster (``--address``).

Whichever computes, the run's process alone writes the store, through one
:class:`variantlab.executors.unit.ResultSink`; the runner only looks an executor up by name.
"""
