"""`memactors store backup PATH` / `store restore PATH`: the SQLite store, copied while the daemon serves,
and put back with the daemon stopped (docs/operations.md "Backup and restore").

Backup is SQLite's online backup API (``Connection.backup``, all pages in one step): it reads the store
under one read transaction, so the copy is the store as of the moment the step began, every transaction
committed before it in, none after, while the daemon goes on writing beside it (WAL: a reader never
blocks the writer). The copy is written beside PATH and renamed onto it only after ``PRAGMA
integrity_check`` answers ``ok`` on it; a failed check leaves PATH as it was. Page-level, so the
built-in provider's full-text and vector tables come along without their modules loaded.

Restore checks the backup the same way, then moves the store aside (``memactors.db.before-restore`` with
its ``-wal`` and ``-shm`` renamed alongside, so nothing of the old write-ahead log is ever applied to the
restored file) and puts the backup in its place. The caller holds the state directory's lock: no daemon
runs on the store meanwhile. Blocking file I/O throughout: run it in a worker thread from async code.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
import sqlean

__all__ = ["BackupError", "Backup", "backup_sqlite", "integrity", "restore_sqlite"]

#: Where restore moves the store it replaces (and its -wal, -shm), in the same directory.
BEFORE_RESTORE = ".before-restore"


class BackupError(RuntimeError):
    """Raised when a backup or restore cannot be made: no store, a copy that fails its check."""


@attrs.frozen
class Backup:
    path: Path
    bytes: int
    seconds: float
    integrity: str


def integrity(path: Path) -> str:
    """``PRAGMA integrity_check`` on the file at `path`, opened read-only: ``ok`` or SQLite's findings."""
    try:
        conn = sqlean.connect(f"file:{path}?mode=ro", uri=True)
    except sqlean.Error as exc:
        return f"cannot open: {exc}"
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    except sqlean.Error as exc:
        return f"not a SQLite database ({exc})"
    finally:
        conn.close()
    return "; ".join(str(r[0]) for r in rows[:20])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup_sqlite(store: Path, target: Path) -> Backup:
    """Copy the SQLite store at `store` to `target` (online, consistent), checked before it is kept."""
    if not store.is_file():
        raise BackupError(f"no SQLite store at {store}")
    target = target.resolve()
    if target == store.resolve():
        raise BackupError("the backup would overwrite the store itself")
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    started = time.monotonic()
    source = sqlean.connect(f"file:{store}?mode=ro", uri=True)
    try:
        partial.unlink(missing_ok=True)
        copy = sqlean.connect(str(partial))
        try:
            source.backup(copy, pages=-1)  # every page in one step: one read transaction, one snapshot
            copy.execute("PRAGMA journal_mode = DELETE")  # a single self-contained file, no -wal beside it
        finally:
            copy.close()
    except sqlean.Error as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"backup of {store} failed: {exc}") from None
    finally:
        source.close()
    os.chmod(partial, 0o600)
    found = integrity(partial)
    if found != "ok":
        partial.unlink(missing_ok=True)
        raise BackupError(f"the copy failed its integrity check ({found}); {target} is unchanged")
    _fsync(partial)
    os.replace(partial, target)
    return Backup(target, target.stat().st_size, time.monotonic() - started, found)


def restore_sqlite(backup: Path, store: Path) -> Path | None:
    """Put the backup at `backup` in place of the store at `store` (no daemon on it: the caller holds the
    lock). Returns where the replaced store was moved (None when there was none)."""
    if not backup.is_file():
        raise BackupError(f"no backup at {backup}")
    found = integrity(backup)
    if found != "ok":
        raise BackupError(f"{backup} fails its integrity check ({found}); the store is unchanged")
    store.parent.mkdir(parents=True, exist_ok=True)
    incoming = store.with_name(f".{store.name}.restore-{os.getpid()}")
    with backup.open("rb") as src, open(incoming, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    os.chmod(incoming, 0o600)
    moved: Path | None = None
    if store.exists():
        moved = store.with_name(store.name + BEFORE_RESTORE)
        for suffix in ("-wal", "-shm", ""):
            old = Path(f"{moved}{suffix}")
            old.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            side = Path(f"{store}{suffix}")
            if side.exists():
                os.replace(side, f"{moved}{suffix}")
        os.replace(store, moved)
    else:
        for suffix in ("-wal", "-shm"):
            Path(f"{store}{suffix}").unlink(missing_ok=True)
    os.replace(incoming, store)
    return moved
