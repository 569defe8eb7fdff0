"""Mid-training checkpoints: a training (or dynamics) unit that is killed resumes from its
last checkpoint and ends with exactly the rows an uninterrupted run gives.

While a run computes, each training unit writes ``<checkpoint dir>/<unit key>.pt`` every
``VARIANTLAB_CHECKPOINT_STEPS`` steps (default 500) or every ``VARIANTLAB_CHECKPOINT_SECONDS``
seconds (default 60), whichever comes first (0 turns that trigger off; both 0: no
checkpoints). A checkpoint holds what the rest of the run depends on: the model's and the
optimizer's state, the step (the learning-rate schedule is a function of it), the global
torch RNG (and CUDA's, on a GPU), the data stream's generator and position, and the rows and
losses recorded so far. It is written to a temporary file and renamed into place, so a kill
mid-write leaves the previous one; a unit has at most one. The runner removes it when the
unit is stored ``ok`` (a ``failed`` unit, such as one whose pool worker died, keeps it, so
the rerun resumes) and, at the start of a run, removes those of units that are not in the
run. Nothing about checkpoints enters a unit key.

The checkpoint folder is ``OUT/<name>/checkpoints`` for the in-process and pool executors;
under Ray it is ``--checkpoint-dir`` (storage every worker can write), and without it Ray
units are not checkpointed and a unit whose worker died starts again from step 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: environment variables: the folder (set by the runner), and the two triggers
DIR_VAR = "VARIANTLAB_CHECKPOINT_DIR"
STEPS_VAR = "VARIANTLAB_CHECKPOINT_STEPS"
SECONDS_VAR = "VARIANTLAB_CHECKPOINT_SECONDS"
EVERY_STEPS = 500
EVERY_SECONDS = 60.0
SUFFIX = ".pt"


@dataclass
class Checkpoints:
    """The checkpoint file of one running unit and when to write it."""

    path: Path
    every_steps: int = EVERY_STEPS
    every_seconds: float = EVERY_SECONDS
    last_step: int = 0
    last_time: float = field(default_factory=time.monotonic)

    def due(self, done: int) -> bool:
        """Whether to write after ``done`` steps (counted from the unit's start)."""
        by_steps = self.every_steps > 0 and done - self.last_step >= self.every_steps
        by_time = self.every_seconds > 0 and time.monotonic() - self.last_time >= \
            self.every_seconds
        return by_steps or by_time

    def save(self, done: int, state: dict[str, Any]) -> None:
        """Write ``state`` (after ``done`` steps) in place of the unit's last checkpoint."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({**state, "done": done}, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.last_step, self.last_time = done, time.monotonic()

    def load(self) -> dict[str, Any] | None:
        """The unit's last checkpoint, or None (none, or unreadable: the unit starts over)."""
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception:  # a damaged file: start again rather than fail the unit
            return None
        self.last_step = int(state["done"])
        return state


_CURRENT: contextvars.ContextVar[Checkpoints | None] = contextvars.ContextVar(
    "variantlab_checkpoints", default=None)


def current() -> Checkpoints | None:
    """The running unit's checkpoints (None: this unit is not checkpointed)."""
    return _CURRENT.get()


def folder() -> Path | None:
    """The run's checkpoint folder (``VARIANTLAB_CHECKPOINT_DIR``), or None."""
    value = os.environ.get(DIR_VAR)
    return Path(value) if value else None


def triggers() -> tuple[int, float]:
    """(every steps, every seconds) from the environment, else the defaults."""
    return (int(os.environ.get(STEPS_VAR, EVERY_STEPS)),
            float(os.environ.get(SECONDS_VAR, EVERY_SECONDS)))


@contextlib.contextmanager
def for_unit(key: str) -> Iterator[Checkpoints | None]:
    """While the unit ``key`` runs, :func:`current` gives its checkpoints (when the run has
    a checkpoint folder and a trigger is on)."""
    where = folder()
    steps, seconds = triggers()
    found = Checkpoints(where / f"{key}{SUFFIX}", steps, seconds) \
        if where is not None and (steps > 0 or seconds > 0) else None
    token = _CURRENT.set(found)
    try:
        yield found
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def directory(path: Path | None, keep: set[str] | None = None) -> Iterator[None]:
    """Run with checkpoints in ``path`` (None: none): sets ``VARIANTLAB_CHECKPOINT_DIR`` for
    this process and the workers it starts; removes checkpoints of keys not in ``keep``."""
    before = os.environ.get(DIR_VAR)
    if path is None:
        os.environ.pop(DIR_VAR, None)
    else:
        os.environ[DIR_VAR] = str(path)
        if keep is not None and path.is_dir():
            for stale in path.glob(f"*{SUFFIX}"):
                if stale.name.removesuffix(SUFFIX) not in keep:
                    stale.unlink(missing_ok=True)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DIR_VAR, None)
        else:
            os.environ[DIR_VAR] = before


def remove(key: str) -> None:
    """Remove the checkpoint of unit ``key`` (it was stored)."""
    where = folder()
    if where is not None:
        (where / f"{key}{SUFFIX}").unlink(missing_ok=True)


def rng_state(device: torch.device) -> dict[str, Any]:
    """The global RNG states a training step draws from (dropout, routing noise)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def optimizer_state(opt: Any) -> Any:
    """``state_dict()`` of an optimizer, or of each of several stepped as one."""
    inner = getattr(opt, "optimizers", None)
    return [o.state_dict() for o in inner] if inner is not None else opt.state_dict()


def load_optimizer_state(opt: Any, state: Any) -> None:
    inner = getattr(opt, "optimizers", None)
    if inner is not None:
        for o, s in zip(inner, state):
            o.load_state_dict(s)
    else:
        opt.load_state_dict(state)


def save_unit(saver: Checkpoints, done: int, model: torch.nn.Module, opt: Any, stream: Any,
              device: torch.device, records: dict[str, list | None]) -> None:
    """Checkpoint a training loop after ``done`` steps: model, optimizer, data stream, RNG
    and the lists in ``records`` (losses, rows, routing logs; None: not kept)."""
    saver.save(done, {"model": model.state_dict(), "optimizer": optimizer_state(opt),
                      "data": stream.state(), "rng": rng_state(device),
                      "records": {k: list(v) for k, v in records.items() if v is not None}})


def resume_unit(saver: Checkpoints | None, model: torch.nn.Module, opt: Any, stream: Any,
                device: torch.device, records: dict[str, list | None]) -> int:
    """Restore the last checkpoint of the running unit into the loop's objects (extending
    the lists of ``records``); the steps it had done, 0 without one."""
    state = saver.load() if saver is not None else None
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    load_optimizer_state(opt, state["optimizer"])
    stream.load_state(state["data"])
    set_rng_state(state["rng"], device)
    for name, values in records.items():
        if values is not None:
            values.extend(state["records"].get(name, []))
    return int(state["done"])


__all__ = ["Checkpoints", "current", "directory", "for_unit", "remove", "resume_unit",
           "save_unit"]
