"""The ``agent_runs`` table: every run the daemon starts, kept past its end and past a restart.

Engine-neutral SQL over `Db`, run through ``Store.write`` / ``read`` by the runs actor (``actors.runs``),
the service (a run's log) and the start-up repair (``agents.excerpt_repair``). A row is written when the
run is spawned (state ``running``) and again when it ended, with the redacted stderr tail and event log
(``agents.run_watch``). What is kept and for how long (docs/runs.md "What is kept"):

* the row (ids, times, outcome, reason, episode, pid, caps; the stderr tail): :data:`KEEP_ROWS_DAYS`
  after the run ended;
* the event log: :data:`KEEP_LOG_DAYS` after the run ended, and for the newest :data:`KEEP_LOGS` runs;
* when the run's episode is forgotten (REQ-10), the stderr tail and the log go at once (a trigger).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from . import Db, iso

__all__ = ["KEEP_LOGS", "KEEP_LOG_DAYS", "KEEP_ROWS_DAYS", "find", "log_of", "log_text", "page", "prune", "stale_running",
           "upsert"]

#: An ended run's row is kept this long.
KEEP_ROWS_DAYS = 30
#: An ended run's event log is kept this long ...
KEEP_LOG_DAYS = 7
#: ... and only for this many of the newest runs.
KEEP_LOGS = 1000

_COLUMNS = "harness, run_id, state, started_at, ended_at, view, stderr_tail, log"


def upsert(db: Db, view: dict[str, Any], *, stderr_tail: str | None = None,
           log: list[dict[str, Any]] | None = None) -> None:
    """Write a run's row (a respawn under the same id replaces it)."""
    stored = {k: v for k, v in view.items() if k != "stderr_tail"}
    db.execute(
        f"INSERT INTO agent_runs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (harness, run_id) DO UPDATE"
        " SET state = excluded.state, started_at = excluded.started_at, ended_at = excluded.ended_at,"
        " view = excluded.view, stderr_tail = excluded.stderr_tail, log = excluded.log",
        [view["harness"], view["run_id"], view["state"], view["started_at"], view.get("ended_at"),
         json.dumps(stored, sort_keys=True), stderr_tail,
         None if log is None else "\n".join(json.dumps(e, sort_keys=True) for e in log)])


def _view(row: tuple[Any, ...]) -> dict[str, Any]:
    view: dict[str, Any] = json.loads(row[5])
    view["stderr_tail"] = row[6]
    return view


def find(db: Db, run_id: str, harness: str | None) -> list[dict[str, Any]]:
    """The stored views of ``run_id`` (of ``harness`` when given): none, one, or one per harness."""
    if harness is None:
        rows = db.execute(f"SELECT {_COLUMNS} FROM agent_runs WHERE run_id = ? ORDER BY harness", [run_id])
    else:
        rows = db.execute(f"SELECT {_COLUMNS} FROM agent_runs WHERE run_id = ? AND harness = ?", [run_id, harness])
    return [_view(r) for r in rows.fetchall()]


def log_text(db: Db, harness: str, run_id: str) -> str | None:
    """An ended run's stored event log as stored (one JSON event a line); None when it is gone (pruned,
    or its episode forgotten) or the run is unknown."""
    row = db.execute("SELECT log FROM agent_runs WHERE harness = ? AND run_id = ?", [harness, run_id]).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def log_of(db: Db, harness: str, run_id: str) -> list[dict[str, Any]] | None:
    """An ended run's stored event log; None when it is gone (pruned, or its episode forgotten)."""
    text = log_text(db, harness, run_id)
    if text is None:
        return None
    return [json.loads(line) for line in text.splitlines() if line]


def page(db: Db, *, harness: str | None, state: str | None, limit: int,
         after: str | None) -> tuple[list[dict[str, Any]], int, str | None]:
    """Runs newest first: (views, total matching, cursor of the next page or None). A listed view has
    no stderr tail (``stderr_tail`` is None; GetRun shows it), so a page of 1000 stays one small frame.

    The cursor is ``started_at|harness|run_id`` of the last row shown, so pages stay stable while runs
    start."""
    where, params = [], []
    if harness is not None:
        where.append("harness = ?")
        params.append(harness)
    if state is not None:
        where.append("state = ?")
        params.append(state)
    total = db.execute("SELECT count(*) FROM agent_runs" + (f" WHERE {' AND '.join(where)}" if where else ""),
                       params).fetchone()[0]
    if after:
        started, _, rest = after.partition("|")
        name, _, run = rest.partition("|")
        where.append("(started_at, harness, run_id) < (?, ?, ?)")
        params += [started, name, run]
    sql = ("SELECT harness, run_id, state, started_at, ended_at, view, NULL, NULL FROM agent_runs" + (f" WHERE {' AND '.join(where)}" if where else "")
           + " ORDER BY started_at DESC, harness DESC, run_id DESC LIMIT ?")
    rows = db.execute(sql, [*params, limit + 1]).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = f"{rows[-1][3]}|{rows[-1][0]}|{rows[-1][1]}" if more and rows else None
    return [_view(r) for r in rows], int(total), cursor


def stale_running(db: Db) -> list[dict[str, Any]]:
    """Rows still ``running``: at start-up, runs a previous daemon did not see end."""
    return [_view(r) for r in db.execute(f"SELECT {_COLUMNS} FROM agent_runs WHERE state = 'running'").fetchall()]


def prune(db: Db, now: datetime) -> tuple[int, int]:
    """Forget old rows and logs (the bounds above); returns (rows deleted, logs dropped)."""
    rows = db.execute("DELETE FROM agent_runs WHERE state = 'ended' AND ended_at < ?",
                      [iso(now - timedelta(days=KEEP_ROWS_DAYS))]).rowcount
    logs = db.execute("UPDATE agent_runs SET log = NULL WHERE log IS NOT NULL AND state = 'ended'"
                      " AND ended_at < ?", [iso(now - timedelta(days=KEEP_LOG_DAYS))]).rowcount
    logs += db.execute(
        "UPDATE agent_runs SET log = NULL WHERE log IS NOT NULL AND (harness, run_id) NOT IN"
        " (SELECT harness, run_id FROM agent_runs WHERE log IS NOT NULL ORDER BY started_at DESC LIMIT ?)",
        [KEEP_LOGS]).rowcount
    return rows, logs
