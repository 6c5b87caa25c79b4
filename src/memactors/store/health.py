"""Whether the store can write: disk-full errors named as such, and the state the surfaces report.

A full disk is the machine's state, not a bug: a write that fails for lack of space is answered
``RESOURCE_EXHAUSTED`` (:class:`~memactors.errors.StoreFull`) naming the database's path and the bytes
free on its filesystem — not ``INTERNAL`` — and `memory status`, `doctor` and ``/readyz`` say the store
is not writable until a write succeeds again and space is back. Kept apart from the engine code so every
engine (SQLite here) classifies its errors the same way with one small hook in its ``write``.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

from ..errors import StoreFull, find_cause

#: Below this many free bytes on the store's filesystem the store counts as not writable: a run record
#: may be 1 MiB, and SQLite needs room for its WAL frames on top.
MIN_FREE_BYTES = 1024 * 1024
#: SQLite's words for SQLITE_FULL (sqlite3 and sqlean put the reason only in the message).
_SQLITE_FULL = "database or disk is full"
#: SQLite's words when it cannot create or extend a file it needs (its -shm, its -wal) at open.
_SQLITE_IO = ("disk i/o error", "unable to open database file")


def disk_full_cause(exc: BaseException) -> BaseException | None:
    """The exception in `exc` (itself, its cause or context, a group member) that says the disk is full."""
    return find_cause(exc, _says_disk_full)


def _says_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, StoreFull):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return type(exc).__name__ in ("OperationalError", "DatabaseError") and _SQLITE_FULL in str(exc).lower()


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on `path`'s filesystem (None when it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full_at_start(path: Path, exc: BaseException) -> StoreFull | None:
    """A :class:`StoreFull` for a start-up step (the state directory's lock, opening or migrating the store
    at ``path``) that failed because the disk is full, else None. It says "disk full", not "damaged": the
    store is intact, only space is missing."""
    free = free_bytes(path if path.is_dir() else path.parent)
    # SQLite opening a WAL store on a full disk says "disk I/O error" (it cannot create -shm or -wal), not
    # SQLITE_FULL: with no space left that is the full disk speaking.
    io_error = any(words in str(exc).lower() for words in _SQLITE_IO)
    if disk_full_cause(exc) is None and not (io_error and free is not None and free < MIN_FREE_BYTES):
        return None
    shown = "unknown" if free is None else f"{free}"
    return StoreFull(f"disk full: cannot start on {path} ({shown} bytes free on its filesystem); the store is "
                     "intact: free some space and start the daemon again")


class WriteHealth:
    """The store's write state: the last write that failed for lack of space, until one succeeds.

    ``failed`` and ``succeeded`` are called by the engine's ``write`` (on the trio thread, no I/O);
    ``snapshot`` reads the filesystem (``statvfs``) and is called from a worker thread.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._full_since: float | None = None
        self._error: str | None = None
        #: bytes free when the disk-full error was seen: with MIN_FREE_BYTES more free since, the store
        #: counts as writable again before the next write confirms it (nothing may write for a while)
        self._free_then: int | None = None

    def failed(self, exc: BaseException) -> BaseException:
        """The exception a caller of ``write`` gets for `exc`: a :class:`StoreFull` naming the path and
        the bytes free when the disk is full (chained to the engine's error), else `exc` itself."""
        cause = disk_full_cause(exc)
        if cause is None:
            return exc
        free = free_bytes(self.path.parent)
        if self._full_since is None:
            self._full_since = time.monotonic()
            self._free_then = free
        if isinstance(cause, StoreFull):
            return cause
        self._error = os.strerror(cause.errno) if isinstance(cause, OSError) and cause.errno else _SQLITE_FULL
        full = StoreFull(self.message(free))  # the message names the path
        full.__cause__ = exc
        return full

    def succeeded(self) -> None:
        self._full_since = None
        self._error = None
        self._free_then = None

    def message(self, free: int | None) -> str:
        shown = "unknown" if free is None else f"{free}"
        return (f"store {self.path} is not writable: {self._error or _SQLITE_FULL}; {shown} bytes free on its "
                "filesystem; free some space: what was refused was not stored, and sending it again is safe")

    def snapshot(self) -> dict[str, Any]:
        """``{path, writable, free_bytes, error, for_seconds}`` for Status, doctor and /readyz (worker thread)."""
        free = free_bytes(self.path.parent)
        low = free is not None and free < MIN_FREE_BYTES
        since, then = self._full_since, self._free_then
        freed = since is not None and free is not None and then is not None and free >= then + MIN_FREE_BYTES
        if since is not None and not freed:
            error = self._error
        elif low:
            error = f"less than {MIN_FREE_BYTES // 1024} KiB free on its filesystem"
        else:
            error = None
        return {"path": str(self.path), "writable": error is None, "free_bytes": free, "error": error,
                "for_seconds": None if since is None or freed else round(time.monotonic() - since, 3)}
