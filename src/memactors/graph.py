"""The neighbours recall and briefings read from: facts, exposure and votes (SPEC-0028), the run graph
and live presence (SPEC-0027), run tokens (SPEC-0005) and the per-run briefing cache (REQ-15/16).

Every function here is synchronous and takes the `Db` that `Store.write()` or
`Store.read()` hands it (either engine: full-text search over facts is `db.dialect`'s), so a caller composes several of them in one transaction:

    fact = await store.write(lambda db: graph.add_fact(db, scope=s, text=t, confidence=0.8, now=now))

Every listing has an explicit ORDER BY ending in a unique key, so the same store and the same `now`
give the same answer (REQ-14 asks byte-identical briefings). Times are stored as `store.iso()` text and
returned as that text: it is what the wrapper prints, and it sorts lexically.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

import attrs

from .errors import InvalidArgument, MemactorsError
from .redact import redact
from .store import Db, iso

FactStatus = Literal["live", "suspect", "retired"]
Stance = Literal["support", "oppose"]
Surface = Literal["recall", "briefing_tool", "briefing_resource", "briefing_prompt"]

_STATUSES: frozenset[str] = frozenset(get_args(FactStatus))
_STANCES: frozenset[str] = frozenset(get_args(Stance))
_SURFACES: frozenset[str] = frozenset(get_args(Surface))
_FACT_ID = re.compile(r"^f_[0-9A-Za-z_]{1,64}$")


class UnknownFact(MemactorsError):
    """Raised when a fact id names no fact in the daemon's store."""

    code = "NOT_FOUND"


# --------------------------------------------------------------------------------------------- models


@attrs.frozen
class Fact:
    """A SPEC-0028 fact: scoped, scored text the fleet maintains; only the daemon's own rows become facts."""

    id: str
    scope: str
    text: str
    confidence: float
    status: FactStatus
    created_at: str
    updated_at: str


@attrs.frozen
class Vote:
    """One vote on a fact. `counted` is false when the voting run had been shown the fact (independence)."""

    id: int
    fact_id: str
    run_id: str
    harness: str
    stance: Stance
    counted: bool
    at: str


@attrs.frozen
class VoteTally:
    """Counted support and oppose votes (one per run and stance) and every uncounted vote row."""

    support_counted: int
    oppose_counted: int
    uncounted: int


@attrs.frozen
class RunRow:
    """A run as the graph shows it in recent_runs (REQ-12, REQ-14); `pull_request` is the latest link."""

    harness: str
    adapter: str
    run_id: str
    outcome: str
    reason: str
    repo: str | None
    branch: str | None
    started_at: str
    ended_at: str
    duration_ms: int
    pull_request: str | None


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


@attrs.frozen
class Caller:
    """Who presented a run token to the gateway (SPEC-0005)."""

    harness: str
    run_id: str
    workdir: str


@attrs.frozen
class CachedBriefing:
    """A run's briefing as first computed, served unchanged until refreshed (REQ-15, REQ-16 respawn)."""

    harness: str
    run_id: str
    document: str
    doc_json: str
    items: Mapping[str, int]
    computed_at: str


# ------------------------------------------------------------------------------------------- helpers


def _at(now: datetime) -> str:
    if now.tzinfo is None:
        raise InvalidArgument("now must be timezone-aware", field="now")
    return iso(now)


