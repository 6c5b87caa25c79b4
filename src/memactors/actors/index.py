"""The index actor's data: stored episode copies, index rows, and REQ-9's scope filter.

The indexed scope is the only scope memactors trusts. `filter_items` is the single choke point every
read path (recall, briefing, operator recall) sends provider items through: an item survives only if its
id has a live index row for the configured provider whose scope the caller may see, and its provenance
is rebuilt from the daemon's own episode row. Only text and score come from the provider.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import cattrs
import trio

from .._limits import MAX_EPISODE_BODY_BYTES
from .._wire import converter, episode_from_dict, episode_json, episode_to_dict
from ..contract import RecallItem
from ..documents import gist
from ..episode import episode_id_for, is_stored, render_text
from ..errors import InvalidArgument
from ..models import Episode, RunRecord
from ..redact import redact_obj
from ..repo import scope_for
from ..store import Db, Store, WallClock, iso
from .kernel import Ask, open_mailbox, serve

#: REQ-9's drop reasons, exactly (REQ-21's ``reason`` label). An item served with the daemon's own text
#: is not dropped: `Filtered.replaced` counts those.
DROP_REASONS = ("unknown_id", "forgotten", "scope", "invalid")


@attrs.frozen
class Provenance:
    """Who, where and how an episode came to be — only from the daemon's episode row."""

    episode_id: str
    run_id: str
    harness: str
    adapter: str
    model: str
    repo: str
    branch: str
    outcome: str
    started_at: str
    scope: str
    trust_class: str


@attrs.frozen
class KeptItem:
    provider_id: str
    text: str
    score: float | None
    provenance: Provenance
    #: The daemon's stored episode (REQ-5 body), parsed once by the re-check: what a reader judges it by
    #: (a briefing leaves empty runs out) without reading it again.
    episode: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen
class Filtered:
    kept: tuple[KeptItem, ...]
    #: (reason, count), reasons from DROP_REASONS (REQ-9's four)
    dropped: tuple[tuple[str, int], ...]
    #: Kept items served with the daemon's own text of their episode in place of the provider's
    #: (not drawn from it): kept, so not a drop; counted in a series of their own.
    replaced: int = 0


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
class Stored:
    """What RecordRun wrote: whether the run was new, and the episode it stored (None if none was new)."""

    run_new: bool
    episode_new: bool


def store_run(db: Db, record: RunRecord, *, repo: str | None, branch: str | None,
              paths: Iterable[str], now: str, clean: bool = False) -> bool:
    """Keep the run record (redacted, prompt dropped) and the paths it edited, for the graph.

    A closed run is kept once: the first record stored for (harness, run_id) wins and a later one is
    ignored (False), so an episode never changes, nor its scope, once recorded (REQ-6).
    """
    raw = converter.unstructure(record)
    raw.pop("prompt", None)
    # Clean already (the ingest path's `stored_record`, or a caller that says so): redact each string once,
    # at the boundary (issue 11).
    if db.execute("SELECT 1 FROM runs WHERE harness = ? AND run_id = ?", [record.harness, record.run_id]).fetchone():
        return False
    safe = raw if clean or is_stored(record) else redact_obj(raw)
    (record_id,) = db.execute("INSERT INTO run_records (record) VALUES (?) RETURNING id",
                              [record_json(safe)]).fetchone()
    inserted = db.execute(
        "INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
        " repo, branch, record_id, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING 1",
        [record.harness, record.run_id, record.adapter, record.started_at, record.ended_at, record.outcome,
         record.reason, record.duration_ms, repo, branch, record_id, now],
    ).fetchone()
    if inserted is None:
        # Another daemon sharing the store committed the same run between the check above and this
        # insert (two hosts ingesting one run): theirs is the first record; this one is a duplicate.
        db.execute("DELETE FROM run_records WHERE id = ?", [record_id])
        return False
    if repo:
        for path in sorted(set(paths)):
            db.execute("INSERT INTO run_paths (harness, run_id, repo, path) VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
                       [record.harness, record.run_id, repo, path])
    return True


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_nulls(v) for v in value]
    return value


