"""The in-process executor (``--executor inprocess``, the default for ``--workers 1``):
every unit one after another in the run's own process (:func:`run_in_process`, which the
process pool also uses for the serial units it keeps out of its workers)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..plugin.settings import Strict
from ..probes import run_probe
from ..sweep.units import Unit
from .base import Executor, Feed, RunContext, fed
from .unit import ResultSink, run_unit

if TYPE_CHECKING:
    from ..config.experiment import Experiment


class InProcessOptions(Strict):
    """No options: everything runs in this process."""

    workers: Literal[1] = Field(default=1, description="always 1: use --executor pool or ray for more")


class InProcessExecutor(Executor):
    feeds = True

    def __init__(self, options: InProcessOptions | None = None) -> None:
        self.options = options or InProcessOptions()

    def run(self, sink: ResultSink, units: Sequence[tuple[int, Unit]], experiment: Experiment,
            context: RunContext) -> bool:
        return run_in_process(sink, units, experiment, context.probe_fn, context.fail_fast,
                              context.feed)


def run_in_process(
    sink: ResultSink,
    units: Sequence[tuple[int, Unit]],
    experiment: Experiment,
    probe_fn: Callable[..., list] = run_probe,
    fail_fast: bool = False,
    feed: Feed | None = None,
) -> bool:
    """``(index, unit)`` pairs one after another in this process, each stored as it ends;
    the units ``feed`` adds once a unit is stored run next. Returns ``False`` when ``fail_fast`` stopped
    it; KeyboardInterrupt propagates."""
    queue = deque(units)
    queue.extend(fed(sink, feed, None))
    while queue:
        index, unit = queue.popleft()
        if sink.stored_ok(unit):
            sink.skip(index, unit)
            queue.extendleft(reversed(fed(sink, feed, unit)))
            continue
        sink.start(index, unit)
        record, rows = run_unit(unit, experiment, probe_fn)
        if not sink.save(index, unit, record, rows) and fail_fast:
            return False
        queue.extendleft(reversed(fed(sink, feed, unit)))  # next: it may need another round
    return True
