"""Stored episodes (SPEC-0030 REQ-5, REQ-6): each episode's row and its one stored copy, the REQ-5 body
in `episode_bodies` (its text rendering is rendered from the body where it is needed, `stored_copy`),
and the operator's reads of them: one episode with its index rows, a keyset-paged listing, the
repositories episodes are stored under, the counts `status` shows.

Engine-neutral SQL over `Db`, run by the index actor (``actors.index``), the service and the start-up
repair (``agents.excerpt_repair``) through `Store.write` / `Store.read`. An episode is written once and
never changed, except by forgetting it (``pending.tombstone``) and by a start-up repair of its body
(`replace_body`).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import attrs
import cattrs

from .._limits import MAX_EPISODE_BODY_BYTES
from .._wire import episode_from_dict, episode_json
from ..episode import render_text
from ..errors import InvalidArgument
from ..models import Episode
from ..repo import scope_for
from . import Db, insert_with_body
from .memory_index import provider_ids
from .pending import queue


@attrs.frozen
class EpisodeRow:
    episode_id: str
    harness: str
    run_id: str
    repo: str
    branch: str
    scope: str
    outcome: str
    started_at: str
    recorded_at: str
    forgotten_at: str | None
    episode: Episode | None
    text: str | None
    index: tuple[tuple[str, str, str | None], ...] = ()  # (provider, provider_id, forgotten_at)


@attrs.frozen
class EpisodePage:
    rows: tuple[EpisodeRow, ...]
    total: int
    next_cursor: str | None


def store_episode(db: Db, episode: Episode, *, provider: str, now: str,
                  due: str | None = None, claimer: str = "") -> bool:
    """Store the episode copy (its row, and its REQ-5 body in `episode_bodies`) and queue its record to
    `provider` (first due at `due`, default now; `pending.queue`). Idempotent: False if it was already
    stored."""
    existing = db.execute("SELECT 1 FROM episodes WHERE episode_id = ?", [episode.episode_id]).fetchone()
    if existing is not None:
        return False
    if not insert_with_body(
            db, "episode_bodies", "body", episode_json(episode),
            "INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
            " started_at, recorded_at, body_id) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING 1",
            [episode.episode_id, episode.harness, episode.run_id, episode.repo, episode.branch, episode.scope,
             episode.trust_class, episode.outcome, episode.started_at, now]):
        return False  # stored meanwhile by another daemon sharing the store
    queue(db, "record", provider, episode.episode_id, now=now, due=due, claimer=claimer)
    return True


def stored_copy(body: str) -> tuple[dict[str, Any], str]:
    """A stored body (REQ-5 JSON) and its text rendering, as memory_record_episode sends them: the
    rendering is a pure function of the episode (byte-identical for identical episodes), so the store
    keeps the body alone."""
    episode = json.loads(body)
    return episode, render_text(episode_from_dict(episode))


#: An episode's row with its body (NULL once forgotten), for `_row`.
EPISODE_ROWS = "SELECT e.*, b.body FROM episodes e LEFT JOIN episode_bodies b ON b.id = e.body_id"


def _readable(body: str) -> Episode | None:
    """The stored episode, or None for a body that is not one or is past MAX_EPISODE_BODY_BYTES (a
    damaged row, or one an older `store import` let in: its pending record is quarantined): listed
    without its text, never an INTERNAL or an answer past the RPC's frame limit."""
    if len(body) > MAX_EPISODE_BODY_BYTES:  # (an episode this daemon assembles is a few KiB)
        return None
    try:
        return episode_from_dict(json.loads(body))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, cattrs.BaseValidationError):
        return None


def _row(db: Db, r: dict[str, Any], *, with_index: bool) -> EpisodeRow:
    index = provider_ids(db, r["episode_id"]) if with_index else ()
    episode = _readable(r["body"]) if r["body"] else None
    return EpisodeRow(
        episode_id=r["episode_id"], harness=r["harness"], run_id=r["run_id"], repo=r["repo"], branch=r["branch"],
        scope=r["scope"], outcome=r["outcome"], started_at=r["started_at"], recorded_at=r["recorded_at"],
        forgotten_at=r["forgotten_at"], episode=episode,
        text=render_text(episode) if episode is not None else None, index=index,
    )


def get_episode(db: Db, episode_id: str) -> EpisodeRow | None:
    """One stored episode with its index rows, or None."""
    rows = list(db.query(EPISODE_ROWS + " WHERE episode_id = ?", [episode_id]))
    return _row(db, rows[0], with_index=True) if rows else None


