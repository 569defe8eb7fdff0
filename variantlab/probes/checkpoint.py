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

A checkpoint is used only when it fits its unit: it names the unit's key (which hashes the
spec, the settings and the data) and its number of steps, its step lies inside the run, its
data stream drew one batch per step, and its model tensors have the model's names and
shapes. One that does not fit, or cannot be read, is set aside (renamed ``KEY.pt.unusable``,
not deleted) with a :class:`CheckpointWarning` naming the file, and the unit starts over
from step 0. A checkpoint that cannot be written (a read-only or full disk) is one warning
naming the folder, and the unit goes on without checkpoints: they are insurance, the unit
itself can still finish. The triggers from the environment are checked before a run starts
(:func:`environment_problem`).

The checkpoint folder is ``OUT/<name>/checkpoints`` for the in-process and pool executors;
under Ray it is ``--checkpoint-dir`` (storage every worker can write), and without it Ray
units are not checkpointed and a unit whose worker died starts again from step 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import math
import os
import tempfile
import time
import warnings
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
#: what a checkpoint that does not fit its unit is renamed to (``KEY.pt.unusable``)
SET_ASIDE = ".unusable"
#: what every checkpoint holds besides ``done``, ``key`` and ``total``
PARTS = ("model", "optimizer", "data", "rng", "records")


class CheckpointWarning(UserWarning):
    """A checkpoint was set aside, or could not be written; the unit went on."""


class CheckpointError(Exception):
    """Why a checkpoint does not fit its unit."""


@dataclass
class Checkpoints:
    """The checkpoint file of one running unit and when to write it."""

    path: Path
    every_steps: int = EVERY_STEPS
    every_seconds: float = EVERY_SECONDS
    last_step: int = 0
    last_time: float = field(default_factory=time.monotonic)
    broken: bool = False  # a write failed: no more checkpoints for this unit

    @property
    def key(self) -> str:
        """The unit key the checkpoint belongs to (its file's name)."""
        return self.path.name.removesuffix(SUFFIX)

    def due(self, done: int) -> bool:
        """Whether to write after ``done`` steps (counted from the unit's start)."""
        if self.broken:
            return False
        by_steps = self.every_steps > 0 and done - self.last_step >= self.every_steps
        by_time = self.every_seconds > 0 and time.monotonic() - self.last_time >= \
            self.every_seconds
        return by_steps or by_time

    def save(self, done: int, state: dict[str, Any]) -> None:
        """Write ``state`` (after ``done`` steps) in place of the unit's last checkpoint; a
        write the disk refuses is a warning naming the folder, and no more are tried."""
        try:
            self._write({**state, "done": done, "key": self.key})
        except OSError as exc:
            self.broken = True
            why = exc.strerror or str(exc)
            warnings.warn(f"cannot write checkpoints in {self.path.parent} ({why}); units go "
                          "on without them (one killed now would start over)",
                          CheckpointWarning, stacklevel=2)
        self.last_step, self.last_time = done, time.monotonic()

    def _write(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> dict[str, Any] | None:
        """The unit's last checkpoint as read, or None (none, or one that cannot be read or
        holds no step: set aside with a warning, and the unit starts over)."""
        if not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or not isinstance(state.get("done"), int):
                raise CheckpointError("it holds no step count ('done')")
        except Exception as exc:  # a damaged file: start again rather than fail the unit
            why = str(exc) if isinstance(exc, CheckpointError) else \
                f"it cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            self.set_aside(why)
            return None
        self.last_step = state["done"]
        return state

    def set_aside(self, why: str) -> None:
        """Rename the checkpoint to ``KEY.pt.unusable`` (kept, never read again), warning
        with ``why``; the unit starts over."""
        aside = self.path.with_name(self.path.name + SET_ASIDE)
        try:
            os.replace(self.path, aside)
            moved = f"set aside as {aside}"
        except OSError as exc:
            moved = f"left in place ({exc.strerror or exc}) and not read"
        warnings.warn(f"checkpoint {self.path} does not fit its unit ({why}); {moved}; the "
                      "unit starts over from step 0", CheckpointWarning, stacklevel=3)
        self.last_step = 0


_CURRENT: contextvars.ContextVar[Checkpoints | None] = contextvars.ContextVar(
    "variantlab_checkpoints", default=None)
_UNIT: contextvars.ContextVar[str | None] = contextvars.ContextVar("variantlab_unit", default=None)
#: a deferred training unit's final weights, kept for its test unit: ``KEY.weights``
WEIGHTS = ".weights"
#: a temporary file of another run's key older than this (seconds) is left from a kill
STALE_TMP_S = 3600.0


def current() -> Checkpoints | None:
    """The running unit's checkpoints (None: this unit is not checkpointed)."""
    return _CURRENT.get()


def folder() -> Path | None:
    """The run's checkpoint folder (``VARIANTLAB_CHECKPOINT_DIR``), or None."""
    value = os.environ.get(DIR_VAR)
    return Path(value) if value else None


def triggers() -> tuple[int, float]:
    """(every steps, every seconds) from the environment, else the defaults (checked before
    a run by :func:`environment_problem`)."""
    return (int(os.environ.get(STEPS_VAR, EVERY_STEPS)),
            float(os.environ.get(SECONDS_VAR, EVERY_SECONDS)))


def environment_problem() -> tuple[str, str] | None:
    """(variable, what is wrong) for a trigger in the environment that is not a number of
    steps (a whole number >= 0) or seconds (a finite number >= 0); None: both are fine."""
    steps, seconds = os.environ.get(STEPS_VAR), os.environ.get(SECONDS_VAR)
    if steps is not None:
        try:
            ok = int(steps.strip()) >= 0
        except ValueError:
            ok = False
        if not ok:
            return STEPS_VAR, (f"{steps!r} is not a number of steps; set a whole number >= 0 "
                               f"(0: no checkpoints by steps; default {EVERY_STEPS}) or unset it")
    if seconds is not None:
        try:
            ok = math.isfinite(float(seconds)) and float(seconds) >= 0
        except ValueError:
            ok = False
        if not ok:
            return SECONDS_VAR, (f"{seconds!r} is not a number of seconds; set a number >= 0 "
                                 f"(0: no checkpoints by time; default {EVERY_SECONDS:g}) or "
                                 "unset it")
    return None


@contextlib.contextmanager
def for_unit(key: str) -> Iterator[Checkpoints | None]:
    """While the unit ``key`` runs, :func:`current` gives its checkpoints (when the run has
    a checkpoint folder and a trigger is on)."""
    where = folder()
    steps, seconds = triggers()
    found = Checkpoints(where / f"{key}{SUFFIX}", steps, seconds) \
        if where is not None and (steps > 0 or seconds > 0) else None
    token, unit = _CURRENT.set(found), _UNIT.set(key)
    try:
        yield found
    finally:
        _CURRENT.reset(token)
        _UNIT.reset(unit)


def weights_path(key: str) -> Path | None:
    """Where the final weights of training unit ``key`` are kept for its test unit
    (:func:`keep_weights`); None when the run has no checkpoint folder."""
    where = folder()
    return None if where is None else where / f"{key}{WEIGHTS}"


def keep_weights(model: torch.nn.Module) -> None:
    """Keep the running unit's final model state (``<checkpoint dir>/<unit key>.weights``,
    written to a temporary file and renamed into place), for the unit that scores its test
    split later (:mod:`variantlab.probes.training`, ``test_split: deferred``). Nothing when
    the run has no checkpoint folder or the unit no key; a write the disk refuses is a
    warning, and the test unit trains the model again."""
    key = _UNIT.get()
    path = weights_path(key) if key is not None else None
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"key": key, "model": model.state_dict()}, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        warnings.warn(f"cannot keep the final weights in {path.parent} "
                      f"({exc.strerror or exc}); the test split will be scored after "
                      "training this model again", CheckpointWarning, stacklevel=2)


