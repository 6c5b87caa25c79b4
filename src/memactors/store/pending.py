"""The pending queue and tombstones (SPEC-0030 REQ-10, REQ-13 record side): the rows the retention actor
retries (`pending`: one per record or per (provider, provider id) forget), what forgetting an episode
writes, and the prune's deletes. Engine-neutral SQL over `Db` (`db.dialect` for row locks and
substring tests); the actor (``actors.retention``) decides when, this module says what is written.

A row's times are `store.iso()` text. A row is claimed by a daemon (`claimed_by`, `claimed_until`) while
its attempt runs, so daemons sharing one store try each due row once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..errors import UnknownEpisode
from ..redact import redact
from . import Db

#: `last_error`'s prefix on a record row set aside because its stored episode cannot be read. The row
#: keeps state `failed` (never retried, kept for the operator) and is counted as `record_quarantined`.
QUARANTINED = "quarantined: "


@attrs.frozen
class ForgetOutcome:
    episode_id: str
    forgotten_at: str
    ids: int
    forgotten: int
    pending: int
    failed: int
    body_deleted: bool


def queue(db: Db, kind: str, provider: str, episode_id: str, *, provider_id: str = "",
          now: str, due: str | None = None, claimer: str = "") -> None:
    """Queue a pending record or forget, due now. With `due`, the row is claimed by `claimer` (a
    daemon id) until then: the ingest path holds its fresh records for its own first attempt, and no
    retry loop — this daemon's or another's sharing the store — tries them meanwhile."""
    db.execute(
        "INSERT INTO pending (kind, provider, episode_id, provider_id, first_at, next_at, claimed_until, claimed_by)"
        " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
        [kind, provider, episode_id, provider_id, now, now, due, claimer if due else None],
    )


def release_records(db: Db, *, provider: str, episode_ids: Sequence[str], daemon_id: str, now: str) -> None:
    """Make the episodes' pending records this daemon holds back for its own first attempt (`queue`'s
    `due`) due at `now` and unclaimed: the attempt ran out of time, the retry loop takes them over."""
    for episode_id in episode_ids:
        db.execute(
            "UPDATE pending SET next_at = ?, claimed_until = NULL, claimed_by = NULL WHERE kind = 'record'"
            " AND provider = ? AND episode_id = ? AND state = 'pending' AND claimed_by = ?",
            [now, provider, episode_id, daemon_id])


def tombstone(db: Db, episode_id: str, now: str, *, claim: tuple[str, str] | None = None) -> bool:
    """Mark an episode and its index rows forgotten and queue their forgets; False if already forgotten.

    One transaction: from its commit on, REQ-9's filter drops every id of the episode. An episode with
    no index row has nothing to forget at a provider, so its body goes at once. With `claim` = (daemon
    id, until) the queued forgets are claimed by that daemon (it attempts them itself at once).
    """
    row = db.execute("SELECT forgotten_at FROM episodes WHERE episode_id = ?", [episode_id]).fetchone()
    if row is None:
        shown = redact(episode_id)[:64]  # a client's id: never echoed raw
        raise UnknownEpisode(f"no episode {shown}", episode=shown)
    if row[0] is not None:
        return False
    db.execute("UPDATE episodes SET forgotten_at = ? WHERE episode_id = ?", [now, episode_id])
    db.execute("UPDATE memory_index SET forgotten_at = ? WHERE episode_id = ? AND forgotten_at IS NULL",
               [now, episode_id])
    db.execute("DELETE FROM pending WHERE kind = 'record' AND episode_id = ?", [episode_id])
    ids = db.execute("SELECT provider, provider_id FROM memory_index WHERE episode_id = ?", [episode_id]).fetchall()
    claimer, until = claim or (None, None)
    for provider, provider_id in ids:
        db.execute(
            "INSERT INTO pending (kind, provider, episode_id, provider_id, first_at, next_at, claimed_until,"
            " claimed_by) VALUES ('forget', ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [provider, episode_id, provider_id, now, now, until, claimer])
    delete_body_if_done(db, episode_id)
    return True


def delete_body_if_done(db: Db, episode_id: str) -> bool:
    """Delete a forgotten episode's stored body once no forget of it is pending any more."""
    waiting = db.execute("SELECT 1 FROM pending WHERE kind = 'forget' AND episode_id = ? AND state = 'pending'"
                         " LIMIT 1", [episode_id]).fetchone()
    if waiting is not None:
        return False
    row = db.execute("SELECT body_id FROM episodes WHERE episode_id = ? AND forgotten_at IS NOT NULL",
                     [episode_id]).fetchone()
    if row is not None and row[0] is not None:
        db.execute("UPDATE episodes SET body_id = NULL WHERE episode_id = ?", [episode_id])
        db.execute("DELETE FROM episode_bodies WHERE id = ?", [row[0]])
    scrub_run(db, episode_id)
    return True


