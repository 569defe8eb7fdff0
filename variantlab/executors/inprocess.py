"""The in-process executor (``--executor inprocess``, the default for ``--workers 1``):
every unit one after another in the run's own process
(:func:`variantlab.sweep.units.run_in_process`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..plugin.settings import Strict
from ..sweep.units import ResultSink, Unit, run_in_process
from .base import Executor, RunContext

if TYPE_CHECKING:
    from ..config.experiment import Experiment


class InProcessOptions(Strict):
    """No options: everything runs in this process."""

    workers: Literal[1] = Field(default=1, description="always 1: use --executor pool or ray for more")


class InProcessExecutor(Executor):
    def __init__(self, options: InProcessOptions | None = None) -> None:
        self.options = options or InProcessOptions()

    def run(self, sink: ResultSink, units: Sequence[tuple[int, Unit]], experiment: Experiment,
            context: RunContext) -> bool:
        return run_in_process(sink, units, experiment, context.probe_fn, context.fail_fast)
