"""The token cache: a tokenised corpus kept on disk, read back as a memory map.

A corpus (a list of documents) is tokenised once per content and tokenizer. The ids are
written as ``<key>.tokens.npy`` (uint16 when the tokenizer has at most 65536 ids, else
uint32) and the document boundaries as ``<key>.offsets.npy`` (int64, D + 1 entries: document
``i`` is ``tokens[offsets[i]:offsets[i + 1]]``, its end-of-document id included). ``key`` is a
sha256 over the corpus's content hash, the tokenizer and the cache format, so a changed file
or another tokenizer is a new entry and a stale one is never read. Later runs (and every
worker process) open the files with ``np.load(mmap_mode="r")``: nothing is tokenised again.

A cache cannot lie: ``<key>.sha256`` holds the sha256 of the ids and offsets (and the ids'
type), written last; :func:`load` checks it (once per entry and process) and an entry whose
files do not match it (a damaged or edited file, a disk error) is reported with a
:class:`CacheWarning` naming the file, and tokenised and written again.

Where: ``$VARIANTLAB_CACHE/tokens`` when that variable is set, else
``$XDG_CACHE_HOME/variantlab/tokens`` (``~/.cache/variantlab/tokens``). Entries can be
deleted at any time. Writers never clash: each writes a temporary file in the folder and
renames it into place (atomic on one file system); the offsets go first, then the tokens,
then the digest, and a reader takes an entry only when its digest file exists. A folder that
cannot take an entry (read-only, a file in its place, a full disk) is a :class:`CacheWarning`
naming it: the corpus is tokenised in memory instead, and any file of the entry already
written is removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .tokenizer import encode_documents, n_vocab

#: bump when the layout of the files changes: old entries are then ignored
CACHE_FORMAT = "tokens-v2"


class CacheWarning(UserWarning):
    """A token cache entry was damaged and is being rebuilt, or the cache folder cannot be
    written (the corpus is then tokenised in memory)."""


@dataclass(frozen=True)
class Tokens:
    """A tokenised corpus: ``ids`` (N,) uint16/uint32 (a memory map), ``offsets`` (D + 1,)."""

    ids: np.ndarray
    offsets: np.ndarray
    key: str

    @property
    def n_documents(self) -> int:
        return len(self.offsets) - 1


#: sha256 per file version: (device, inode, size, mtime, ctime) -> digest. The file's
#: identity comes from ``stat`` (no path resolution: a unit hashes its corpus's files three
#: times, 13 ms each time for 100 files with it, 0.46 ms without; benchmarks/throughput.md),
#: or from its absolute path on a file system without inode numbers (0); any write changes
#: its ctime
_FILE_CACHE: dict[tuple[object, ...], str] = {}


def file_digest(path: Path, st: os.stat_result | None = None) -> str:
    """sha256 of a file's bytes (cached while the same file keeps its size, mtime and
    ctime); ``st``: its ``stat`` when the caller has it."""
    st = st if st is not None else path.stat()
    ident = (st.st_dev, st.st_ino) if st.st_ino else (str(path.absolute()),)
    key = (*ident, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _FILE_CACHE.get(key)
    if digest is None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        _FILE_CACHE[key] = digest
    return digest


def files_hash(paths: list[Path]) -> str:
    """One sha256 over the contents of ``paths`` in order (their names left out)."""
    h = hashlib.sha256()
    for path in paths:
        st = path.stat()
        h.update(f"{st.st_size}:{file_digest(path, st)}\n".encode())
    return h.hexdigest()


def cache_dir() -> Path:
    """The folder of the token cache (see the module docstring)."""
    root = os.environ.get("VARIANTLAB_CACHE")
    if root:
        return Path(root).expanduser() / "tokens"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "variantlab" / "tokens"


def entry_key(content_hash: str, tokenizer: str) -> str:
    """The cache entry's name for a corpus's content hash and a tokenizer."""
    return hashlib.sha256(f"{CACHE_FORMAT}\0{tokenizer}\0{content_hash}".encode()).hexdigest()


def id_dtype(tokenizer: str) -> type[np.unsignedinteger]:
    """The narrowest unsigned type holding every id of ``tokenizer``."""
    return np.uint16 if n_vocab(tokenizer) <= 1 << 16 else np.uint32


def _write_atomic(path: Path, array: np.ndarray) -> None:
    _replace(path, lambda f: np.save(f, array, allow_pickle=False))


def _write_text_atomic(path: Path, text: str) -> None:
    _replace(path, lambda f: f.write(text.encode("ascii")))


def _replace(path: Path, write: Callable[[Any], object]) -> None:
    """Write a temporary file in ``path``'s folder with ``write(file)``, then rename it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def digest(ids: np.ndarray, offsets: np.ndarray) -> str:
    """sha256 of an entry: the ids' type and length, their bytes, then the offsets' bytes."""
    h = hashlib.sha256(f"{ids.dtype.str}:{len(ids)}:{len(offsets)}\n".encode())
    h.update(np.ascontiguousarray(ids).data.cast("B"))
    h.update(np.ascontiguousarray(offsets, dtype=np.int64).data.cast("B"))
    return h.hexdigest()