def record_json(raw: dict[str, Any]) -> str:
    """The stored form of a (redacted) run record: compact JSON without its null fields (each has a
    default in the model, so `load_run_record` gives back the same record) — ~15 % of the stored record."""
    return json.dumps(_without_nulls(raw), sort_keys=True, separators=(",", ":"))


def record_run(db: Db, m: RecordRun, now: str, claimer: str = "") -> Stored:
    """`RecordRun`'s writes (in the caller's transaction)."""
    if not store_run(db, m.record, repo=m.repo, branch=m.branch, paths=m.paths, now=now, clean=m.clean):
        return Stored(run_new=False, episode_new=False)
    if m.episode is None or m.text is None:
        return Stored(run_new=True, episode_new=False)
    return Stored(run_new=True, episode_new=store_episode(db, m.episode, provider=m.provider, now=now,
                                                          due=m.record_after, claimer=claimer))


def record_runs(db: Db, runs: Sequence[RecordRun], now: str, claimer: str = "") -> tuple[Stored | Exception, ...]:
    """Many `record_run`s in the caller's transaction, each in its own savepoint (a failure rolls back
    that run alone and is returned in its place)."""
    out: list[Stored | Exception] = []
    for m in runs:
        db.execute("SAVEPOINT record_run")
        try:
            out.append(record_run(db, m, now, claimer))
        except Exception as exc:  # ok: this run's writes roll back; the others stay
            db.execute("ROLLBACK TO SAVEPOINT record_run")
            if db.dialect.retryable(exc):
                raise  # a deadlock with another daemon: the store runs the whole write again
            out.append(exc)
        db.execute("RELEASE SAVEPOINT record_run")
    return tuple(out)


