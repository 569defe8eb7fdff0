"""The pool's forkserver leaves at once when its driver has gone (the last of
:data:`variantlab.executors.starting.PRELOAD`).

The forkserver holds the driver's stdout and stderr (its workers print there), so a caller
that reads them to the end (``subprocess.run(..., capture_output=True)``, ``variantlab run |
tee log``) waits for it to exit as well. It ends on ``SystemExit`` when the driver has gone,
and tearing down the torch it imported kept such a caller waiting 0.7-1.05 s more
(benchmarks/throughput.md); it has nothing to write or flush, so it exits without that
teardown. Imported anywhere else, this module does nothing.
"""

from __future__ import annotations

import atexit
import os
import sys


def _imported_by_the_forkserver() -> bool:
    """Whether this import runs inside ``multiprocessing.forkserver.main`` (its preload)."""
    from multiprocessing import forkserver

    frame = sys._getframe()
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if _imported_by_the_forkserver():
    atexit.register(os._exit, 0)  # its workers end with os._exit and never run atexit