def encode_cursor(started_at: str, episode_id: str) -> str:
    """The opaque next-page cursor of ListEpisodes: the last row's (started_at, episode_id)."""
    raw = json.dumps([started_at, episode_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    """Raises InvalidArgument naming `after` for a cursor ListEpisodes did not hand out."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        started_at, episode_id = json.loads(raw)
        if not isinstance(started_at, str) or not isinstance(episode_id, str):
            raise ValueError
    except (ValueError, TypeError, binascii.Error):
        raise InvalidArgument("after is not a cursor printed by memory episodes", field="after") from None
    return started_at, episode_id


def list_episodes(db: Db, *, harness: str | None = None, repo: str | None = None,
                  since: str | None = None, limit: int = 100, after: str | None = None,
                  include_forgotten: bool = False, outcome: str | None = None,
                  paths: tuple[str, ...] = (), run_id: str | None = None) -> EpisodePage:
    """One page, newest first (by when the run started), keyset-paged on (started_at DESC, episode_id):
    `after` is the cursor of the previous page's last row, so pages stay stable while episodes are
    added. `total` counts every row the filters match (all pages). `outcome` keeps one run outcome;
    `paths` keeps the episodes whose run touched any of them (the runs' `run_paths`)."""
    given = [(clause, value) for clause, value in (("run_id = ?", run_id), ("outcome = ?", outcome),
                                                   ("harness = ?", harness), ("repo = ?", repo),
                                                   ("started_at >= ?", since)) if value]
    where: list[str] = [clause for clause, _ in given]
    params: list[Any] = [value for _, value in given]
    if paths:
        where.append("EXISTS (SELECT 1 FROM run_paths p WHERE p.harness = e.harness AND p.run_id = e.run_id"
                     f" AND p.path IN ({','.join('?' * len(paths))}))")
        params += list(paths)
    if not include_forgotten:
        where.append("forgotten_at IS NULL")
    filters = " WHERE " + " AND ".join(where) if where else ""
    total = int(db.execute("SELECT count(*) FROM episodes e" + filters, params).fetchone()[0])
    page_where, page_params = list(where), list(params)
    if after:
        started_at, episode_id = decode_cursor(after)
        page_where.append("(started_at < ? OR (started_at = ? AND episode_id > ?))")
        page_params += [started_at, started_at, episode_id]
    sql = EPISODE_ROWS + (" WHERE " + " AND ".join(page_where) if page_where else "")
    sql += " ORDER BY started_at DESC, episode_id LIMIT ?"
    rows = [_row(db, r, with_index=False) for r in db.query(sql, [*page_params, limit + 1])]
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = encode_cursor(rows[-1].started_at, rows[-1].episode_id) if more and rows else None
    return EpisodePage(rows=tuple(rows), total=total, next_cursor=cursor)


def known_repos(db: Db) -> list[str]:
    """Every repository key that has an episode (live or forgotten), sorted."""
    return [r[0] for r in db.execute("SELECT DISTINCT repo FROM episodes WHERE repo IS NOT NULL ORDER BY repo")]


def is_known_repo(db: Db, key: str) -> bool:
    """Whether an episode (live or forgotten) is stored under repository `key`: one index seek (a
    repository's scope is derived from its key), where `known_repos` reads every episode."""
    return db.execute("SELECT 1 FROM episodes WHERE scope = ? AND repo = ? LIMIT 1",
                      [scope_for(key), key]).fetchone() is not None


def episode_counts(db: Db, provider: str) -> dict[str, int]:
    """Episodes stored (forgotten ones are tombstones), live episodes, and `provider`'s live index rows."""
    row = db.execute("SELECT count(*), count(*) FILTER (WHERE forgotten_at IS NULL) FROM episodes").fetchone()
    idx = db.execute("SELECT count(*) FROM memory_index WHERE provider = ? AND forgotten_at IS NULL",
                     [provider]).fetchone()
    return {"episodes": row[0] or 0, "live_episodes": row[1] or 0, "indexed_ids": idx[0] or 0}


# -- the start-up repair of a body (agents.excerpt_repair) ------------------------------------------------


def live_bodies_containing(db: Db, text: str) -> list[tuple[str, str, int, str]]:
    """(harness, run_id, body id, body) of every live episode whose stored body contains `text`."""
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = db.execute(
        "SELECT e.harness, e.run_id, b.id, b.body FROM episodes e JOIN episode_bodies b ON b.id = e.body_id"
        " WHERE e.forgotten_at IS NULL AND b.body LIKE ? ESCAPE '\\'", [pattern]).fetchall()
    return [(str(h), str(r), int(i), str(b)) for h, r, i, b in rows]


def replace_body(db: Db, body_id: int, body: dict[str, Any]) -> None:
    """Write an episode's repaired REQ-5 body in place of its stored one."""
    db.execute("UPDATE episode_bodies SET body = ? WHERE id = ?",
               [json.dumps(body, ensure_ascii=False, separators=(",", ":")), body_id])
