"""Live presence (docs/contracts.md, "Presence and collisions"): which agent sessions are on which repository, branch and paths now,
reported with a time to live, and the collisions between runs that follows from it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..errors import InvalidArgument
from . import Db
from ._feeds import at_text, clean, clean_opt, normalise_path, overlaps


@attrs.frozen
class Presence:
    """One live agent session on a repository, as last reported; expires unless reported again."""

    harness: str
    run_id: str
    session_id: str
    repo: str
    branch: str | None
    paths: tuple[str, ...]
    reported_at: str
    expires_at: str


@attrs.frozen
class Collision:
    """Two sessions of different runs on one repository whose branches match or whose paths overlap.

    `first` is the asking run's session when `collisions(for_run=...)` was used, else the lower of the
    two by (harness, run_id, session_id). `prospective` marks a collision-to-be: the asking run has no
    live presence yet, so `first` is a stand-in with session_id "" and no paths (see `collisions`).
    """

    first: Presence
    second: Presence
    same_branch: bool
    shared_paths: tuple[str, ...]
    prospective: bool = False


def report_presence(
    db: Db,
    *,
    harness: str,
    run_id: str,
    session_id: str,
    repo: str,
    branch: str | None,
    paths: Iterable[str],
    now: datetime,
    ttl_seconds: int = 300,
) -> Presence:
    """Record that a session is active on (repo, branch, paths) until now + ttl; replaces its last report."""
    for field, value in (("harness", harness), ("run_id", run_id), ("session_id", session_id), ("repo", repo)):
        if not value:
            raise InvalidArgument(f"{field} is required", field=field)
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
        raise InvalidArgument("ttl_seconds must be a positive integer", field="ttl_seconds", value=ttl_seconds)
    harness, run_id, session_id, repo = clean(harness), clean(run_id), clean(session_id), clean(repo)
    branch = clean_opt(branch)
    kept = tuple(sorted({p for p in (normalise_path(clean(p)) for p in paths) if p}))
    reported, expires = at_text(now), at_text(now + timedelta(seconds=ttl_seconds))
    db.execute(
        "INSERT INTO presence (harness, run_id, session_id, repo, branch, paths, reported_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (harness, run_id, session_id) DO UPDATE SET repo = excluded.repo,"
        " branch = excluded.branch, paths = excluded.paths, reported_at = excluded.reported_at,"
        " expires_at = excluded.expires_at",
        [harness, run_id, session_id, repo, branch, json.dumps(list(kept)), reported, expires],
    )
    return Presence(harness, run_id, session_id, repo, branch, kept, reported, expires)


def clear_presence(db: Db, *, harness: str, run_id: str) -> int:
    """Remove every session of a run (it ended); returns how many were removed."""
    cur = db.execute("DELETE FROM presence WHERE harness = ? AND run_id = ?", [clean(harness), clean(run_id)])
    return int(cur.rowcount)


def prune_presence(db: Db, *, now: datetime) -> int:
    """Delete expired presence rows; reads already ignore them, this only keeps the table small."""
    cur = db.execute("DELETE FROM presence WHERE expires_at <= ?", [at_text(now)])
    return int(cur.rowcount)


def _presence(row: Any) -> Presence:
    h, rid, sid, repo, branch, paths, reported, expires = row
    return Presence(
        str(h), str(rid), str(sid), str(repo), None if branch is None else str(branch),
        tuple(json.loads(str(paths))), str(reported), str(expires),
    )


def live_presence(db: Db, *, repo: str, now: datetime) -> list[Presence]:
    """Sessions on `repo` whose report has not expired at `now`, by harness, run_id, session_id."""
    rows = db.execute(
        "SELECT harness, run_id, session_id, repo, branch, paths, reported_at, expires_at FROM presence"
        " WHERE repo = ? AND expires_at > ? ORDER BY harness, run_id, session_id",
        [repo, at_text(now)],
    ).fetchall()
    return [_presence(r) for r in rows]


def _pair(a: Presence, b: Presence) -> Collision | None:
    same_branch = a.branch is not None and a.branch == b.branch
    shared = tuple(sorted(
        {p for p in a.paths if any(overlaps(p, q) for q in b.paths)}
        | {q for q in b.paths if any(overlaps(p, q) for p in a.paths)}
    ))
    if not same_branch and not shared:
        return None
    return Collision(a, b, same_branch, shared)


def collisions(
    db: Db,
    *,
    repo: str,
    now: datetime,
    for_run: tuple[str, str] | None = None,
    branch: str | None = None,
) -> list[Collision]:
    """Collisions among live sessions on `repo`: different runs, same branch or shared paths.

    Without `for_run`: every colliding pair once, `first` the lower by (harness, run_id, session_id),
    listed by (first, second). With `for_run = (harness, run_id)`: only pairs involving that run, with
    its session as `first`. If that run has no live session on `repo` yet (a briefing at spawn), the
    result is collisions-to-be: every live session of another run on `branch` (or, with `branch` None,
    on the repository at all), each paired with a stand-in for the asking run (session_id "", no
    paths, reported/expires at `now`) and `prospective` true. Sessions of one run never collide.
    """
    live = live_presence(db, repo=repo, now=now)
    out: list[Collision] = []
    if for_run is None:
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                if (a.harness, a.run_id) == (b.harness, b.run_id):
                    continue
                c = _pair(a, b)
                if c is not None:
                    out.append(c)
        return out
    mine = [p for p in live if (p.harness, p.run_id) == for_run]
    others = [p for p in live if (p.harness, p.run_id) != for_run]
    if mine:
        for a in mine:
            for b in others:
                c = _pair(a, b)
                if c is not None:
                    out.append(c)
        return out
    at = at_text(now)
    stand_in = Presence(for_run[0], for_run[1], "", repo, branch, (), at, at)
    for b in others:
        if branch is None or b.branch == branch:
            out.append(Collision(stand_in, b, branch is not None, (), prospective=True))
    return out
