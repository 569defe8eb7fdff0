"""How busy the machine is, for timings that know it: the cores a run may use and the load
average.

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


def load() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return math.nan


def busy(load_start: float, load_end: float, n_cores: int) -> bool:
    """The rule of the module docstring (unknown loads are not busy)."""
    return any(v > n_cores + BUSY_MARGIN for v in (load_start, load_end) if math.isfinite(v))


__all__ = ["BUSY_MARGIN", "busy", "cores", "load"]
