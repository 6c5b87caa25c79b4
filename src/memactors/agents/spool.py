"""The session spool: run records a hook could not hand to the daemon, kept until it can.

A resident's ``SessionEnd`` hook runs once, when the session ends; if the daemon is down then, the
session would be lost. The hook appends the run record it built to ``session-spool.jsonl`` in the state
directory instead (mode 0600, in the 0700 state directory: a record carries the agent's last answer),
and whoever next reaches the daemon sends it: the hook itself after its next successful call,
``memactors spool send``, and the daemon when it starts.

Sending is safe to repeat: ingesting a record the store already holds answers ``duplicate`` and changes
nothing (the episode id is a hash of harness, run and start). So the rules below only make sure nothing
is *lost*, never that nothing is sent twice:

* An append takes an exclusive ``flock`` on the spool file and then checks that the path still names
  the file it locked; a sender may have claimed (renamed) it meanwhile, and the append then retries on
  the new file.
* A sender claims the whole spool by renaming it, under the same lock, to ``session-spool.sending-*``,
  and keeps an exclusive lock on the claimed file while it sends. Records that could not be delivered
  go back to the spool; records the daemon refused go to ``session-spool.rejected.jsonl`` (kept for a
  person to read, never retried); then the claimed file is removed. A claimed file nobody holds a lock
  on was left by a sender that died: the next sender adopts it.

Standard library only: the CLI imports this on its start-up path.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["BATCH", "REVOCATIONS", "Claim", "append", "batches", "queue_revocation", "queued_revocations", "settle_revocations", "claim", "count_lines", "pending", "reject", "rejected_path", "requeue",
           "send_spool", "spool_path", "tally"]

SPOOL = "session-spool.jsonl"
#: Token revocations `memactors uninstall` could not hand to the daemon, applied at its start.
REVOCATIONS = "revocations-spool.jsonl"
REJECTED = "session-spool.rejected.jsonl"
_CLAIMED = "session-spool.sending-"


def spool_path(state_dir: Path) -> Path:
    return state_dir / SPOOL


def rejected_path(state_dir: Path) -> Path:
    return state_dir / REJECTED


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


@contextmanager
def _locked_append(path: Path) -> Iterator[int]:
    """An fd open for appending on ``path`` (created 0600), exclusively locked, and still the file the
    path names (a sender renames the spool away under the same lock)."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield fd
                return
        finally:
            os.close(fd)  # closing releases the lock


