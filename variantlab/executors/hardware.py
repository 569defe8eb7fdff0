"""Which machine computed a unit, in a few words, stored with it (``machine`` in the units
table).

The same code, torch and data give other low bits on another processor: torch picks its
CPU kernels by instruction set (``torch.backends.cpu.get_cpu_capability``), and its
matrix libraries block their sums by the processor's model and caches. Training can grow
such a difference into the third digit (on this project's VM, a 60-step run of the main
job at its committed code gave other test losses on 2026-11-30 than on 2026-11-28, one
seed by 0.013). So every unit records where it ran, and a report says when its units come
from more than one machine (:func:`variantlab.report.grid.problems`).

- CPU units: the processor's name, its vendor's family / model / stepping numbers where
  Linux gives them (a virtual machine often names only "AMD EPYC"), and the instruction
  set torch dispatches to, e.g. ``AMD EPYC (AuthenticAMD 25/1/1), AVX2``;
- CUDA units: the device's name and compute capability before the processor, e.g.
  ``NVIDIA H200 (sm_90) with AMD EPYC ..., AVX2``.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

import torch


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough: a machine has one model
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_name(cpuinfo: dict[str, str] | None = None) -> str:
    """The processor's name and, where Linux gives them, its vendor's family, model and
    stepping numbers."""
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    name = (info.get("model name") or info.get("Model") or info.get("Hardware")
            or platform.processor() or platform.machine() or "unknown CPU")
    numbers = [info.get(k, "") for k in ("cpu family", "model", "stepping")]
    if all(numbers):
        name += f" ({info.get('vendor_id', '?')} {'/'.join(numbers)})"
    return " ".join(name.split())


@lru_cache(maxsize=8)
def machine(device: str | None = None) -> str:
    """What computed a unit on ``device`` (module docstring): the processor, and the GPU
    before it when the unit's device is (or, for ``auto`` / None, resolves to) a CUDA one;
    computed once per process and device."""
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    cpu = cpu_name() + (f", {capability}" if capability else "")
    cuda = device in (None, "auto") or str(device).startswith("cuda")
    if cuda and torch.cuda.is_available():
        index = torch.device("cuda" if device in (None, "auto") else str(device)).index
        index = torch.cuda.current_device() if index is None else index
        major, minor = torch.cuda.get_device_capability(index)
        return f"{torch.cuda.get_device_name(index)} (sm_{major}{minor}) with {cpu}"
    return cpu


__all__ = ["cpu_name", "machine"]