def stored_runs(db: Db, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    """The runs of `keys` the store holds: {(harness, run_id): its episode id, or None without one}."""
    out: dict[tuple[str, str], str | None] = {}
    for harness, run_id in dict.fromkeys(keys):
        row = db.execute("SELECT started_at FROM runs WHERE harness = ? AND run_id = ?", [harness, run_id]).fetchone()
        if row is None:
            continue
        episode_id = episode_id_for(harness, run_id, row[0])
        known = db.execute("SELECT 1 FROM episodes WHERE episode_id = ?", [episode_id]).fetchone()
        out[(harness, run_id)] = episode_id if known else None
    return out


def sessions_recorded(db: Db, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    """Of ``keys`` ((adapter, run id): an agent's session, whose id the agent made unique), those the store
    holds under any harness: {key: its episode id, or None without one}. For an import, which must not
    record a second time a session a resident's hook recorded under the resident's harness. Read through
    the ``runs_by_session`` index on (adapter, run_id) (store migrations 0013 SQLite, 0006 PostgreSQL)."""
    out: dict[tuple[str, str], str | None] = {}
    wanted = set(keys)
    for adapter in sorted({a for a, _ in wanted}):
        ids = sorted(r for a, r in wanted if a == adapter)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(f"SELECT harness, run_id, started_at FROM runs WHERE adapter = ? AND run_id IN ({marks})"
                              " ORDER BY ingested_at", [adapter, *chunk]).fetchall()
            for harness, run_id, started_at in rows:
                if (adapter, run_id) in out:
                    continue
                episode_id = episode_id_for(harness, run_id, started_at)
                known = db.execute("SELECT 1 FROM episodes WHERE episode_id = ?", [episode_id]).fetchone()
                out[(adapter, run_id)] = episode_id if known else None
    return out


def store_episode(db: Db, episode: Episode, *, provider: str, now: str,
                  due: str | None = None, claimer: str = "") -> bool:
    """Store the episode copy (its row, and its REQ-5 body in `episode_bodies`; the text rendering is
    rendered from the body where needed, `stored_copy`) and queue its record to `provider` (first due at `due`, default now).
    Idempotent: False if it was already stored."""
    existing = db.execute("SELECT 1 FROM episodes WHERE episode_id = ?", [episode.episode_id]).fetchone()
    if existing is not None:
        return False
    (body_id,) = db.execute("INSERT INTO episode_bodies (body) VALUES (?) RETURNING id",
                            [episode_json(episode)]).fetchone()
    inserted = db.execute(
        "INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome, started_at,"
        " recorded_at, body_id) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING 1",
        [episode.episode_id, episode.harness, episode.run_id, episode.repo, episode.branch, episode.scope,
         episode.trust_class, episode.outcome, episode.started_at, now, body_id],
    ).fetchone()
    if inserted is None:  # stored meanwhile by another daemon sharing the store
        db.execute("DELETE FROM episode_bodies WHERE id = ?", [body_id])
        return False
    queue(db, "record", provider, episode.episode_id, now=now, due=due, claimer=claimer)
    return True


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


def is_indexed(db: Db, provider: str, episode_id: str) -> bool:
    return db.execute("SELECT 1 FROM memory_index WHERE provider = ? AND episode_id = ? LIMIT 1",
                      [provider, episode_id]).fetchone() is not None


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
    index: tuple[tuple[str, str, str | None], ...] = ()
    if with_index:
        index = tuple(
            (p, pid, f) for p, pid, f in db.execute(
                "SELECT provider, provider_id, forgotten_at FROM memory_index WHERE episode_id = ?"
                " ORDER BY provider, provider_id", [r["episode_id"]]).fetchall()
        )
    episode = _readable(r["body"]) if r["body"] else None
    return EpisodeRow(
        episode_id=r["episode_id"], harness=r["harness"], run_id=r["run_id"], repo=r["repo"], branch=r["branch"],
        scope=r["scope"], outcome=r["outcome"], started_at=r["started_at"], recorded_at=r["recorded_at"],
        forgotten_at=r["forgotten_at"], episode=episode,
        text=render_text(episode) if episode is not None else None, index=index,
    )


def get_episode(db: Db, episode_id: str) -> EpisodeRow | None:
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


@attrs.frozen
class EpisodePage:
    rows: tuple[EpisodeRow, ...]
    total: int
    next_cursor: str | None


def list_episodes(db: Db, *, harness: str | None = None, repo: str | None = None,
                  since: str | None = None, limit: int = 100, after: str | None = None,
                  include_forgotten: bool = False, outcome: str | None = None,
                  paths: tuple[str, ...] = (), run_id: str | None = None) -> EpisodePage:
    """One page, newest first (by when the run started), keyset-paged on (started_at DESC, episode_id):
    `after` is the cursor of the previous page's last row, so pages stay stable while episodes are
    added. `total` counts every row the filters match (all pages). `outcome` keeps one run outcome;
    `paths` keeps the episodes whose run touched any of them (the runs' `run_paths`)."""
    where: list[str] = []
    params: list[Any] = []
    if run_id:
        where.append("run_id = ?")
        params.append(run_id)
    if outcome:
        where.append("outcome = ?")
        params.append(outcome)
    if paths:
        where.append("EXISTS (SELECT 1 FROM run_paths p WHERE p.harness = e.harness AND p.run_id = e.run_id"
                     f" AND p.path IN ({','.join('?' * len(paths))}))")
        params += list(paths)
    if harness:
        where.append("harness = ?")
        params.append(harness)
    if repo:
        where.append("repo = ?")
        params.append(repo)
    if since:
        where.append("started_at >= ?")
        params.append(since)
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


# Ellipses and highlight markers a snippet may add (FTS5 snippet() with "[", "]" and "…"); not words.
_WORD = re.compile(r"[^\W_]+")  # letters and digits: "_" separates, as in FTS5's unicode61 tokenizer
_ESCAPES = re.compile(r"\\(?:u2028|u2029|[nr\\])")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.casefold()))


