"""How the pool's workers start, kept free of torch so that ``variantlab run --workers N``
can start the forkserver before it imports torch itself (:func:`start_server`).

On Linux the workers are forked from one ``forkserver`` process that has imported
:data:`PRELOAD` (torch, ``torch._dynamo``, which torch.optim imports, and variantlab with its
built-in components) and computed nothing; elsewhere each worker is spawned and imports them
itself. A worker is never a fork of the driver, whose CUDA or torch thread pools a fork
would copy in an unusable state.
"""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

from ..plugin.registry import BUILTIN_MODULES

#: what the forkserver imports once for every worker it forks: torch, and variantlab with
#: its built-in components (the code the driver runs); plugins of other packages and
#: ``--plugin`` files are imported by each worker, as they are on disk then. The last makes
#: the server exit without tearing torch down (:mod:`.serverexit`)
PRELOAD = ("torch", "torch._dynamo", "variantlab.executors.pool", "variantlab.config.experiment",
           "variantlab.probes.training", "variantlab.probes.gradients",
           *(f"variantlab_plugins.{module}" for module in BUILTIN_MODULES),
           "variantlab.executors.serverexit")


def start_method() -> str:
    """How workers start: ``forkserver`` on Linux, else ``spawn``."""
    if sys.platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return "spawn"


def context() -> Any:
    """The multiprocessing context the pool starts its workers with (the forkserver's
    preload set, read when the server starts)."""
    method = start_method()
    ctx: Any = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start_server() -> None:
    """Start the forkserver now, without waiting for it (nothing elsewhere): it imports
    :data:`PRELOAD` while this process imports torch and checks the experiment, instead of
    after. One server serves this process's pools until it exits."""
    if start_method() == "forkserver":
        from multiprocessing import forkserver

        context()
        forkserver.ensure_running()