def prune_tombstones(db: Db, cutoff: str, batch: int) -> int:
    """Delete up to `batch` tombstones of episodes forgotten before `cutoff` whose forget is over: the body
    is gone and no forget of theirs is pending or failed (REQ-10: "the tombstone stays until every id is
    forgotten or failed"; a failed one stays, counted, for the operator). Their episode and index rows
    go; the run row stays for the graph (it keeps the run from being recorded again). An id a provider
    still answers afterwards has no index row, and REQ-9 drops it as unknown. Returns how many."""
    rows = db.execute(
        "SELECT e.episode_id FROM episodes e WHERE e.recorded_at < ? AND e.forgotten_at < ? AND e.body_id IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM pending p WHERE p.episode_id = e.episode_id) LIMIT ?",
        [cutoff, cutoff, batch]).fetchall()
    for (episode_id,) in rows:
        db.execute("DELETE FROM memory_index WHERE episode_id = ?", [episode_id])
        db.execute("DELETE FROM episodes WHERE episode_id = ?", [episode_id])
    return len(rows)


def scrub_run(db: Db, episode_id: str) -> None:
    """Remove the agent-written text a forgotten episode came from, wherever the daemon keeps a copy:
    the stored run record, whole (the run row itself, its ids, times, outcome and paths stay: they are
    what the graph knows, not what the agent wrote), and every cached briefing that showed the episode.
    The record's own row is deleted rather than emptied in place, so its page space is reused
    (migration 0008)."""
    row = db.execute("SELECT harness, run_id FROM episodes WHERE episode_id = ? AND forgotten_at IS NOT NULL",
                     [episode_id]).fetchone()
    if row is None:
        return
    run = db.execute("SELECT record_id FROM runs WHERE harness = ? AND run_id = ?", list(row)).fetchone()
    if run is not None and run[0] is not None:
        db.execute("UPDATE runs SET record_id = NULL WHERE harness = ? AND run_id = ?", list(row))
        db.execute("DELETE FROM run_records WHERE id = ?", [run[0]])
    db.execute(f"DELETE FROM briefings WHERE {db.dialect.contains('document')} OR {db.dialect.contains('doc_json')}",
               [episode_id, episode_id])


def forget_outcome(db: Db, episode_id: str) -> ForgetOutcome:
    row = db.execute("SELECT forgotten_at, body_id IS NULL FROM episodes WHERE episode_id = ?", [episode_id]).fetchone()
    ids = db.execute("SELECT count(*) FROM memory_index WHERE episode_id = ?", [episode_id]).fetchone()[0]
    states = dict(db.execute("SELECT state, count(*) FROM pending WHERE kind = 'forget' AND episode_id = ?"
                             " GROUP BY state", [episode_id]).fetchall())
    pending, failed = states.get("pending", 0), states.get("failed", 0)
    return ForgetOutcome(episode_id=episode_id, forgotten_at=row[0], ids=ids, forgotten=ids - pending - failed,
                         pending=pending, failed=failed, body_deleted=bool(row[1]))


