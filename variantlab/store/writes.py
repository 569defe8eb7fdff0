"""Telling a write the disk or the file refused (a full disk, a quota, a file made
read-only, an I/O error) from any other error, for :class:`~variantlab.store.store.Store` and
the report writer."""

from __future__ import annotations

import errno
import sqlite3

#: SQLite's primary result codes of a write the disk or the file refused
_WRITE_CODES = {8: "the file became read-only", 10: "an I/O error", 13: "the disk is full"}
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}


def write_problem(exc: BaseException) -> str | None:
    """What a failed write says when the disk or the file refused it (``None``: another
    error): a full disk, a quota, a read-only file, an I/O error."""
    if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
        return exc.strerror or str(exc)
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _WRITE_CODES:
            return f"{_WRITE_CODES[code & 0xFF]} (sqlite: {exc})"
        if "disk is full" in str(exc):
            return f"the disk is full (sqlite: {exc})"
    return None
