"""Facts (the contract is docs/contracts.md, "Facts"): scoped, scored text the fleet maintains, and the full-text search over them
(`db.dialect`'s, one per engine). Synchronous functions over a `Db` a `Store.write` / `Store.read` hands
them, so a caller composes several in one transaction:

    fact = await store.write(lambda db: facts.add_fact(db, scope=s, text=t, confidence=0.8, now=now))

Every listing has an explicit ORDER BY ending in a unique key, so the same store and the same `now` give
the same answer (REQ-14 asks byte-identical briefings). Times are stored as `store.iso()` text and returned
as that text: it sorts lexically.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

import attrs

from ..errors import InvalidArgument, MemactorsError
from . import Db
from ._feeds import at_text, checked_limit, clean

FactStatus = Literal["live", "suspect", "retired"]

_FACT_ID = re.compile(r"^f_[0-9A-Za-z_]{1,64}$")


class UnknownFact(MemactorsError):
    """Raised when a fact id names no fact in the daemon's store."""

    code = "NOT_FOUND"


@attrs.frozen
class Fact:
    """A fact: scoped, scored text the fleet maintains; only the daemon's own rows become facts."""

    id: str
    scope: str
    text: str
    confidence: float
    status: FactStatus
    created_at: str
    updated_at: str


def _fact(row: Any) -> Fact:
    fid, scope, text, confidence, status, created_at, updated_at = row
    return Fact(str(fid), str(scope), str(text), float(confidence), status, str(created_at), str(updated_at))


_FACT_COLS = "f.id, f.scope, f.text, f.confidence, f.status, f.created_at, f.updated_at"


def fact_id_for(scope: str, text: str) -> str:
    """`f_` + the first 12 hex digits of SHA-256 over `scope \\0 text` (UTF-8)."""
    return "f_" + hashlib.sha256(f"{scope}\0{text}".encode()).hexdigest()[:12]


def _check_scope(scope: str) -> None:
    if scope == "fleet":
        return
    if isinstance(scope, str) and scope.startswith("project:") and len(scope) > len("project:"):
        return
    raise InvalidArgument("scope must be 'fleet' or 'project:<repo>'", field="scope", value=scope)


def fact_status(status: str) -> FactStatus:
    """``status`` as a FactStatus; InvalidArgument naming the field for any other string (the RPC's
    AddFact passes what the operator typed)."""
    match status:
        case "live" | "suspect" | "retired":
            return status
    raise InvalidArgument("status must be live, suspect or retired", field="status", value=status)


def add_fact(
    db: Db,
    *,
    scope: str,
    text: str,
    confidence: float,
    status: FactStatus = "live",
    now: datetime,
    fact_id: str | None = None,
) -> Fact:
    """Add a fact, or update the one with the same id (scope, text, confidence, status; keeps created_at).

    The id is `fact_id_for(scope, text)` unless given. Raises InvalidArgument naming the field for a bad
    scope, empty text, a confidence outside 0..1 or an unknown status.
    """
    _check_scope(scope)
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument("text must be non-empty", field="text")
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not math.isfinite(confidence)
        or not 0.0 <= confidence <= 1.0
    ):
        raise InvalidArgument("confidence must be a number from 0 to 1", field="confidence", value=confidence)
    fact_status(status)
    scope, text = clean(scope), clean(text)
    fid = fact_id if fact_id is not None else fact_id_for(scope, text)
    if not _FACT_ID.match(fid):
        raise InvalidArgument("id must be f_ followed by letters, digits or _", field="id", value=fid)
    at = at_text(now)
    created_at = db.dialect.upsert_fact(db, fact_id=fid, scope=scope, text=text, confidence=float(confidence),
                                        status=status, at=at)
    return Fact(fid, scope, text, float(confidence), status, str(created_at), at)


def get_fact(db: Db, fact_id: str) -> Fact | None:
    """The fact with this id, or None."""
    row = db.execute(f"SELECT {_FACT_COLS} FROM facts f WHERE f.id = ?", [fact_id]).fetchone()
    return None if row is None else _fact(row)


def set_fact_status(db: Db, fact_id: str, status: FactStatus, now: datetime) -> Fact:
    """Move a fact to live, suspect or retired. Raises InvalidArgument (status) or UnknownFact."""
    fact_status(status)
    cur = db.execute(
        "UPDATE facts SET status = ?, updated_at = ? WHERE id = ?", [status, at_text(now), fact_id]
    )
    if cur.rowcount == 0:
        raise UnknownFact(fact=clean(fact_id)[:64])
    fact = get_fact(db, fact_id)
    assert fact is not None
    return fact


def search_facts(
    db: Db, *, query: str, scopes: Sequence[str], limit: int
) -> list[Fact]:
    """Live and suspect facts in `scopes` matching any word of `query` (REQ-12's facts section).

    Ordered by bm25 (best first), then confidence descending, then id. A query with no words returns
    the top live and suspect facts by confidence, then updated_at descending, then id.
    """
    limit = checked_limit(limit)
    scopes = list(dict.fromkeys(scopes))
    if limit == 0 or not scopes:
        return []
    marks = ", ".join("?" for _ in scopes)
    # No live or suspect fact in the scopes (a repository nobody taught yet): nothing to search. One
    # index seek (facts_by_scope), where the full-text query over every word of a recall's question
    # cost ~0.3 ms to find nothing.
    if db.execute(f"SELECT 1 FROM facts WHERE scope IN ({marks}) AND status IN ('live', 'suspect') LIMIT 1",
                  scopes).fetchone() is None:
        return []
    rows = db.dialect.search_facts(db, columns=_FACT_COLS, query=query, scopes=scopes, limit=limit)
    if rows is None:
        rows = db.execute(
            f"SELECT {_FACT_COLS} FROM facts f"
            f" WHERE f.status IN ('live', 'suspect') AND f.scope IN ({marks})"
            " ORDER BY f.confidence DESC, f.updated_at DESC, f.id LIMIT ?",
            [*scopes, limit],
        ).fetchall()
    return [_fact(r) for r in rows]


def top_facts(db: Db, *, scopes: Sequence[str], limit: int) -> list[Fact]:
    """Live facts in `scopes` by confidence descending, then updated_at descending, then id (REQ-14)."""
    limit = checked_limit(limit)
    scopes = list(dict.fromkeys(scopes))
    if limit == 0 or not scopes:
        return []
    marks = ", ".join("?" for _ in scopes)
    rows = db.execute(
        f"SELECT {_FACT_COLS} FROM facts f WHERE f.status = 'live' AND f.scope IN ({marks})"
        " ORDER BY f.confidence DESC, f.updated_at DESC, f.id LIMIT ?",
        [*scopes, limit],
    ).fetchall()
    return [_fact(r) for r in rows]


def count_facts(db: Db, *, scopes: Sequence[str], statuses: Iterable[str] = ("live",)) -> int:
    """How many facts in `scopes` have one of `statuses`; lets a briefing say how many it left out."""
    scopes = list(dict.fromkeys(scopes))
    wanted = list(dict.fromkeys(statuses))
    if not scopes or not wanted:
        return 0
    for s in wanted:
        fact_status(s)
    (n,) = db.execute(
        f"SELECT COUNT(*) FROM facts WHERE scope IN ({', '.join('?' for _ in scopes)})"
        f" AND status IN ({', '.join('?' for _ in wanted)})",
        [*scopes, *wanted],
    ).fetchone()
    return int(n)