def kept_weights(key: str, model: torch.nn.Module) -> bool:
    """Load the final weights training unit ``key`` kept (:func:`keep_weights`) into
    ``model``; False (``model`` unchanged) when there are none, or they cannot be read or
    are not this model's: the caller trains the model again."""
    path = weights_path(key)
    if path is None or not path.is_file():
        return False
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("key") != key:
            return False
        want = {n: tuple(t.shape) for n, t in model.state_dict().items()}
        got = {n: tuple(getattr(t, "shape", ())) for n, t in state["model"].items()}
        if want != got:
            return False
        model.load_state_dict(state["model"])
    except Exception:  # noqa: BLE001 - a damaged file: train again rather than fail
        return False
    return True


def drop_weights(key: str) -> None:
    """Remove the weights training unit ``key`` kept (its test unit is stored)."""
    path = weights_path(key)
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def directory(path: Path | None, keep: set[str] | None = None) -> Iterator[None]:
    """Run with checkpoints in ``path`` (None: none): sets ``VARIANTLAB_CHECKPOINT_DIR`` for
    this process and the workers it starts. With ``keep`` (the keys the run plans), it first
    removes what no unit of the run can use: checkpoints and kept final weights of other
    keys (changed code or settings), and the temporary files of a write that was cut off."""
    before = os.environ.get(DIR_VAR)
    if path is None:
        os.environ.pop(DIR_VAR, None)
    else:
        os.environ[DIR_VAR] = str(path)
        if keep is not None and path.is_dir():
            _remove_stale(path, keep)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DIR_VAR, None)
        else:
            os.environ[DIR_VAR] = before


