"""A run folder opened for writing: one writer at a time, the right experiment, a usable store.

:func:`open_run` is what ``variantlab run`` does before it computes anything: it makes the
run folder (saying why not when ``--out`` is a file, lies under a file or cannot be
written), takes the folder's lock, opens the results store (refusing one that is not a
database, is corrupt or read-only) and checks that no other experiment file wrote it.
Each refusal is a :class:`~variantlab.store.store.StoreError`: one sentence naming the file and
what to do.

The lock is ``fcntl.flock`` on ``<run folder>/run.lock``, which holds the writer's pid.
The operating system releases it when the process ends however it ends (``kill -9``
included), so a stale lock cannot exist; the file itself stays. Readers (``variantlab
report``, :func:`variantlab.results`) take no lock: SQLite's WAL mode lets them read while
the run writes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..store import store as _store
from ..store.store import STORE_FILE, Store, StoreError

LOCK_FILE = "run.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock, as before
    fcntl = None  # type: ignore[assignment]


def blocker(path: Path) -> tuple[Path, str, str] | None:
    """The nearest of ``path`` and its parents that exists (or is a link) and is not a
    folder: ``(it, what it is, what to do)``; ``None`` when a folder can be made there."""
    for p in [path, *path.parents]:
        if p.is_symlink():
            try:
                p.stat()  # follows the link
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return (p, "is a symbolic link that loops (it leads back to itself), not "
                            "a folder", "fix or remove the link")
                return (p, f"is a symbolic link to {os.readlink(p)!r}, which does not exist",
                        "make that folder or fix the link")
        if p.exists():
            return None if p.is_dir() else (p, "is a file, not a folder", "move the file away")
    return None


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` (``OUT/<name>``), or say in one sentence why it cannot be."""
    found = blocker(run_dir)
    if found is not None:
        path, what, fix = found
        raise StoreError(f"{path} {what}, so the run folder {run_dir} cannot be made there; "
                         f"choose another --out or {fix}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}; "
                         "choose another --out") from None
    if not _store.writable(run_dir):
        raise StoreError(f"the run folder {run_dir} is not writable; choose another --out "
                         "or fix its permissions")


class RunLock:
    """The exclusive lock of one run folder, held while a run writes it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock now or raise :class:`StoreError` naming the process holding it."""
        if fcntl is None:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}: {exc.strerror or exc}; "
                             "choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"{self.path.parent} is being written by another variantlab run (pid {holder}); "
                "wait for it to finish (or stop it), or use another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def check_owner(store: Store, experiment_file: str | None) -> None:
    """Refuse a store that another experiment file (same ``name:``) wrote while that file
    still exists; the same file, edited, is fine."""
    if not experiment_file:
        return
    previous = store.meta().get("experiment_file")
    if previous and previous != experiment_file and Path(previous).exists():
        raise StoreError(
            f"{store.path} was written by the experiment file {previous}, not {experiment_file} "
            "(both are named the same); use another --out or rename one experiment's 'name:'")


@contextmanager
def open_run(run_dir: Path, experiment_file: str | None = None) -> Iterator[Store]:
    """The run folder's store, locked for this process while the block runs."""
    make_run_dir(run_dir)
    if (run_dir / STORE_FILE).is_dir():
        raise StoreError(f"{run_dir / STORE_FILE} is a folder, not a results store; move it "
                         "away or use another --out")
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        with Store(run_dir / STORE_FILE, writer=True) as store:
            check_owner(store, experiment_file)
            yield store
    finally:
        lock.release()