def _limit(limit: int, field: str = "limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidArgument(f"{field} must be a non-negative integer", field=field, value=limit)
    return limit


def _normalise_path(path: str) -> str:
    p = path.strip()
    while p.startswith("./"):
        p = p[2:]
    return p.rstrip("/")


def _overlap(a: str, b: str) -> bool:
    """Same path, or one is a directory containing the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _like_prefix(path: str) -> str:
    escaped = path.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "/%"


def _clean(value: str) -> str:
    """An operator-fed string as it is stored (issue 9): secrets redacted, control characters stripped.

    Every feed below (facts, pull requests, presence, run tokens, votes, exposures) stores only cleaned
    strings and looks rows up by the cleaned form, so a credential pasted into a feed is never kept.
    """
    return redact(value)


def _clean_opt(value: str | None) -> str | None:
    return None if value is None else _clean(value)


def _fact(row: Any) -> Fact:
    fid, scope, text, confidence, status, created_at, updated_at = row
    return Fact(str(fid), str(scope), str(text), float(confidence), status, str(created_at), str(updated_at))


_FACT_COLS = "f.id, f.scope, f.text, f.confidence, f.status, f.created_at, f.updated_at"


# --------------------------------------------------------------------------------------------- facts


def fact_id_for(scope: str, text: str) -> str:
    """`f_` + the first 12 hex digits of SHA-256 over `scope \\0 text` (UTF-8)."""
    return "f_" + hashlib.sha256(f"{scope}\0{text}".encode()).hexdigest()[:12]


def _check_scope(scope: str) -> None:
    if scope == "fleet":
        return
    if isinstance(scope, str) and scope.startswith("project:") and len(scope) > len("project:"):
        return
    raise InvalidArgument("scope must be 'fleet' or 'project:<repo>'", field="scope", value=scope)


def _check_status(status: str) -> None:
    if status not in _STATUSES:
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
    _check_status(status)
    scope, text = _clean(scope), _clean(text)
    fid = fact_id if fact_id is not None else fact_id_for(scope, text)
    if not _FACT_ID.match(fid):
        raise InvalidArgument("id must be f_ followed by letters, digits or _", field="id", value=fid)
    at = _at(now)
    created_at = db.dialect.upsert_fact(db, fact_id=fid, scope=scope, text=text, confidence=float(confidence),
                                        status=status, at=at)
    return Fact(fid, scope, text, float(confidence), status, str(created_at), at)


def get_fact(db: Db, fact_id: str) -> Fact | None:
    """The fact with this id, or None."""
    row = db.execute(f"SELECT {_FACT_COLS} FROM facts f WHERE f.id = ?", [fact_id]).fetchone()
    return None if row is None else _fact(row)


def set_fact_status(db: Db, fact_id: str, status: FactStatus, now: datetime) -> Fact:
    """Move a fact to live, suspect or retired. Raises InvalidArgument (status) or UnknownFact."""
    _check_status(status)
    cur = db.execute(
        "UPDATE facts SET status = ?, updated_at = ? WHERE id = ?", [status, _at(now), fact_id]
    )
    if cur.rowcount == 0:
        raise UnknownFact(fact=_clean(fact_id)[:64])
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
    limit = _limit(limit)
    scopes = list(dict.fromkeys(scopes))
    if limit == 0 or not scopes:
        return []
    rows = db.dialect.search_facts(db, columns=_FACT_COLS, query=query, scopes=scopes, limit=limit)
    if rows is None:
        marks = ", ".join("?" for _ in scopes)
        rows = db.execute(
            f"SELECT {_FACT_COLS} FROM facts f"
            f" WHERE f.status IN ('live', 'suspect') AND f.scope IN ({marks})"
            " ORDER BY f.confidence DESC, f.updated_at DESC, f.id LIMIT ?",
            [*scopes, limit],
        ).fetchall()
    return [_fact(r) for r in rows]


def top_facts(db: Db, *, scopes: Sequence[str], limit: int) -> list[Fact]:
    """Live facts in `scopes` by confidence descending, then updated_at descending, then id (REQ-14)."""
    limit = _limit(limit)
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
        _check_status(s)
    (n,) = db.execute(
        f"SELECT COUNT(*) FROM facts WHERE scope IN ({', '.join('?' for _ in scopes)})"
        f" AND status IN ({', '.join('?' for _ in wanted)})",
        [*scopes, *wanted],
    ).fetchone()
    return int(n)


# ----------------------------------------------------------------------------------- exposure, votes


def record_exposure(
    db: Db,
    *,
    run_id: str,
    harness: str,
    fact_ids: Iterable[str],
    surface: Surface,
    call_id: str | None = None,
    now: datetime,
) -> int:
    """Write one exposure row per distinct fact served to the run on `surface` (REQ-17); returns the count.

    A prepended briefing uses surface `briefing_prompt` and no call id. Call it in the same write as
    serving, so a failure withholds both (SPEC-0028's withhold-on-failure rule is the caller's).
    """
    if surface not in _SURFACES:
        raise InvalidArgument(
            "surface must be recall, briefing_tool, briefing_resource or briefing_prompt",
            field="surface",
            value=surface,
        )
    if not run_id or not harness:
        raise InvalidArgument("run_id and harness are required", field="run_id" if not run_id else "harness")
    run_id, harness = _clean(run_id), _clean(harness)
    at = _at(now)
    ids = list(dict.fromkeys(fact_ids))
    db.executemany(
        "INSERT INTO exposures (run_id, harness, fact_id, surface, call_id, at) VALUES (?, ?, ?, ?, ?, ?)",
        [(run_id, harness, fid, surface, call_id, at) for fid in ids],
    )
    return len(ids)


def was_exposed(db: Db, run_id: str, fact_id: str) -> bool:
    """Whether any surface showed this fact to a run with this run id.

    Matching on run_id alone (not harness) errs towards not counting a vote, which is the safe side.
    """
    row = db.execute(
        "SELECT 1 FROM exposures WHERE run_id = ? AND fact_id = ? LIMIT 1", [run_id, fact_id]
    ).fetchone()
    return row is not None


def cast_vote(
    db: Db, *, fact_id: str, run_id: str, harness: str, stance: Stance, now: datetime
) -> Vote:
    """Store a vote; it is counted only if the run was never exposed to the fact (SPEC-0028, REQ-17).

    Raises InvalidArgument (stance) or UnknownFact.
    """
    if stance not in _STANCES:
        raise InvalidArgument("stance must be support or oppose", field="stance", value=stance)
    if get_fact(db, fact_id) is None:
        raise UnknownFact(fact=_clean(fact_id)[:64])
    run_id, harness = _clean(run_id), _clean(harness)
    counted = not was_exposed(db, run_id, fact_id)
    at = _at(now)
    (vote_id,) = db.execute(
        "INSERT INTO votes (fact_id, run_id, harness, stance, counted, at) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        [fact_id, run_id, harness, stance, int(counted), at],
    ).fetchone()
    return Vote(int(vote_id), fact_id, run_id, harness, stance, counted, at)


def vote_tally(db: Db, fact_id: str) -> VoteTally:
    """Counted votes per stance, one per (harness, run), and the number of uncounted vote rows."""
    support, oppose, uncounted = db.execute(
        "SELECT"
        " (SELECT COUNT(*) FROM (SELECT DISTINCT harness, run_id FROM votes"
        "   WHERE fact_id = ? AND counted = 1 AND stance = 'support') AS s),"
        " (SELECT COUNT(*) FROM (SELECT DISTINCT harness, run_id FROM votes"
        "   WHERE fact_id = ? AND counted = 1 AND stance = 'oppose') AS o),"
        " (SELECT COUNT(*) FROM votes WHERE fact_id = ? AND counted = 0)",
        [fact_id, fact_id, fact_id],
    ).fetchone()
    return VoteTally(int(support), int(oppose), int(uncounted))


# --------------------------------------------------------------------------------------------- graph


def link_pull_request(db: Db, *, repo: str, branch: str, url: str, now: datetime) -> None:
    """Link a pull request to (repo, branch); linking it again moves its linked_at to now."""
    for field, value in (("repo", repo), ("branch", branch), ("url", url)):
        if not value:
            raise InvalidArgument(f"{field} is required", field=field)
    repo, branch, url = _clean(repo), _clean(branch), _clean(url)
    db.execute(
        "INSERT INTO pull_requests (repo, branch, url, linked_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (repo, branch, url) DO UPDATE SET linked_at = excluded.linked_at",
        [repo, branch, url, _at(now)],
    )


def pull_request_for(db: Db, repo: str, branch: str | None) -> str | None:
    """The most recently linked pull request url for (repo, branch), or None."""
    repo, branch = _clean(repo), _clean_opt(branch)
    row = db.execute(
        "SELECT url FROM pull_requests WHERE repo = ? AND branch IS NOT DISTINCT FROM ? ORDER BY linked_at DESC, url DESC LIMIT 1",
        [repo, branch],
    ).fetchone()
    return None if row is None else str(row[0])


_RUN_COLS = (
    "r.harness, r.adapter, r.run_id, r.outcome, r.reason, r.repo, r.branch, r.started_at, r.ended_at,"
    " r.duration_ms, (SELECT p.url FROM pull_requests p WHERE p.repo = r.repo AND p.branch = r.branch"
    " ORDER BY p.linked_at DESC, p.url DESC LIMIT 1)"
)


def _run_row(row: Any) -> RunRow:
    h, a, rid, outcome, reason, repo, branch, started, ended, dur, pr = row
    return RunRow(
        str(h), str(a), str(rid), str(outcome), str(reason),
        None if repo is None else str(repo), None if branch is None else str(branch),
        str(started), str(ended), int(dur), None if pr is None else str(pr),
    )


def runs_editing(
    db: Db, *, repo: str, paths: Sequence[str], limit: int = 5
) -> list[RunRow]:
    """Runs in `repo` that edited any of `paths`, newest first by ended_at, then harness, run_id (REQ-12).

    A path matches an edited path equal to it or under it, so `src/ledger` finds `src/ledger/post.py`.
    Paths are repository-relative, as the ingest path stores them; a leading `./` is ignored.
    """
    limit = _limit(limit)
    wanted = [p for p in dict.fromkeys(_normalise_path(p) for p in paths) if p]
    if limit == 0 or not wanted:
        return []
    where = " OR ".join("rp.path = ? OR rp.path LIKE ? ESCAPE '\\'" for _ in wanted)
    params: list[object] = [repo]
    for p in wanted:
        params += [p, _like_prefix(p)]
    rows = db.execute(
        f"SELECT {_RUN_COLS} FROM runs r WHERE EXISTS ("
        "  SELECT 1 FROM run_paths rp WHERE rp.harness = r.harness AND rp.run_id = r.run_id"
        f"  AND rp.repo = ? AND ({where}))"
        " ORDER BY r.ended_at DESC, r.harness, r.run_id LIMIT ?",
        [*params, limit],
    ).fetchall()
    return [_run_row(r) for r in rows]


def recent_runs(
    db: Db, *, repo: str, branch: str | None, limit: int = 5
) -> list[RunRow]:
    """The last runs on (repo, branch), newest first by ended_at, then harness, run_id (REQ-14)."""
    limit = _limit(limit)
    if limit == 0:
        return []
    rows = db.execute(
        f"SELECT {_RUN_COLS} FROM runs r WHERE r.repo = ? AND r.branch IS NOT DISTINCT FROM ?"
        " ORDER BY r.ended_at DESC, r.harness, r.run_id LIMIT ?",
        [repo, branch, limit],
    ).fetchall()
    return [_run_row(r) for r in rows]


def run_episodes(db: Db, runs: Sequence[RunRow]) -> dict[tuple[str, str], dict[str, Any]]:
    """The stored episode (REQ-5 body, parsed) of each of `runs` that has one not forgotten, by
    (harness, run_id): what a briefing's recent_runs line says of the run (issue 38)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    wanted = list(dict.fromkeys((r.harness, r.run_id) for r in runs))
    for harness, run_id in wanted:
        row = db.execute(
            "SELECT b.body FROM episodes e JOIN episode_bodies b ON b.id = e.body_id"
            " WHERE e.harness = ? AND e.run_id = ? AND e.forgotten_at IS NULL ORDER BY e.recorded_at DESC LIMIT 1",
            [harness, run_id]).fetchone()
        if row is not None and row[0]:
            try:
                body = json.loads(row[0])
            except ValueError:
                continue
            if isinstance(body, dict):
                out[(harness, run_id)] = body
    return out


# -------------------------------------------------------------------------------------------- presence


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
    harness, run_id, session_id, repo = _clean(harness), _clean(run_id), _clean(session_id), _clean(repo)
    branch = _clean_opt(branch)
    clean = tuple(sorted({p for p in (_normalise_path(_clean(p)) for p in paths) if p}))
    reported, expires = _at(now), _at(now + timedelta(seconds=ttl_seconds))
    db.execute(
        "INSERT INTO presence (harness, run_id, session_id, repo, branch, paths, reported_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (harness, run_id, session_id) DO UPDATE SET repo = excluded.repo,"
        " branch = excluded.branch, paths = excluded.paths, reported_at = excluded.reported_at,"
        " expires_at = excluded.expires_at",
        [harness, run_id, session_id, repo, branch, json.dumps(list(clean)), reported, expires],
    )
    return Presence(harness, run_id, session_id, repo, branch, clean, reported, expires)


def clear_presence(db: Db, *, harness: str, run_id: str) -> int:
    """Remove every session of a run (it ended); returns how many were removed."""
    cur = db.execute("DELETE FROM presence WHERE harness = ? AND run_id = ?", [_clean(harness), _clean(run_id)])
    return int(cur.rowcount)


def prune_presence(db: Db, *, now: datetime) -> int:
    """Delete expired presence rows; reads already ignore them, this only keeps the table small."""
    cur = db.execute("DELETE FROM presence WHERE expires_at <= ?", [_at(now)])
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
        [repo, _at(now)],
    ).fetchall()
    return [_presence(r) for r in rows]