def counts_by_state(db: Db) -> list[tuple[str, str, str, int]]:
    """(provider, kind, state, count) over the queue; a quarantined record row counts as `quarantined`."""
    rows = db.execute(
        "SELECT provider, kind, CASE WHEN state = 'failed' AND last_error LIKE ? THEN 'quarantined' ELSE state END"
        " AS st, count(*) FROM pending GROUP BY provider, kind, st", [QUARANTINED + "%"]).fetchall()
    return [(str(p), str(k), str(s), int(n)) for p, k, s, n in rows]


def claimed_forgets(db: Db, episode_id: str, daemon_id: str) -> list[tuple[str, str]]:
    """(provider id, provider) of the episode's pending forgets this daemon holds."""
    rows = db.execute(
        "SELECT provider_id, provider FROM pending WHERE kind = 'forget' AND episode_id = ?"
        " AND state = 'pending' AND claimed_by = ?", [episode_id, daemon_id]).fetchall()
    return [(str(pid), str(provider)) for pid, provider in rows]


def release_forgets(db: Db, episode_id: str, daemon_id: str) -> None:
    """Hand the episode's forgets this daemon holds back to whichever retry loop is first."""
    db.execute("UPDATE pending SET claimed_until = NULL, claimed_by = NULL WHERE kind = 'forget'"
               " AND episode_id = ? AND claimed_by = ?", [episode_id, daemon_id])


def release_claims(db: Db, daemon_id: str) -> None:
    """Release every claim this daemon id holds (its attempts died with a previous process)."""
    db.execute("UPDATE pending SET claimed_until = NULL, claimed_by = NULL WHERE claimed_by = ?", [daemon_id])


def expired_episodes(db: Db, cutoff: str, limit: int) -> list[str]:
    """Live episodes recorded before ``cutoff``, oldest first, at most ``limit``."""
    rows = db.execute("SELECT episode_id FROM episodes WHERE forgotten_at IS NULL AND recorded_at < ?"
                      " ORDER BY recorded_at LIMIT ?", [cutoff, limit]).fetchall()
    return [str(eid) for (eid,) in rows]


def _marks(values: Sequence[str]) -> str:
    return ",".join("?" * len(values))


def next_due_at(db: Db, reachable: Sequence[str], provider: str) -> str | None:
    """When the earliest pending row of `reachable` providers is due: its next_at, or the end of its claim
    when another attempt holds it. Record rows count only for the configured `provider`."""
    row = db.execute(
        f"SELECT min(CASE WHEN claimed_until > next_at THEN claimed_until ELSE next_at END) FROM pending"
        f" WHERE provider IN ({_marks(reachable)}) AND state = 'pending' AND (kind = 'forget' OR provider = ?)",
        [*reachable, provider]).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def claim_due(db: Db, *, reachable: Sequence[str], provider: str, now: str, until: str, daemon_id: str,
              limit: int) -> list[Any]:
    """Claim up to `limit` due rows for `daemon_id` until `until`, oldest next_at first, each record with its
    stored episode: (kind, episode id, provider id, provider, body, scope, trust class, forgotten_at).

    PostgreSQL: `FOR UPDATE SKIP LOCKED`, so claims that race skip each other's rows. A record row for
    another provider (the configuration changed) is not this daemon's to send."""
    rows = db.execute(
        f"SELECT p.kind, p.episode_id, p.provider_id, p.provider, b.body, e.scope, e.trust_class,"
        f" e.forgotten_at FROM pending p LEFT JOIN episodes e"
        f" ON p.kind = 'record' AND e.episode_id = p.episode_id LEFT JOIN episode_bodies b ON b.id = e.body_id"
        f" WHERE p.provider IN ({_marks(reachable)}) AND p.state = 'pending' AND p.next_at <= ?"
        f" AND (p.claimed_until IS NULL OR p.claimed_until <= ?)"
        f" AND (p.kind = 'forget' OR p.provider = ?) ORDER BY p.next_at LIMIT {int(limit)}"
        f"{db.dialect.skip_locked('p')}",
        [*reachable, now, now, provider]).fetchall()
    db.executemany(
        "UPDATE pending SET claimed_until = ?, claimed_by = ? WHERE kind = ? AND provider = ?"
        " AND episode_id = ? AND provider_id = ?",
        [(until, daemon_id, k, prov, e, p) for k, e, p, prov, *_ in rows])
    return rows


