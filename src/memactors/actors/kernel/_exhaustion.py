"""Resource exhaustion: whether an error says the machine ran out of file descriptors, memory or disk
(errno values, MemoryError, and SQLite's messages, the only place sqlite3 and sqlean put the reason)
rather than the code being wrong. The supervisor retries such a crash without counting it."""

from __future__ import annotations

import errno

from ...errors import find_cause

_EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})
_EXHAUSTION_SQLITE = ("unable to open", "database or disk is full", "out of memory")


def is_resource_exhaustion(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps: cause, context, group members) says the machine ran out of
    file descriptors, memory or disk, rather than the code being wrong.

    SQLite errors are recognised by their message, the only place sqlite3/sqlean put the reason.
    """
    return exhaustion_leaf(exc) is not None


def exhaustion_leaf(exc: BaseException) -> BaseException | None:
    """The exception in ``exc`` (itself, its cause or context, a group member) that says what ran out."""
    return find_cause(exc, _says_exhausted)


def _says_exhausted(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno in _EXHAUSTION_ERRNOS:
        return True
    return type(exc).__name__ in ("OperationalError", "DatabaseError") and any(
        marker in str(exc).lower() for marker in _EXHAUSTION_SQLITE
    )