def text_belongs(item_text: str, stored_text: str) -> bool:
    """REQ-9 (issue 9 "a lying provider"): whether a provider's item text is drawn from the episode's text.

    The rule: every word of the item text — a run of Unicode letters or digits ("_" separates words,
    as in FTS5's unicode61 tokenizer, so a snippet() cut inside `verify_failures` still passes), compared
    case-folded — occurs in the episode's rendering (`render_text`: every REQ-5 field, the
    result excerpt and the summary; its escaped line breaks count as spaces too). Punctuation,
    whitespace, ellipses ("…", "...") and highlight markers ("[", "]") are not words, so a headline
    built from the episode's fields plus an FTS5 snippet() of its text passes, however it is cut or
    marked. A text carrying any word the episode does not have — another repository's memory — fails.
    An empty item text (no words) passes: it carries nothing.
    """
    words = _words(item_text)
    if not words:
        return True
    stored = _words(stored_text)
    if words <= stored:  # the common case: one pass over the stored text
        return True
    return words <= stored | _words(_ESCAPES.sub(" ", stored_text))


def text_belongs_body(item_text: str, body: str) -> bool:
    """`text_belongs` against the episode's stored body (REQ-5 JSON, the one stored copy).

    The words of the body's JSON (its field names and values, escapes read both ways) hold every word
    of its rendering except a few an escape spells differently (a value with U+2028 renders as
    ``\\u2028``), so an item whose words are all there is drawn from the episode: the common case, one
    pass over the body. Any other item is checked against the rendering itself, rendered from the body,
    exactly as `text_belongs` always did. (The body's words are a slight superset of the rendering's —
    `null`, a nested key — all the episode's own: nothing another repository wrote passes.)
    """
    words = _words(item_text)
    if not words:
        return True
    in_body = _words(body)
    if words <= in_body or words <= in_body | _words(_ESCAPES.sub(" ", body)):
        return True
    try:
        rendering = render_text(episode_from_dict(json.loads(body)))
    except (ValueError, TypeError, KeyError, cattrs.BaseValidationError):
        return False  # a body that is not an episode (none this daemon wrote) vouches for nothing more
    return text_belongs(item_text, rendering)


#: How wide the daemon's own text of an item is: what the built-in provider serves (builtin.MAX_ITEM_TEXT),
#: so a replaced item fits a briefing's episodes share as the built-in provider's items do.
OWN_TEXT_CHARS = 320


def own_text(body: str, words: Sequence[str] = ()) -> str | None:
    """The daemon's own text of an episode, from its stored body: what an item is served with when the
    provider's text for it is not drawn from it. The episode's gist (`gist.gist`, the one rendering of
    an item every surface shares: the run's own words first, the snippet around the query's `words`,
    then what it touched), so every word of it is the episode's; None for a body that is not an object
    (none this daemon wrote)."""
    try:
        episode = json.loads(body)
    except ValueError:
        return None
    return gist(episode, words, OWN_TEXT_CHARS) if isinstance(episode, dict) else None