def _pair(a: Presence, b: Presence) -> Collision | None:
    same_branch = a.branch is not None and a.branch == b.branch
    shared = tuple(sorted(
        {p for p in a.paths if any(_overlap(p, q) for q in b.paths)}
        | {q for q in b.paths if any(_overlap(p, q) for p in a.paths)}
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
    """Collisions among live sessions on `repo` (SPEC-0027): different runs, same branch or shared paths.

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
    at = _at(now)
    stand_in = Presence(for_run[0], for_run[1], "", repo, branch, (), at, at)
    for b in others:
        if branch is None or b.branch == branch:
            out.append(Collision(stand_in, b, branch is not None, (), prospective=True))
    return out


# ------------------------------------------------------------------------------------ caller identity


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint_run_token(db: Db, *, harness: str, run_id: str, workdir: str, now: datetime,
                   expires_at: datetime | None = None) -> str:
    """Mint a bearer token for a run (SPEC-0005); only its SHA-256 is stored. Returns the token.

    ``expires_at`` None: the token lives until revoked; otherwise it resolves to nobody from then on.
    """
    for field, value in (("harness", harness), ("run_id", run_id)):
        if not value:
            raise InvalidArgument(f"{field} is required", field=field)
    harness, run_id, workdir = _clean(harness), _clean(run_id), _clean(workdir)
    token = secrets.token_urlsafe(32)
    db.execute(
        "INSERT INTO run_callers (token_sha256, harness, run_id, workdir, created_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [_sha256(token), harness, run_id, workdir, _at(now), None if expires_at is None else _at(expires_at)],
    )
    return token


def resolve_run_token(db: Db, token: str, now: datetime | None = None) -> Caller | None:
    """The run a token was minted for, or None for an empty, unknown or (at ``now``) expired token."""
    if not token:
        return None
    row = db.execute(
        "SELECT harness, run_id, workdir, expires_at FROM run_callers WHERE token_sha256 = ?", [_sha256(token)]
    ).fetchone()
    if row is None or (now is not None and row[3] is not None and str(row[3]) <= _at(now)):
        return None
    return Caller(str(row[0]), str(row[1]), str(row[2]))


def expire_run_tokens(db: Db, *, harness: str, run_id: str, at: datetime) -> int:
    """Make every token of a run expire at ``at`` (its end plus a grace); returns how many."""
    cur = db.execute("UPDATE run_callers SET expires_at = ? WHERE harness = ? AND run_id = ?"
                     " AND (expires_at IS NULL OR expires_at > ?)", [_at(at), harness, run_id, _at(at)])
    return int(cur.rowcount)


def revoke_run_tokens(db: Db, *, harness: str, run_id: str) -> int:
    """Forget every token of a run (it ended); returns how many were revoked."""
    cur = db.execute("DELETE FROM run_callers WHERE harness = ? AND run_id = ?", [_clean(harness), _clean(run_id)])
    return int(cur.rowcount)


# ----------------------------------------------------------------------------------- briefing cache


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
    at = _at(now)
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
