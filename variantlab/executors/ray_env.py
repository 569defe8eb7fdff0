"""What each Ray unit asks for and the checks before a Ray run: devices, the address, the
cluster's capacity. What travels to the workers: :mod:`.ray_payload`."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..sweep.units import Unit

if TYPE_CHECKING:
    from ..config.experiment import Experiment


def unit_resources(experiment: Experiment, unit: Unit) -> tuple[float, float]:
    """``(num_cpus, num_gpus)`` a unit asks for: ``resources:`` of its probe, else one
    CPU, and one GPU when its device is CUDA."""
    res = (getattr(getattr(experiment, "spec", None), "resources", None) or {}).get(unit.probe)
    num_cpus = res.num_cpus if res is not None else 1.0
    gpu = 1.0 if (unit.device or "").startswith("cuda") else 0.0
    num_gpus = res.num_gpus if res is not None and res.num_gpus is not None else gpu
    return float(num_cpus), float(num_gpus)


def check_devices(units: Sequence[tuple[int, Unit]], device: str | None) -> None:
    """``cuda:N`` names a GPU of this machine; Ray assigns each task its own GPU."""
    for _, unit in units:
        if (unit.device or "").startswith("cuda:"):
            loc = ("--device",) if device else ("measure", unit.probe, "device")
            raise SpecError.at(loc, f"{unit.device} names one GPU of this machine; with "
                               "--executor ray write cuda (Ray gives each unit its own GPU)")


def check_address(address: str, timeout: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) that nothing answers on fails fast here
    instead of in Ray's long connection retries; ``auto`` is left to Ray."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise SpecError.at(("--address",), f"{address!r} is not HOST:PORT (e.g. 10.0.0.5:6379, "
                           "the address `ray start --head` prints), ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise SpecError.at(("--address",), f"no Ray cluster answers at {address} "
                           f"({exc.strerror or exc}); start one (ray start --head) or check "
                           "the address") from None


def check_capacity(nodes: list[dict], demands: dict[str, tuple[float, float]]) -> None:
    """Each probe's demand fits on one live node of the cluster, else no unit could start."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", n.get("alive", True))]
    for probe, (cpus, gpus) in demands.items():
        if not any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in alive):
            most = max(((r.get("CPU", 0), r.get("GPU", 0)) for r in alive), default=(0, 0))
            raise SpecError.at(("resources", probe), f"each {probe} unit asks for {cpus:g} CPU(s) "
                               f"and {gpus:g} GPU(s), but no node of the Ray cluster has that "
                               f"(the largest: {most[0]:g} CPU(s), {most[1]:g} GPU(s)); lower "
                               f"resources.{probe} or the probe's device, or add such a node")
