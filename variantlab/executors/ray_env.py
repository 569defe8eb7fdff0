"""How the Ray executor's code and files reach the workers, and what each unit asks for.

Ray's runtime environment carries them (the cluster needs variantlab, torch and Ray of the
driver's versions installed; everything else travels):

- ``working_dir``: the experiment's folder, when the experiment reads from it (a plugin
  file or module named relatively in ``plugins:``, ``data: {source: text}`` with a relative
  path); the worker's current folder is then a copy of it and the experiment is rebuilt
  with ``base_dir`` ``.``. The run's ``--out`` folder, ``.git``, ``.venv`` and
  ``__pycache__`` are left out.
- ``py_modules``: every other plugin file (``--plugin`` files, absolute paths in
  ``plugins:``), copied into one staged package (``variantlab_shipped_<hash>``), each
  imported on the worker from its copy under its own name (so unit keys agree); and
  ``--plugin`` modules that are not installed (not under site-packages), as modules.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import shutil
import socket
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..sweep.units import Unit

if TYPE_CHECKING:
    from ..config.experiment import Experiment

EXCLUDES = [".git", ".venv", "__pycache__"]


@dataclass(frozen=True)
class Shipped:
    """Plugin files shipped in the staged package ``package``: (plugin, path inside it)."""

    package: str
    files: tuple[tuple[str, str], ...]

    def paths(self) -> dict[str, str]:
        """Plugin -> its copy's path, on the worker."""
        root = Path(list(importlib.import_module(self.package).__path__)[0])
        return {target: str(root / rel) for target, rel in self.files}


def is_file_target(target: str) -> bool:
    """Whether a plugin entry names a file (as :func:`variantlab.plugin.registry.import_target`)."""
    return target.endswith(".py") or "/" in target or "\\" in target


def runtime_env(experiment: Experiment, extra_plugins: Sequence[str], run_dir: Path | None,
                stage: Path) -> tuple[dict[str, Any], Shipped | None, bool]:
    """``(runtime_env, shipped plugin files, whether the experiment's folder is shipped)``;
    plugin files are copied under ``stage`` (a folder the caller removes afterwards)."""
    base = Path(experiment.base_dir).resolve()
    env: dict[str, Any] = {}
    folder = _reads_folder(experiment)
    if folder:
        env["working_dir"] = str(base)
        env["excludes"] = EXCLUDES + _inside(run_dir.parent if run_dir else None, base)
    files = [(t, base / t) for t in experiment.spec.plugins
             if is_file_target(t) and not (folder and not Path(t).is_absolute())]
    files += [(t, Path(t).resolve()) for t in extra_plugins if is_file_target(t)]
    shipped = _stage(files, stage) if files else None
    modules = [m for m in (_local_module(t) for t in extra_plugins if not is_file_target(t)) if m]
    py_modules: list[Any] = ([str(stage / shipped.package)] if shipped else []) + modules
    if py_modules:
        env["py_modules"] = py_modules
    return env, shipped, folder


def _reads_folder(experiment: Experiment) -> bool:
    """Whether the experiment reads files relative to its folder."""
    spec = experiment.spec
    relative_plugins = any(not Path(t).is_absolute() for t in spec.plugins)
    path = getattr(spec.data, "path", None)
    return relative_plugins or (path is not None and not Path(path).is_absolute())


def _inside(folder: Path | None, base: Path) -> list[str]:
    """``folder`` relative to ``base`` when inside it (as an exclude pattern), else none."""
    if folder is None:
        return []
    try:
        rel = folder.resolve().relative_to(base)
    except ValueError:
        return []
    return [f"/{rel.as_posix()}"] if rel.parts else []


def _stage(files: list[tuple[str, Path]], stage: Path) -> Shipped:
    digest = hashlib.sha256("\0".join(str(p) for _, p in files).encode()).hexdigest()[:12]
    package = f"variantlab_shipped_{digest}"
    root = stage / package
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    entries = []
    for i, (target, path) in enumerate(files):
        if not path.is_file():
            raise SpecError.at(("plugins",), f"plugin file {str(path)!r} does not exist")
        (root / str(i)).mkdir()
        shutil.copy2(path, root / str(i) / path.name)
        entries.append((target, f"{i}/{path.name}"))
    return Shipped(package, tuple(entries))


def _local_module(target: str) -> Any:
    """The top-level module of ``--plugin`` module ``target`` when it is not installed
    (it would be missing on the cluster), else ``None``."""
    top = importlib.import_module(target.partition(".")[0])
    origin = getattr(top, "__file__", None) or next(iter(getattr(top, "__path__", [])), None)
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    if origin is None or any(Path(origin).resolve().is_relative_to(p) for p in installed):
        return None
    return top


def make_stage() -> Path:
    return Path(tempfile.mkdtemp(prefix="variantlab-ray-"))


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
