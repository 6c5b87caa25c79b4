"""The per-run briefing cache (REQ-15, REQ-16): a run's briefing as first computed, served unchanged
until it is refreshed or dropped."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime

import attrs

from . import Db
from ._feeds import at_text


@attrs.frozen
class CachedBriefing:
    """A run's briefing as first computed, served unchanged until refreshed (REQ-15, REQ-16 respawn)."""

    harness: str
    run_id: str
    document: str
    doc_json: str
    items: Mapping[str, int]
    computed_at: str


def get_cached_briefing(db: Db, harness: str, run_id: str) -> CachedBriefing | None:
    """The run's cached briefing, or None if none was computed (or it was dropped)."""
    row = db.execute(
        "SELECT document, doc_json, items, computed_at FROM briefings WHERE harness = ? AND run_id = ?",
        [harness, run_id],
    ).fetchone()
    if row is None:
        return None
    document, doc_json, items, computed_at = row
    return CachedBriefing(harness, run_id, str(document), str(doc_json), json.loads(str(items)), str(computed_at))


def computed_at(db: Db, harness: str, run_id: str) -> str | None:
    """When the run's cached briefing was computed, or None (no cached briefing)."""
    row = db.execute("SELECT computed_at FROM briefings WHERE harness = ? AND run_id = ?",
                     [harness, run_id]).fetchone()
    return None if row is None else str(row[0])


def put_cached_briefing(
    db: Db,
    harness: str,
    run_id: str,
    document: str,
    doc_json: str,
    items: Mapping[str, int],
    now: datetime,
) -> CachedBriefing:
    """Store (or replace, on refresh) the run's briefing with its per-section item counts."""
    at = at_text(now)
    counts = {str(k): int(v) for k, v in sorted(items.items())}
    db.execute(
        "INSERT INTO briefings (harness, run_id, document, doc_json, items, computed_at)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (harness, run_id) DO UPDATE SET"
        " document = excluded.document, doc_json = excluded.doc_json, items = excluded.items,"
        " computed_at = excluded.computed_at",
        [harness, run_id, document, doc_json, json.dumps(counts), at],
    )
    return CachedBriefing(harness, run_id, document, doc_json, counts, at)


def drop_cached_briefing(db: Db, harness: str, run_id: str) -> bool:
    """Drop the run's cached briefing; returns whether there was one."""
    cur = db.execute("DELETE FROM briefings WHERE harness = ? AND run_id = ?", [harness, run_id])
    return cur.rowcount > 0
