"""What the machine gives a run: the memory free under its limits (the size guard's), the
cores it may use and how busy they are (for timings that know it).

- :func:`memory_limits`: the bytes free on a device, under each limit that applies;
- :func:`cores`: the CPUs this process may run on (its affinity mask), capped by its cgroup's
  CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded up);
- :func:`load`: the 1-minute load average (runnable and running processes, the run's own
  included);
- the rule (:func:`busy`): a measurement was taken while the machine was busy when the load
  average at its start or at its end is above the cores available to the run plus
  ``BUSY_MARGIN``. A run's own units keep at most that many threads busy (in-process and
  pool runs never start more torch threads than :func:`cores`), so a load above it means
  other work shared the cores, and a timing measured then reads slow by an unknown factor.
"""

from __future__ import annotations

import math
import os
import resource
from pathlib import Path

#: load above ``cores()`` by more than this counts as busy (the run's own driver and
#: short-lived processes add a little)
BUSY_MARGIN = 0.5


def cores(cgroup: str | Path = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota."""
    try:
        n = len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    quota = _cpu_quota(Path(cgroup))
    return max(1, min(n, math.ceil(quota))) if quota is not None else n


def _cpu_quota(root: Path) -> float | None:
    """CPUs' worth of time the cgroup may use (None: no quota)."""
    try:
        text = (root / "cpu.max").read_text().split()  # v2: "QUOTA PERIOD" or "max PERIOD"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def memory_limits(device: str, meminfo: str | Path = "/proc/meminfo",
                  cgroup: str | Path = "/sys/fs/cgroup",
                  status: str | Path = "/proc/self/status") -> list[tuple[int, str]]:
    """(bytes free, a phrase saying what limits it) for each limit known on ``device``."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return []
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return [(int(free), "(free on the device)")]
    if device != "cpu":
        return []
    out = []
    available = _field_kib(meminfo, "MemAvailable:")
    if available is not None:
        out.append((available, "(MemAvailable)"))
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _field_kib(status, "VmSize:") or 0
        out.append((max(0, soft - used), "under ulimit -v (RLIMIT_AS)"))
    left = _cgroup_left(Path(cgroup))
    if left is not None:
        out.append((left, "under the cgroup's memory limit"))
    return out


def _field_kib(path: str | Path, name: str) -> int | None:
    """A ``NAME: N kB`` line of a /proc file, in bytes."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


#: a cgroup limit at or above this is "no limit" (v1 writes 2^63 rounded to a page)
NO_LIMIT = 1 << 60


def _cgroup_left(root: Path) -> int | None:
    """The cgroup memory limit less the usage (v2 at ``root``, else v1 under
    ``root/memory``); None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes",
                                    "memory/memory.usage_in_bytes")):
        try:
            text = (root / limit_file).read_text().strip()
            if text == "max":
                return None
            limit, usage = int(text), int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        return None if limit >= NO_LIMIT else max(0, limit - usage)
    return None


def load() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return math.nan


def busy(load_start: float, load_end: float, n_cores: int) -> bool:
    """The rule of the module docstring (unknown loads are not busy)."""
    return any(v > n_cores + BUSY_MARGIN for v in (load_start, load_end) if math.isfinite(v))


__all__ = ["BUSY_MARGIN", "busy", "cores", "load", "memory_limits"]
