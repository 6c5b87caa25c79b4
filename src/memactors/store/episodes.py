"""Episodes and their index rows as the store counts them. The index actor (``actors.index``) still
writes and reads them with its own SQL; it moves here as that actor's SQL leaves it."""

from __future__ import annotations

from . import Db


def episode_counts(db: Db, provider: str) -> dict[str, int]:
    """Episodes stored (forgotten ones are tombstones), live episodes, and `provider`'s live index rows."""
    row = db.execute("SELECT count(*), count(*) FILTER (WHERE forgotten_at IS NULL) FROM episodes").fetchone()
    idx = db.execute("SELECT count(*) FROM memory_index WHERE provider = ? AND forgotten_at IS NULL",
                     [provider]).fetchone()
    return {"episodes": row[0] or 0, "live_episodes": row[1] or 0, "indexed_ids": idx[0] or 0}