def _remove_stale(path: Path, keep: set[str]) -> None:
    stale = [p for suffix in (SUFFIX, WEIGHTS) for p in path.glob(f"*{suffix}")
             if p.name.removesuffix(suffix) not in keep]
    # ".KEY.pt.XXXX.tmp" / ".KEY.weights.XXXX.tmp", written and renamed by one unit: one of
    # this run's keys is from a process killed mid-write (no unit runs yet); another key's
    # may be a run sharing the folder (Ray's --checkpoint-dir) writing now, unless it is old
    now = time.time()
    for p in path.glob(".*.tmp"):
        key = next((p.name[1:].split(suffix + ".", 1)[0] for suffix in (SUFFIX, WEIGHTS)
                    if suffix + "." in p.name), None)
        with contextlib.suppress(OSError):
            if key is not None and (key in keep or now - p.stat().st_mtime > STALE_TMP_S):
                stale.append(p)
    for found in stale:
        with contextlib.suppress(OSError):  # a read-only folder keeps it
            found.unlink(missing_ok=True)


def remove(key: str) -> None:
    """Remove the checkpoint of unit ``key`` (it was stored)."""
    where = folder()
    if where is not None:
        with contextlib.suppress(OSError):  # none there (the folder could not be written)
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
                      "data": stream.state(), "rng": rng_state(device), "total": len(stream),
                      "records": {k: list(v) for k, v in records.items() if v is not None}})


def misfit(state: dict[str, Any], key: str, model: torch.nn.Module, total: int) -> str | None:
    """Why the checkpoint ``state`` does not belong to the unit ``key`` of ``total`` steps
    training ``model`` (None: it fits)."""
    done = state["done"]
    missing = [p for p in (*PARTS, "key", "total") if p not in state]
    if missing:
        return f"it lacks {', '.join(missing)}"
    if state["key"] != key:
        return f"it belongs to unit {str(state['key'])[:80]!r}, not this one"
    if state["total"] != total:
        return f"it is of a {state['total']}-step run, this unit runs {total} steps"
    if not 0 < done < total:
        return f"its step {done} is not inside this unit's {total} steps"
    data = state["data"]
    if not isinstance(data, dict) or data.get("drawn") != done:
        return f"its data stream is not at step {done}"
    if not isinstance(state["records"], dict) or not isinstance(state["model"], dict):
        return "its records or model state are not what a checkpoint writes"
    losses = state["records"].get("losses")
    if losses is not None and len(losses) != done:  # training keeps one loss per step
        return f"it holds {len(losses)} losses for {done} steps"
    want = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = {name: tuple(getattr(t, "shape", ())) for name, t in state["model"].items()}
    if want.keys() != got.keys():
        odd = sorted(want.keys() ^ got.keys())
        return f"its model tensors are not this model's ({', '.join(odd[:3])} ...)"
    wrong = next((n for n in want if want[n] != got[n]), None)
    if wrong is not None:
        return f"its {wrong} is {list(got[wrong])}, this model's is {list(want[wrong])}"
    return None


def resume_unit(saver: Checkpoints | None, model: torch.nn.Module, opt: Any, stream: Any,
                device: torch.device, records: dict[str, list | None]) -> int:
    """Restore the last checkpoint of the running unit into the loop's objects (extending
    the lists of ``records``); the steps it had done, 0 without one. A checkpoint that does
    not fit the unit (:func:`misfit`) or fails to load is set aside and the unit starts
    over, its objects as they were."""
    state = saver.load() if saver is not None else None
    if saver is None or state is None:
        return 0
    why = misfit(state, saver.key, model, len(stream))
    if why is not None:
        saver.set_aside(why)
        return 0
    before = (copy.deepcopy(optimizer_state(opt)), stream.state(), rng_state(device))
    try:
        load_optimizer_state(opt, state["optimizer"])
        stream.load_state(state["data"])
        set_rng_state(state["rng"], device)
        kept = {name: list(state["records"].get(name, [])) for name, values in records.items()
                if values is not None}
        model.load_state_dict(state["model"])  # names and shapes checked: loads whole
    except Exception as exc:
        load_optimizer_state(opt, before[0])
        stream.load_state(before[1])
        set_rng_state(before[2], device)
        saver.set_aside(f"it does not load: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
        return 0
    for name, values in kept.items():
        records[name].extend(values)  # type: ignore[union-attr]
    return state["done"]


__all__ = ["CheckpointWarning", "Checkpoints", "current", "directory", "drop_weights",
           "environment_problem", "for_unit", "keep_weights", "kept_weights", "misfit",
           "remove", "resume_unit", "save_unit", "weights_path"]