def filter_items(db: Db, *, provider: str, items: Sequence[RecallItem], invalid: int,
                 visible_scopes: Iterable[str], limit: int, check_text: bool = True,
                 words: Sequence[str] = ()) -> Filtered:
    """REQ-9: keep only items indexed for `provider`, not forgotten, in a scope the caller may see.

    `invalid` is the count of items the contract layer already dropped for breaking REQ-3's bounds.
    Provenance comes from the episode row; the item's text and score are the provider's. With
    `check_text` (every provider but one configured ``own_text = true``) an item whose text is not drawn
    from the episode it names (`text_belongs`: a claim "recorded by harness release-bot", another
    episode's text swapped in) is served with the daemon's own text of that episode instead, counted
    ``replaced`` (not a drop: the agent still gets the episode the provider found, under memactors'
    provenance, and none of the provider's words, "Provenance cannot be spoofed"); `words` (the recall's
    query words) pick its snippet. ``invalid`` stays REQ-3's bounds.
    """
    visible = set(visible_scopes)
    dropped: Counter[str] = Counter()
    replaced_count = 0
    if invalid:
        dropped["invalid"] += invalid
    kept: list[KeptItem] = []
    seen: set[str] = set()
    rows = _index_rows(db, provider, [item.id for item in items])
    for item in items:
        row = rows.get(item.id)
        if row is None:
            dropped["unknown_id"] += 1
            continue
        scope, idx_forgotten, eid, run_id, harness, repo, branch, outcome, started_at, body, ep_forgotten, trust = row
        if idx_forgotten or ep_forgotten or body is None:
            dropped["forgotten"] += 1
            continue
        if scope not in visible:
            dropped["scope"] += 1
            continue
        text: str | None = item.text
        if check_text and not text_belongs_body(item.text, body):
            text = own_text(body, words)
            if text is None:
                dropped["invalid"] += 1
                continue
            replaced = True
        else:
            replaced = False
        if eid in seen or len(kept) >= limit:
            continue  # several provider ids of one episode: serve it once
        seen.add(eid)
        if replaced:
            replaced_count += 1
        ep = json.loads(body)
        kept.append(KeptItem(
            provider_id=item.id, text=text, score=item.score,
            provenance=Provenance(
                episode_id=eid, run_id=run_id, harness=harness, adapter=ep.get("adapter", ""),
                model=ep.get("model", ""), repo=repo, branch=branch, outcome=outcome, started_at=started_at,
                scope=scope, trust_class=trust,
            ),
            episode=ep,
        ))
    return Filtered(kept=tuple(kept), dropped=tuple(sorted(dropped.items())), replaced=replaced_count)


