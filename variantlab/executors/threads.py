"""How many torch threads each process of a run computes with: a policy that holds on a
busy machine.

torch's own default is one intra-op thread per core of the machine, whatever else runs on
it. Beside other work those threads spin against it: the main job beside two busy
processes on 2 cores took 5.5x its quiet time at torch's default and 2.3x with one thread
(issue 39). The policy (:func:`policy_threads`), from the cores the run may use
(:func:`variantlab.probes.machine.cores`) and the 1-minute load average when the run starts:

- ``--workers N > 1``: one thread per worker process (N processes already share the cores);
- one process: the cores left free by the load, ``floor(cores - load + BUSY_MARGIN)``, at
  least 1 and at most ``cores`` (a quiet 2-core machine: 2; one busy process beside: 1).

A choice the user made wins over the policy (:func:`choose_threads`), first to last:
``variantlab run --threads N`` (``run_experiment(threads=N)``), the ``VARIANTLAB_THREADS``
environment variable, ``OMP_NUM_THREADS`` (torch reads it at start) and a
``torch.set_num_threads`` call made after variantlab was imported. Each unit stores the
count it ran with (``torch_threads`` of its record).

The count is not part of a unit key: it changes at most the order in which a reduction
adds its terms, so the last bits of a loss, never a conclusion (docs/distributed.md says
what was measured), and a key that held it would make every stored result stale whenever
the load at start differs.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import SpecError
from ..probes.machine import BUSY_MARGIN, cores, load

#: the environment variable that sets the torch threads of every process of a run
ENV = "VARIANTLAB_THREADS"
#: torch's thread count when variantlab was imported: a different count at run time means
#: the user called ``torch.set_num_threads``
AT_IMPORT = torch.get_num_threads()


@dataclass(frozen=True)
class Threads:
    """Torch threads per process of a run and where the number came from."""

    count: int
    source: str  # --threads | VARIANTLAB_THREADS | OMP_NUM_THREADS | torch.set_num_threads | policy


def policy_threads(n_cores: int, load_avg: float, workers: int) -> int:
    """The policy of the module docstring: threads per process for ``workers`` processes on
    ``n_cores`` cores at load average ``load_avg`` (NaN: unknown, taken as idle)."""
    if workers > 1:
        return 1
    busy = load_avg if math.isfinite(load_avg) else 0.0
    return max(1, min(n_cores, math.floor(n_cores - busy + BUSY_MARGIN)))


def env_threads(environ: dict[str, str] | None = None) -> tuple[int, str] | None:
    """``(count, variable)`` from ``VARIANTLAB_THREADS`` or ``OMP_NUM_THREADS``; None when
    neither is set; :class:`SpecError` naming the variable for one that is not a count."""
    env = os.environ if environ is None else environ
    for name in (ENV, "OMP_NUM_THREADS"):
        text = env.get(name, "").strip()
        if not text:
            continue
        try:
            count = int(text)
        except ValueError:
            count = 0
        if count < 1:
            raise SpecError.at((name,), f"{text!r} is not a number of threads; set it to 1 "
                                        "or more, or unset it for the default policy")
        return count, name
    return None


def choose_threads(workers: int = 1, threads: int | None = None) -> Threads:
    """Torch threads per process for a run of ``workers`` processes: ``threads`` when given,
    else the user's choice (environment, ``torch.set_num_threads``), else the policy at the
    cores and load of now."""
    if threads is not None:
        if threads < 1:
            raise SpecError.at(("--threads",), f"{threads} is not a number of threads; use 1 "
                                               "or more (or leave it out for the policy)")
        return Threads(threads, "--threads")
    found = env_threads()
    if found is not None:
        return Threads(*found)
    if torch.get_num_threads() != AT_IMPORT:
        return Threads(torch.get_num_threads(), "torch.set_num_threads")
    return Threads(policy_threads(cores(), load(), workers), "policy")


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch computes with ``count`` intra-op threads in this process within it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["ENV", "Threads", "choose_threads", "env_threads", "policy_threads",
           "torch_threads"]
