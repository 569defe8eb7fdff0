"""What ``--executor ray`` ships to its workers: chosen file by file, counted, then staged.

Only what the units read travels (the cluster needs variantlab, torch and Ray of the
driver's versions installed; nothing else of the experiment's folder goes):

- the plugin files named relatively in ``plugins:``, and the plugin modules found in the
  experiment's folder (a module file, or every file of its package);
- the files a ``data: {source: text}`` path with a relative path or glob matches;

copied, at their paths relative to the experiment's folder, into a staged working folder
that becomes Ray's ``working_dir`` (the worker rebuilds the experiment with ``base_dir``
the folder's copy, so relative paths and globs match the same files there). Every other
plugin file (``--plugin`` files, absolute paths in ``plugins:``) is copied into one staged
package in ``py_modules`` (:class:`Shipped`), imported on the worker under the name it has
here (so unit keys agree), and ``--plugin`` modules that are not installed go as modules.
Data named by an absolute path is read at that path on every node and is not shipped.

Never shipped: a file under the run folder or ``--out`` (unless the experiment's folder is
in it), under a Ray temp folder (``RAY_TMPDIR``, ``$TMPDIR/ray``, ``/tmp/ray``, or any folder
holding Ray's ``session_latest``) or the stage, nor ``.git``, ``.venv``, ``__pycache__``.

Before anything is staged the total is counted (:func:`check_size`): above
``--ray-max-upload`` MB (default 100; 1 MB = 10^6 bytes) the run is refused, naming the
largest files.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    from ..config.experiment import Experiment

DEFAULT_MAX_MB = 100.0
SKIPPED = {".git", ".venv", "__pycache__"}


@dataclass(frozen=True)
class Shipped:
    """Plugin files shipped in the staged package ``package``: (plugin, path inside it)."""

    package: str
    files: tuple[tuple[str, str], ...]

    def paths(self) -> dict[str, str]:
        """Plugin -> its copy's path, on the worker."""
        root = Path(list(importlib.import_module(self.package).__path__)[0])
        return {target: str(root / rel) for target, rel in self.files}


@dataclass
class Payload:
    """What a run would ship: ``files`` (path here, path in the working folder), the
    experiment folder's place in it (``base``), plugin files for the staged package and
    modules for ``py_modules``."""

    files: list[tuple[Path, str]] = field(default_factory=list)
    base: str = "."
    plugin_files: list[tuple[str, Path]] = field(default_factory=list)
    modules: list[Any] = field(default_factory=list)

    def sizes(self) -> list[tuple[Path, int]]:
        """Every file that travels with its size in bytes, the largest first."""
        paths = [p for p, _ in self.files] + [p for _, p in self.plugin_files]
        for module in self.modules:
            paths += list(_walk(_module_root(module), ()))
        return sorted(((p, p.stat().st_size) for p in paths), key=lambda x: (-x[1], str(x[0])))


def is_file_target(target: str) -> bool:
    """Whether a plugin entry names a file (as :func:`variantlab.plugin.registry.import_target`)."""
    return target.endswith(".py") or "/" in target or "\\" in target


def never_shipped(base: Path, run_dir: Path | None, stage: Path | None = None) -> list[Path]:
    """Folders no file is shipped from: the run folder, ``--out`` (unless the experiment's
    folder is in it), Ray's temp folders and the stage."""
    ray_tmp = [Path(tempfile.gettempdir()) / "ray", Path("/tmp/ray")]
    if os.environ.get("RAY_TMPDIR"):
        ray_tmp.append(Path(os.environ["RAY_TMPDIR"]))
    apart = [_norm(p) for p in [run_dir.parent if run_dir else None, *ray_tmp, stage] if p]
    run = [_norm(run_dir)] if run_dir is not None else []
    return run + [p for p in apart if not _under(base, [p])]


def select(experiment: Experiment, extra_plugins: Sequence[str], run_dir: Path | None,
           stage_dir: Path | None = None) -> Payload:
    """The files the units read, as :class:`Payload` (nothing is copied yet)."""
    from ..data.sources import DataError, TextData, text_files

    base = _norm(Path(experiment.base_dir))
    never = never_shipped(base, run_dir, stage_dir)
    spec = experiment.spec
    wanted: list[Path] = []
    payload = Payload()
    for target in spec.plugins:
        if is_file_target(target):
            if Path(target).is_absolute():
                payload.plugin_files.append((target, Path(target)))
            else:
                wanted.append(_norm(base / target))
        else:
            root = _module_root(importlib.import_module(target.partition(".")[0]))
            if root is not None and _under(root, [base]):
                wanted += [root] if root.is_file() else list(_walk(root, never))
            elif (module := local_module(target)) is not None:
                payload.modules.append(module)
    payload.plugin_files += [(t, _norm(Path(t))) for t in extra_plugins if is_file_target(t)]
    payload.modules += [m for t in extra_plugins if not is_file_target(t)
                        if (m := local_module(t)) is not None and m not in payload.modules]
    data = spec.data
    if isinstance(data, TextData) and not Path(os.path.expanduser(data.path)).is_absolute():
        try:
            wanted += [_norm(p) for p in text_files(data.path, base)]
        except DataError:  # matches nothing: the units fail saying so (preflight warned)
            pass
    wanted = [p for p in dict.fromkeys(wanted) if not _under(p, never) and not _in_ray_temp(p)]
    if wanted:
        root = Path(os.path.commonpath([str(base), *(str(p.parent) for p in wanted)]))
        payload.files = [(p, p.relative_to(root).as_posix()) for p in wanted]
        payload.base = base.relative_to(root).as_posix() or "."
    return payload