def _index_rows(db: Db, provider: str, ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """The index and episode rows of every provider id in one query (REQ-9's re-check, not one per item)."""
    wanted = list(dict.fromkeys(ids))
    out: dict[str, tuple[Any, ...]] = {}
    for start in range(0, len(wanted), 500):  # well under SQLite's bound on host parameters
        chunk = wanted[start:start + 500]
        for row in db.execute(
            "SELECT i.provider_id, i.scope, i.forgotten_at, e.episode_id, e.run_id, e.harness, e.repo, e.branch,"
            " e.outcome, e.started_at, b.body, e.forgotten_at, e.trust_class FROM memory_index i"
            " JOIN episodes e ON e.episode_id = i.episode_id LEFT JOIN episode_bodies b ON b.id = e.body_id"
            f" WHERE i.provider = ? AND i.provider_id IN ({','.join('?' * len(chunk))})",
            [provider, *chunk],
        ).fetchall():
            out[row[0]] = tuple(row[1:])
    return out


def episode_view(row: EpisodeRow) -> dict[str, Any]:
    """The operator's view of one stored episode (GetEpisode / ListEpisodes)."""
    view: dict[str, Any] = {
        "episode_id": row.episode_id, "harness": row.harness, "run_id": row.run_id, "repo": row.repo,
        "branch": row.branch, "scope": row.scope, "outcome": row.outcome, "started_at": row.started_at,
        "recorded_at": row.recorded_at, "forgotten_at": row.forgotten_at,
    }
    if row.episode is not None:
        view["episode"] = episode_to_dict(row.episode)
    if row.text is not None:
        view["text"] = row.text
    if row.index:
        view["index"] = [{"provider": p, "provider_id": pid, "forgotten_at": f} for p, pid, f in row.index]
    return view


def now_iso(clock: WallClock) -> str:
    return iso(clock())


# -- the actor ---------------------------------------------------------------------------------------

@attrs.frozen
class RecordRun:
    """Store a closed run (redacted) and, when assembled, its episode plus a pending record to `provider`.

    One transaction; answers `Stored`. A run already stored is left as it is (first record wins).
    """

    record: RunRecord
    repo: str | None
    branch: str | None
    paths: tuple[str, ...]
    episode: Episode | None
    text: str | None
    provider: str
    clean: bool = False  # the record is already `stored_record`-clean: not redacted again
    #: When the retry loop may first try the pending record (an `iso` time; None: at once). The ingest
    #: path records the episode itself right after the commit, so it sets this past its own attempt:
    #: the loop trying the same row meanwhile would only make one of the two answer "queued" and call
    #: the provider twice. The row is claimed by this daemon until then (`queue`), so no other daemon
    #: sharing the store tries it either; the attempt's outcome ends the claim.
    record_after: str | None = None


@attrs.frozen
class RecordRuns(Ask["tuple[Stored | Exception, ...]"]):
    """Many `RecordRun`s in one write transaction (the ingest path), each inside its own savepoint: one
    that raises rolls back alone. Answers a tuple in the same order, one `Stored` or the exception."""

    runs: tuple[RecordRun, ...]



@attrs.frozen
class IndexIds(Ask[bool]):
    provider: str
    episode_id: str
    ids: tuple[str, ...]


@attrs.frozen
class IndexIdsMany(Ask[bool]):
    """`IndexIds` for many episodes of one provider in one write transaction (an ingest batch's
    record); answers whether any of them queued forgets."""

    provider: str
    episodes: tuple[tuple[str, tuple[str, ...]], ...]


@attrs.frozen
class FilterItems:
    provider: str
    items: tuple[RecallItem, ...]
    invalid: int
    visible_scopes: frozenset[str]
    limit: int
    check_text: bool = True
    words: tuple[str, ...] = ()


@attrs.frozen
class GetEpisode(Ask["EpisodeRow | None"]):
    episode_id: str


@attrs.frozen
class ListEpisodes(Ask["EpisodePage"]):
    harness: str | None = None
    repo: str | None = None
    since: str | None = None
    limit: int = 100
    after: str | None = None
    outcome: str | None = None
    paths: tuple[str, ...] = ()
    run_id: str | None = None


class Index:
    """Owns the stored episode copies and index rows; decides scope. Reads run concurrently."""

    def __init__(self, store: Store, *, wall_clock: WallClock) -> None:
        self._store = store
        self._clock = wall_clock
        self.address, self._mailbox = open_mailbox("index", 64)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.address)
        await serve(self._mailbox, self._handle, concurrency=8)

    async def _handle(self, message: object) -> object:
        now = now_iso(self._clock)
        match message:
            case RecordRun():
                m = message
                return await self._store.write(lambda db: record_run(db, m, now, self._store.daemon_id))
            case RecordRuns(runs=runs):
                return await self._store.write(lambda db: record_runs(db, runs, now, self._store.daemon_id))
            case IndexIds(provider=provider, episode_id=episode_id, ids=ids):
                return await self._store.write(
                    lambda db: add_index_rows(db, provider=provider, episode_id=episode_id, ids=ids, scope="", now=now))
            case IndexIdsMany(provider=provider, episodes=episodes):
                def index_all(db: Db) -> bool:
                    queued = [add_index_rows(db, provider=provider, episode_id=episode_id, ids=ids, scope="", now=now)
                              for episode_id, ids in episodes]
                    return any(queued)

                return await self._store.write(index_all)
            case FilterItems():
                f = message
                return await self._store.read(lambda db: filter_items(
                    db, provider=f.provider, items=f.items, invalid=f.invalid,
                    visible_scopes=f.visible_scopes, limit=f.limit, check_text=f.check_text, words=f.words))
            case GetEpisode(episode_id=episode_id):
                return await self._store.read(lambda db: get_episode(db, episode_id))
            case ListEpisodes():
                q = message
                return await self._store.read(lambda db: list_episodes(
                    db, harness=q.harness, repo=q.repo, since=q.since, limit=q.limit, after=q.after,
                    outcome=q.outcome, paths=q.paths, run_id=q.run_id))
            case _:
                raise TypeError(f"index cannot handle {type(message).__name__}")