def _write_lines(path: Path, entries: list[dict[str, Any]]) -> None:
    if not entries:
        return
    data = "".join(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n" for entry in entries)
    with _locked_append(path) as fd:
        os.fchmod(fd, 0o600)
        os.write(fd, data.encode("utf-8"))
        os.fsync(fd)


def append(state_dir: Path, entry: dict[str, Any]) -> Path:
    """Add one entry (``{"record", "source", "spooled_at"}``) to the spool; returns the spool's path."""
    _private_dir(state_dir)
    path = spool_path(state_dir)
    _write_lines(path, [entry])
    return path


def requeue(state_dir: Path, entries: list[dict[str, Any]]) -> None:
    """Put undelivered entries back in the spool."""
    _write_lines(spool_path(state_dir), entries)


def reject(state_dir: Path, entries: list[dict[str, Any]]) -> None:
    """Keep entries the daemon refused (an invalid record) where a person can read them; never retried."""
    _write_lines(rejected_path(state_dir), entries)


def count_lines(path: Path) -> int:
    """Non-empty lines in ``path`` (0 when it does not exist)."""
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def pending(state_dir: Path) -> int:
    """How many entries wait in the spool, claimed files included (a cheap line count)."""
    return sum(count_lines(path) for path in [spool_path(state_dir), *sorted(state_dir.glob(_CLAIMED + "*"))])


class Claim:
    """Entries claimed for sending: the claimed files stay locked until :meth:`done`."""

    def __init__(self, state_dir: Path, held: list[tuple[Path, int]], entries: list[dict[str, Any]],
                 unreadable: int) -> None:
        self.state_dir = state_dir
        self.entries = entries
        #: Lines that were not a JSON object with a ``record`` (a torn write): moved to the rejected file.
        self.unreadable = unreadable
        self._held = held

    def done(self, *, undelivered: list[dict[str, Any]], refused: list[dict[str, Any]]) -> None:
        """Requeue ``undelivered``, keep ``refused``, then drop the claimed files and their locks."""
        requeue(self.state_dir, undelivered)
        reject(self.state_dir, refused)
        self.release(delete=True)

    def release(self, *, delete: bool) -> None:
        for path, fd in self._held:
            if delete:
                path.unlink(missing_ok=True)
            os.close(fd)
        self._held = []


def claim(state_dir: Path) -> Claim | None:
    """Take everything spooled (and what a dead sender left claimed); None when there is nothing."""
    held: list[tuple[Path, int]] = []
    path = spool_path(state_dir)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        fcntl.flock(fd, fcntl.LOCK_EX)
        target = state_dir / f"{_CLAIMED}{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.rename(path, target)
                held.append((target, fd))  # still locked: it is ours to send
            else:
                os.close(fd)
        except FileNotFoundError:
            os.close(fd)
    for orphan in sorted(state_dir.glob(_CLAIMED + "*")):
        if any(orphan == mine for mine, _ in held):
            continue
        try:
            fd = os.open(orphan, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # a live sender holds it
            continue
        if not orphan.exists():  # its sender finished between the glob and the lock
            os.close(fd)
            continue
        held.append((orphan, fd))
    if not held:
        return None
    entries: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    for claimed, _ in held:
        for line in claimed.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            if isinstance(entry, dict) and isinstance(entry.get("record"), dict):
                entries.append(entry)
            else:
                unreadable.append({"unreadable": line[:4096]})
    reject(state_dir, unreadable)
    return Claim(state_dir, held, entries, len(unreadable))


#: Records per IngestRuns call when sending (the RPC takes at most 500).
BATCH = 200


def batches(entries: list[dict[str, Any]]) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """(entries, IngestRuns ``records``) in batches of BATCH."""
    for start in range(0, len(entries), BATCH):
        batch = entries[start:start + BATCH]
        yield batch, [{"record": e["record"], "source": e.get("source") or "spool"} for e in batch]


def tally(batch: list[dict[str, Any]], results: list[dict[str, Any]], counts: dict[str, int],
          refused: list[dict[str, Any]]) -> None:
    """Count IngestRuns' outcomes for ``batch`` into ``counts``; the ``rejected`` entries go to ``refused``."""
    for entry, result in zip(batch, results, strict=True):
        outcome = str(result.get("outcome"))
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "rejected":
            refused.append({**entry, "error": result.get("error")})


async def send_spool(state_dir: Path, ingest_many: Any) -> dict[str, int]:
    """The daemon's sender: claim the spool and ingest it with ``ingest_many`` (MemoryService.ingest_runs:
    ``[{record, source}]`` → ``{"results": [...]}``). Returns counts by outcome (and ``unreadable`` lines)."""
    import trio

    taken = await trio.to_thread.run_sync(claim, state_dir)
    if taken is None:
        return {}
    counts: dict[str, int] = {}
    refused: list[dict[str, Any]] = []
    sent = 0
    try:
        for batch, records in batches(taken.entries):
            tally(batch, (await ingest_many(records))["results"], counts, refused)
            sent += len(batch)
    finally:
        # Whatever was not confirmed goes back: sending it again is harmless (ingest is idempotent).
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: taken.done(undelivered=taken.entries[sent:], refused=refused))
    if taken.unreadable:
        counts["unreadable"] = taken.unreadable
    return counts


# ---------------------------------------------------------------------------------------- revocations


def queue_revocation(state_dir: Path, harness: str, run_id: str, queued_at: str) -> Path:
    """Keep a run's token revocation for the daemon's next start (`uninstall` with the daemon down: the
    resident's long-lived token must not stay valid until someone runs uninstall again)."""
    _private_dir(state_dir)
    path = state_dir / REVOCATIONS
    _write_lines(path, [{"harness": harness, "run_id": run_id, "queued_at": queued_at}])
    return path


def queued_revocations(state_dir: Path) -> list[dict[str, str]]:
    """The revocations waiting in the queue (a torn or foreign line is skipped)."""
    try:
        with open(state_dir / REVOCATIONS, encoding="utf-8", errors="replace") as fh:
            return [e for line in fh if line.strip() and (e := _entry(line)) is not None]
    except FileNotFoundError:
        return []


def settle_revocations(state_dir: Path, applied: list[dict[str, str]]) -> int:
    """Drop ``applied`` revocations from the queue (under its lock: `uninstall` may be adding one now);
    the file goes when nothing is left. Revoking twice is harmless, so a crash in between loses nothing.
    Returns how many are left."""
    path = state_dir / REVOCATIONS
    if not path.exists():
        return 0
    with _locked_append(path) as fd:
        with open(path, encoding="utf-8", errors="replace") as fh:
            entries = [e for line in fh if line.strip() and (e := _entry(line)) is not None]
        left = [e for e in entries if e not in applied]
        os.ftruncate(fd, 0)
        if left:
            os.write(fd, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in left).encode("utf-8"))
        os.fsync(fd)
        if not left:
            path.unlink(missing_ok=True)
    return len(left)


def _entry(line: str) -> dict[str, str] | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("harness"), str) or not isinstance(doc.get("run_id"), str):
        return None
    return {"harness": doc["harness"], "run_id": doc["run_id"], "queued_at": str(doc.get("queued_at", ""))}