def make_due(db: Db, provider: str, now: str) -> None:
    """Every pending row of `provider` waiting out a backoff is due at `now`."""
    db.execute("UPDATE pending SET next_at = ? WHERE provider = ? AND state = 'pending' AND next_at > ?",
               [now, provider, now])


def stored_episode(db: Db, episode_id: str) -> tuple[str | None, str, str, str | None] | None:
    """(body, scope, trust class, forgotten_at) of an episode, or None when there is none."""
    row = db.execute(
        "SELECT b.body, e.scope, e.trust_class, e.forgotten_at FROM episodes e"
        " LEFT JOIN episode_bodies b ON b.id = e.body_id WHERE e.episode_id = ?", [episode_id]).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def drop_record(db: Db, provider: str, episode_id: str) -> None:
    """Drop the episode's record row for `provider` (the episode is gone or forgotten)."""
    db.execute("DELETE FROM pending WHERE kind = 'record' AND provider = ? AND episode_id = ?",
               [provider, episode_id])


def quarantine(db: Db, *, kind: str, provider: str, episode_id: str, provider_id: str, why: str) -> bool:
    """Set a row aside as failed with `QUARANTINED` + why, unclaimed; False when the row is gone."""
    return db.execute(
        "UPDATE pending SET state = 'failed', last_error = ?, claimed_until = NULL, claimed_by = NULL"
        " WHERE kind = ? AND provider = ? AND episode_id = ? AND provider_id = ? RETURNING 1",
        [QUARANTINED + why, kind, provider, episode_id, provider_id]).fetchone() is not None


def forget_done(db: Db, *, provider: str, episode_id: str, provider_id: str) -> bool:
    """A provider forgot an id: drop its row, and the episode's body once no forget of it is pending
    (returns whether the body went)."""
    db.execute("DELETE FROM pending WHERE kind = 'forget' AND provider = ? AND episode_id = ?"
               " AND provider_id = ?", [provider, episode_id, provider_id])
    return delete_body_if_done(db, episode_id)


def attempts_so_far(db: Db, *, kind: str, provider: str, episode_id: str,
                    provider_id: str) -> tuple[int, str] | None:
    """(attempts, first_at) of a row, or None when it is gone."""
    row = db.execute(
        "SELECT attempts, first_at FROM pending WHERE kind = ? AND provider = ? AND episode_id = ?"
        " AND provider_id = ?", [kind, provider, episode_id, provider_id]).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def first_pending_at(db: Db, provider: str) -> dict[str, str | None]:
    """{kind: first_at of its oldest pending row} for `provider`: how long the oldest record and forget
    have waited (doctor)."""
    rows = db.execute("SELECT kind, min(first_at) FROM pending WHERE provider = ? AND state = 'pending'"
                      " GROUP BY kind", [provider]).fetchall()
    return {str(kind): None if first is None else str(first) for kind, first in rows}


def reschedule(db: Db, *, kind: str, provider: str, episode_id: str, provider_id: str, attempts: int,
               next_at: str, state: str, error: str) -> None:
    """Write a failed attempt's outcome on its row (unclaimed): attempts, when next, pending or failed."""
    db.execute(
        "UPDATE pending SET attempts = ?, next_at = ?, state = ?, last_error = ?, claimed_until = NULL,"
        " claimed_by = NULL WHERE kind = ? AND provider = ? AND episode_id = ? AND provider_id = ?",
        [attempts, next_at, state, error, kind, provider, episode_id, provider_id])
