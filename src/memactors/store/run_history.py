"""The run history (REQ-6, REQ-12, REQ-14; docs/contracts.md, "Run graph"): the closed runs the daemon
ingested, each kept once with its (redacted) run record and the paths it edited, and what briefings and
recall read of them: the runs on a branch, the runs that edited a path, each with its latest pull
request, the stored episode a run left, and where a run works (its live presence, else its ingested
run: the repository and branch REQ-9's view reads)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from .._wire import converter
from ..episode import episode_id_for, is_stored
from ..models import RunRecord
from ..redact import redact_obj
from . import Db, insert_with_body
from ._feeds import checked_limit, like_prefix, normalise_path

# -- the closed runs the ingest path keeps -----------------------------------------------------------


def store_run(db: Db, record: RunRecord, *, repo: str | None, branch: str | None,
              paths: Iterable[str], now: str, clean: bool = False) -> bool:
    """Keep the run record (redacted, prompt dropped) and the paths it edited, for the graph.

    A closed run is kept once: the first record stored for (harness, run_id) wins and a later one is
    ignored (False), so an episode never changes, nor its scope, once recorded (REQ-6).
    """
    raw = converter.unstructure(record)
    raw.pop("prompt", None)
    if db.execute("SELECT 1 FROM runs WHERE harness = ? AND run_id = ?", [record.harness, record.run_id]).fetchone():
        return False
    # Clean already (the ingest path's `stored_record`, or a caller that says so): each string is
    # redacted once, at the boundary, never twice.
    safe = raw if clean or is_stored(record) else redact_obj(raw)
    if not insert_with_body(
            db, "run_records", "record", record_json(safe),
            "INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
            " repo, branch, ingested_at, record_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING 1",
            [record.harness, record.run_id, record.adapter, record.started_at, record.ended_at, record.outcome,
             record.reason, record.duration_ms, repo, branch, now]):
        # Another daemon sharing the store committed the same run between the check above and this
        # insert (two hosts ingesting one run): theirs is the first record; this one is a duplicate.
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


# -- what briefings and recall read ------------------------------------------------------------------


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
    limit = checked_limit(limit)
    wanted = [p for p in dict.fromkeys(normalise_path(p) for p in paths) if p]
    if limit == 0 or not wanted:
        return []
    where = " OR ".join("rp.path = ? OR rp.path LIKE ? ESCAPE '\\'" for _ in wanted)
    params: list[object] = [repo]
    for p in wanted:
        params += [p, like_prefix(p)]
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
    limit = checked_limit(limit)
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
    (harness, run_id): what a briefing's recent_runs line says of the run."""
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


# -- where a run works (REQ-9's view of a run) ---------------------------------------------------------


def run_place(db: Db, harness: str, run_id: str | None) -> tuple[str, str | None] | None:
    """(repo, branch) a run works in as the store records it: live presence, else the ingested run."""
    if run_id:
        row = db.execute(
            "SELECT repo, branch FROM presence WHERE harness = ? AND run_id = ?"
            " ORDER BY reported_at DESC, session_id LIMIT 1", [harness, run_id]).fetchone()
        if row is None:
            row = db.execute(
                "SELECT repo, branch FROM runs WHERE harness = ? AND run_id = ? AND repo IS NOT NULL",
                [harness, run_id]).fetchone()
        if row is not None:
            return str(row[0]), None if row[1] is None else str(row[1])
    return None


def adapter_sessions(db: Db, harness: str, adapter: str) -> tuple[Any, int]:
    """(last ingested_at, how many runs) of the harness's runs through `adapter`."""
    row = db.execute("SELECT max(ingested_at), count(*) FROM runs WHERE harness = ? AND adapter = ?",
                     [harness, adapter]).fetchone()
    return row[0], int(row[1] or 0)


def recent_records(db: Db, harness: str, adapter: str, limit: int) -> list[tuple[Any, Any]]:
    """(stored run record or None, ingested_at) of the harness's latest `limit` runs through `adapter`,
    newest first."""
    rows = db.execute("SELECT r.record, s.ingested_at FROM runs s LEFT JOIN run_records r ON r.id = s.record_id"
                      " WHERE s.harness = ? AND s.adapter = ? ORDER BY s.ingested_at DESC LIMIT ?",
                      [harness, adapter, limit]).fetchall()
    return [(record, ingested) for record, ingested in rows]


def latest_repo(db: Db, harness: str) -> str | None:
    """The repository of the harness's latest ingested run in one, or None."""
    row = db.execute("SELECT repo FROM runs WHERE harness = ? AND repo IS NOT NULL ORDER BY ended_at DESC LIMIT 1",
                     [harness]).fetchone()
    return None if row is None else str(row[0])


def latest_run_place(db: Db, harness: str) -> tuple[str, str | None] | None:
    """(repo, branch) of the harness's latest ingested run in a repository, or None."""
    row = db.execute(
        "SELECT repo, branch FROM runs WHERE harness = ? AND repo IS NOT NULL ORDER BY ended_at DESC, run_id LIMIT 1",
        [harness]).fetchone()
    return None if row is None else (str(row[0]), None if row[1] is None else str(row[1]))


def latest_branch(db: Db, harness: str, repo: str) -> str | None:
    """The branch of the harness's latest ingested run in `repo` (None: none, or a detached HEAD)."""
    row = db.execute(
        "SELECT branch FROM runs WHERE harness = ? AND repo = ? ORDER BY ended_at DESC, run_id LIMIT 1",
        [harness, repo]).fetchone()
    return None if row is None or row[0] is None else str(row[0])