#: (digest file, mtime and size of the ids and offsets files) -> the digest checked
_CHECKED: dict[tuple, str] = {}


def load(key: str, folder: Path | None = None) -> Tokens | None:
    """The cached entry ``key``, or None when it is not (completely) there or is damaged
    (then with a :class:`CacheWarning` naming the file)."""
    folder = folder or cache_dir()
    ids_path, off_path = folder / f"{key}.tokens.npy", folder / f"{key}.offsets.npy"
    sum_path = folder / f"{key}.sha256"
    if not (ids_path.is_file() and off_path.is_file() and sum_path.is_file()):
        return None
    try:
        ids = np.load(ids_path, mmap_mode="r", allow_pickle=False)  # (N,) memmap
        offsets = np.load(off_path, allow_pickle=False)  # (D + 1,)
        want = sum_path.read_text(encoding="ascii").strip()
        stats = (ids_path.stat(), off_path.stat())
    except (OSError, ValueError) as exc:  # unreadable: tokenise again and replace it
        _damaged(ids_path, f"it cannot be read ({type(exc).__name__}: {exc})")
        return None
    if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[-1]) != len(ids):
        _damaged(off_path, "its offsets do not match its tokens")
        return None
    seen = (str(sum_path), *(n for st in stats for n in (st.st_mtime_ns, st.st_size)))
    if _CHECKED.get(seen) != want:
        if digest(ids, offsets) != want:
            _damaged(ids_path, f"its contents do not match the sha256 in {sum_path.name}")
            return None
        _CHECKED[seen] = want
    return Tokens(ids, offsets, key)


def _damaged(path: Path, why: str) -> None:
    warnings.warn(f"token cache entry {path} is damaged ({why}); the corpus is tokenised "
                  "again and the entry rewritten", CacheWarning, stacklevel=3)


def corpus_tokens(content_hash: str, tokenizer: str, documents: Callable[[], list[str]],
                  folder: Path | None = None) -> Tokens:
    """The corpus's tokens from the cache, tokenising ``documents()`` (called only on a miss)
    and storing them first when they are not there."""
    folder = folder or cache_dir()
    key = entry_key(content_hash, tokenizer)
    hit = load(key, folder)
    if hit is not None:
        return hit
    encoded = encode_documents(tokenizer, documents())
    lengths = np.array([len(doc) for doc in encoded], dtype=np.int64)  # (D,)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (D + 1,)
    dtype = id_dtype(tokenizer)
    ids = np.fromiter((t for doc in encoded for t in doc), dtype=dtype,
                      count=int(offsets[-1]))  # (N,)
    if not store(folder, key, ids, offsets):
        return Tokens(ids, offsets, key)  # in memory only, for this process
    return load(key, folder) or Tokens(ids, offsets, key)


def store(folder: Path, key: str, ids: np.ndarray, offsets: np.ndarray) -> bool:
    """Write the entry ``key`` (offsets, tokens, then the digest); False when the folder
    cannot take it (read-only, a file in its place, a full disk, an entry's file replaced
    by a folder): a :class:`CacheWarning` naming the folder, and no file of the entry left
    behind, so no partial entry is ever there."""
    written: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, write in ((folder / f"{key}.offsets.npy", lambda p: _write_atomic(p, offsets)),
                            (folder / f"{key}.tokens.npy", lambda p: _write_atomic(p, ids)),
                            (folder / f"{key}.sha256",
                             lambda p: _write_text_atomic(p, digest(ids, offsets) + "\n"))):
            write(path)
            written.append(path)
    except OSError as exc:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        why = exc.strerror or str(exc)
        where = f" at {exc.filename}" if exc.filename and Path(exc.filename) != folder else ""
        warnings.warn(f"token cache folder {folder} cannot be used ({why}{where}); the corpus "
                      "is tokenised in memory for this run (set VARIANTLAB_CACHE to a "
                      "writable folder to keep it)", CacheWarning, stacklevel=3)
        return False
    return True