def check_size(payload: Payload, max_mb: float) -> int:
    """The payload's total bytes; :class:`SpecError` naming the largest files above
    ``max_mb`` megabytes (10^6 bytes)."""
    sizes = payload.sizes()
    total = sum(s for _, s in sizes)
    if total > max_mb * 1e6:
        largest = ", ".join(f"{p} ({_mb(s)})" for p, s in sizes[:3])
        raise SpecError.at(("--ray-max-upload",), (
            f"--executor ray would ship {_mb(total)} in {len(sizes)} file(s) to the workers, "
            f"above the limit of {max_mb:g} MB; the largest: {largest}. Put large data on "
            "storage every node sees at the same absolute path and name it by that path in "
            "data.path (not shipped), or raise the limit (--ray-max-upload MB)"))
    return total


def stage(payload: Payload, stage_dir: Path) -> tuple[dict[str, Any], Shipped | None, str | None]:
    """Copy the payload under ``stage_dir``: ``(runtime_env, shipped plugin files, the
    worker's base_dir or None when no working folder is shipped)``."""
    env: dict[str, Any] = {}
    base = None
    if payload.files:
        work = stage_dir / "work"
        (work / payload.base).mkdir(parents=True, exist_ok=True)
        for path, rel in payload.files:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            _copy(path, work / rel)
        env["working_dir"] = str(work)
        base = payload.base
    shipped = _stage_plugins(payload.plugin_files, stage_dir) if payload.plugin_files else None
    py_modules = ([str(stage_dir / shipped.package)] if shipped else []) + payload.modules
    if py_modules:
        env["py_modules"] = py_modules
    return env, shipped, base


def make_stage() -> Path:
    return Path(tempfile.mkdtemp(prefix="variantlab-ray-"))


def local_module(target: str) -> Any:
    """The top-level module of plugin module ``target`` when it is not installed (it would
    be missing on the cluster), else ``None``."""
    top = importlib.import_module(target.partition(".")[0])
    origin = _module_root(top)
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    if origin is None or any(origin.resolve().is_relative_to(p) for p in installed):
        return None
    return top


def _stage_plugins(files: list[tuple[str, Path]], stage_dir: Path) -> Shipped:
    digest = hashlib.sha256("\0".join(str(p) for _, p in files).encode()).hexdigest()[:12]
    package = f"variantlab_shipped_{digest}"
    root = stage_dir / package
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


def _module_root(module: Any) -> Path | None:
    """A module's file, or its package's folder; ``None`` for a built-in or namespace."""
    paths = list(getattr(module, "__path__", []) or [])
    if paths:
        return _norm(Path(paths[0]))
    file = getattr(module, "__file__", None)
    return _norm(Path(file)) if file else None


def _walk(root: Path | None, never: Iterable[Path]) -> Iterable[Path]:
    """Files under ``root`` (itself, if a file), leaving out SKIPPED and ``never`` folders."""
    if root is None:
        return
    if root.is_file():
        yield root
        return
    never = list(never)
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and not _under(here / d, never)
                         and not (here / d / "session_latest").exists())
        yield from (here / f for f in sorted(files) if not f.endswith(".pyc"))


def _copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same filesystem: no second copy of the bytes
    except OSError:
        shutil.copy2(src, dst)


def _norm(path: Path) -> Path:
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(path))))


def _under(path: Path, folders: Iterable[Path]) -> bool:
    """Whether ``path`` is one of ``folders`` or inside one (also through symlinks)."""
    real = path.resolve()
    return any(path.is_relative_to(f) or real.is_relative_to(f.resolve()) for f in folders)


def _in_ray_temp(path: Path) -> bool:
    """Whether a folder above ``path`` is a Ray temp folder (it holds ``session_latest``),
    wherever ``ray start --temp-dir`` put it."""
    return any((p / "session_latest").exists() for p in path.parents if p != p.parent)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"

