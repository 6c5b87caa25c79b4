"""Run tokens (caller identity; docs/contracts.md, "Caller identity"): the bearer token a run presents to the gateway, minted per
run, stored only as its SHA-256, expired at the run's end plus a grace, revoked when it is gone."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

import attrs

from ..errors import InvalidArgument
from . import Db
from ._feeds import at_text, clean


@attrs.frozen
class Caller:
    """Who presented a run token to the gateway."""

    harness: str
    run_id: str
    workdir: str


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint_run_token(db: Db, *, harness: str, run_id: str, workdir: str, now: datetime,
                   expires_at: datetime | None = None) -> str:
    """Mint a bearer token for a run; only its SHA-256 is stored. Returns the token.

    ``expires_at`` None: the token lives until revoked; otherwise it resolves to nobody from then on.
    """
    for field, value in (("harness", harness), ("run_id", run_id)):
        if not value:
            raise InvalidArgument(f"{field} is required", field=field)
    harness, run_id, workdir = clean(harness), clean(run_id), clean(workdir)
    token = secrets.token_urlsafe(32)
    db.execute(
        "INSERT INTO run_callers (token_sha256, harness, run_id, workdir, created_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [_sha256(token), harness, run_id, workdir, at_text(now), None if expires_at is None else at_text(expires_at)],
    )
    return token


def resolve_run_token(db: Db, token: str, now: datetime | None = None) -> Caller | None:
    """The run a token was minted for, or None for an empty, unknown or (at ``now``) expired token."""
    if not token:
        return None
    row = db.execute(
        "SELECT harness, run_id, workdir, expires_at FROM run_callers WHERE token_sha256 = ?", [_sha256(token)]
    ).fetchone()
    if row is None or (now is not None and row[3] is not None and str(row[3]) <= at_text(now)):
        return None
    return Caller(str(row[0]), str(row[1]), str(row[2]))


def expire_run_tokens(db: Db, *, harness: str, run_id: str, at: datetime) -> int:
    """Make every token of a run expire at ``at`` (its end plus a grace); returns how many."""
    cur = db.execute("UPDATE run_callers SET expires_at = ? WHERE harness = ? AND run_id = ?"
                     " AND (expires_at IS NULL OR expires_at > ?)", [at_text(at), harness, run_id, at_text(at)])
    return int(cur.rowcount)


def resident_tokens(db: Db) -> list[tuple[Any, ...]]:
    """One row per resident run (run id ``resident-…``) that holds tokens: (harness, run_id, workdir,
    first created_at, last expires_at), by harness and run id."""
    return [tuple(r) for r in db.execute(
        "SELECT harness, run_id, max(workdir), min(created_at), max(expires_at) FROM run_callers"
        " WHERE run_id LIKE 'resident-%' GROUP BY harness, run_id ORDER BY harness, run_id").fetchall()]


def revoke_run_tokens(db: Db, *, harness: str, run_id: str) -> int:
    """Forget every token of a run (it ended); returns how many were revoked."""
    cur = db.execute("DELETE FROM run_callers WHERE harness = ? AND run_id = ?", [clean(harness), clean(run_id)])
    return int(cur.rowcount)
