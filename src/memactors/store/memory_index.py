"""The memory index (SPEC-0030 REQ-9, REQ-10): which provider ids stand for which stored episode, under
the scope the daemon stored the episode with. It is the only scope memactors trusts: an item a
provider returns is kept only if its id has a live row here (the filter is ``actors.index``'s
`filter_items`; this module says what it reads).

Engine-neutral SQL over `Db`, run through `Store.write` / `Store.read`. A row is written when a
provider acknowledged a record (`add_index_rows`) and marked forgotten with its episode
(``pending.tombstone``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import Db
from .pending import queue

#: Provider ids looked up per statement: well under SQLite's bound on host parameters.
_CHUNK = 500


def add_index_rows(db: Db, *, provider: str, episode_id: str, ids: Sequence[str],
                   scope: str, now: str) -> bool:
    """Index every provider id for the episode under the episode's own (stored) scope, and clear the pending record.

    `scope` is ignored: the stored episode's scope is the only one trusted. Ids of an episode forgotten
    while its record was in flight are indexed as forgotten and queued for memory_forget (REQ-10):
    returns True when it queued such forgets (the retry loop has work), else False.
    """
    row = db.execute("SELECT scope, forgotten_at FROM episodes WHERE episode_id = ?", [episode_id]).fetchone()
    if row is None:
        return False
    stored_scope, forgotten_at = row
    for pid in ids:
        db.execute(
            "INSERT INTO memory_index (provider, provider_id, episode_id, scope, recorded_at, forgotten_at)"
            " VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
            [provider, pid, episode_id, stored_scope, now, forgotten_at],
        )
        if forgotten_at is not None:
            queue(db, "forget", provider, episode_id, provider_id=pid, now=now)
    db.execute("DELETE FROM pending WHERE kind = 'record' AND provider = ? AND episode_id = ?", [provider, episode_id])
    return forgotten_at is not None and bool(ids)


def provider_ids(db: Db, episode_id: str) -> tuple[tuple[str, str, str | None], ...]:
    """(provider, provider id, forgotten_at) of every index row of the episode, by provider and id."""
    rows = db.execute("SELECT provider, provider_id, forgotten_at FROM memory_index WHERE episode_id = ?"
                      " ORDER BY provider, provider_id", [episode_id]).fetchall()
    return tuple((str(p), str(pid), None if f is None else str(f)) for p, pid, f in rows)


def index_rows(db: Db, provider: str, ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """The index and episode rows of every provider id of `provider` in `ids`, in one query per 500 ids
    (REQ-9's re-check, not one per item): {provider id: (scope, index forgotten_at, episode id, run id,
    harness, repo, branch, outcome, started_at, body or None, episode forgotten_at, trust class)}. An
    id without an index row is not in it."""
    wanted = list(dict.fromkeys(ids))
    out: dict[str, tuple[Any, ...]] = {}
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start:start + _CHUNK]
        for row in db.execute(
            "SELECT i.provider_id, i.scope, i.forgotten_at, e.episode_id, e.run_id, e.harness, e.repo, e.branch,"
            " e.outcome, e.started_at, b.body, e.forgotten_at, e.trust_class FROM memory_index i"
            " JOIN episodes e ON e.episode_id = i.episode_id LEFT JOIN episode_bodies b ON b.id = e.body_id"
            f" WHERE i.provider = ? AND i.provider_id IN ({','.join('?' * len(chunk))})",
            [provider, *chunk],
        ).fetchall():
            out[row[0]] = tuple(row[1:])
    return out
