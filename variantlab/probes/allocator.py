"""The C allocator of a process that computes units: freed memory is kept for the next
tensor instead of being handed back to the kernel and faulted in again.

glibc's ``malloc`` serves a block above its mmap threshold with a fresh mapping, and gives
the top of its heap back to the kernel once more than its trim threshold lies free there.
Both thresholds adapt (the mmap threshold rises to the largest block freed, up to 32 MiB,
and the trim threshold is twice it), which is right for most programs but not for a loop
that allocates and frees the same few blocks of several MiB many times a second: held-out
scoring concatenates each batch's logits (16 MiB at vocabulary 256, 16,384 positions) and
takes their log-softmax, the heap's top is trimmed after every batch, and every page of the
next batch's tensors is faulted in and zeroed again. The throughput sweep's workers took
912,972 page faults in its 40 training units, against 64,153 with the thresholds fixed
(benchmarks/throughput.md, "Sixth round"). Whether the thresholds adapt that way depends on
the order of a process's frees, so the faults varied from process to process: 2,625 and
187,808 in two runs of one scoring script.

:func:`keep_freed_memory` fixes the thresholds (``mallopt``): blocks up to
:data:`MMAP_THRESHOLD` come from the heap, and the heap is trimmed only when more than
:data:`TRIM_THRESHOLD` lies free at its top. A process then holds at most that much memory
it freed beyond its peak; blocks above the mmap threshold (a large model's logits) are
mapped and unmapped as before. The numbers are the same bit for bit: only where the memory
comes from changes.

Memory kept so would hide the growth of the resident set by which the timing probe
measures a region's peak memory on CPU: :func:`release_free_memory` (``malloc_trim(0)``)
gives every free page back first, so the region's own allocations grow the set again.

:func:`keep_freed_memory` is called once per process, by the first unit the process computes
(:func:`variantlab.executors.unit.run_unit`), so it holds for every executor: in-process,
pool workers and Ray workers. It does nothing on a C library other than glibc (macOS,
Windows, musl) and where the user has tuned glibc's allocator already: any of the
``MALLOC_*_`` variables in :data:`USER_SETTINGS`, or ``GLIBC_TUNABLES`` naming
``glibc.malloc``. Those win, as the user's ``OMP_NUM_THREADS`` does over the thread policy.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from typing import Any

#: mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap: glibc's own ceiling for its adaptive threshold
MMAP_THRESHOLD = 32 * 1024 * 1024
#: the heap's top is given back to the kernel only when more than this lies free there
TRIM_THRESHOLD = 128 * 1024 * 1024
#: environment variables with which a user tunes glibc's allocator (theirs win)
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                 "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST")

_done: str | None = None


def user_tuned(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether the environment already tunes glibc's allocator."""
    env = os.environ if environ is None else environ
    return any(name in env for name in USER_SETTINGS) or "glibc.malloc" in env.get(
        "GLIBC_TUNABLES", "")


def keep_freed_memory() -> str:
    """Fix this process's malloc thresholds (once; later calls return the first answer):
    ``"set"``, or why not: ``"user"`` (the user's settings stand), ``"not glibc"`` or
    ``"refused"`` (mallopt returned 0)."""
    global _done
    if _done is None:
        _done = _apply()
    return _done


@functools.cache
def _libc() -> Any:
    """This process's glibc (looked up once), or None on another C library."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:  # the symbols this process has loaded, libc's among them (no ldconfig run)
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def release_free_memory() -> bool:
    """Give every free page of the heap back to the kernel (glibc's ``malloc_trim(0)``),
    whatever the thresholds: whether anything was given back (False on another C library)."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))


def _apply() -> str:
    libc = _libc()
    if libc is None:
        return "not glibc"
    if user_tuned():
        return "user"
    # the mmap threshold first: fixing either threshold ends glibc's adaptation of both
    ok = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
          and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return "set" if ok else "refused"
