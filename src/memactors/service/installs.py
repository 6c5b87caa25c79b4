"""Whether each resident install is working: for every `memactors install` (agent, scope,
harness), when the agent last reached the gateway, when its last briefing was served and when its last
session was recorded — and, when sessions stop arriving, the likely cause for that agent.

An install is the resident's run token, which `install` mints as run ``resident-<agent>-<project|user>-
<8 hex>`` (``cli.install.run_id_for``) and keeps in ``run_callers`` until `uninstall` revokes it: the
store, not the files install writes, is where every daemon sharing it finds the installs. A session is a
run record its session-end hook (or OpenCode's plugin) ingested: a ``runs`` row of the install's harness
whose adapter is the agent (with a project's and the user's install of one agent on one harness, the
project's are those run inside its directory). The gateway and briefing times are this daemon's own (in memory, since it
started); the cached briefing's time in the store stands in for a briefing served before.

Silence is reported (doctor warns) when the agent reached the gateway or got a briefing and no session
was recorded in the ``SILENT_SECONDS`` that followed, or when the daemon has run that long and the install
(older than that) recorded no session in it. The cause named is the agent's usual one: Codex runs hooks
only once the user trusts them (``/hooks``), Gemini CLI a project's hooks only in a trusted folder; for any
agent, a daemon down when the session ended (its record waits in the spool) or when it started.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from .._wire import parse_time
from ..adapters.kinds import KINDS
from ..store import iso
from ..store.briefing_cache import computed_at
from ..store.run_history import adapter_sessions, recent_records
from ..store.run_tokens import resident_tokens

__all__ = ["SILENT_SECONDS", "InstallActivity", "install_rows", "likely_cause", "read_installs"]

#: How long an install may go without a recorded session, after the agent was seen or while the daemon
#: ran, before doctor warns ("no session for a day while the daemon ran").
SILENT_SECONDS = 86400.0
#: A resident install's run id (``cli.install.run_id_for``).
RESIDENT_RUN = re.compile(r"resident-(?P<agent>[a-z0-9][a-z0-9-]*?)-(?P<scope>project|user)-[0-9a-f]{8}")

#: What most often keeps an agent's sessions from being recorded, per agent (``adapters.kinds``).
CAUSES = {k.name: k.cause for k in KINDS.values() if k.cause}
DAEMON_DOWN = ("or the daemon was down when a session ended (its record waits in the spool until "
               "`memactors spool send` or the next session) or when it started")


def likely_cause(agent: str) -> str:
    """The likely cause of an install's silence, for that agent, and the daemon-down one for any."""
    own = CAUSES.get(agent, f"check that {agent}'s session hooks are installed and enabled")
    return f"{own}; {DAEMON_DOWN}"


@attrs.define
class InstallActivity:
    """What this daemon saw of each install since it started: its gateway requests and briefings, by
    (harness, run id). Bounded by the installs there are (one run id per agent and place)."""

    started: datetime
    connected: dict[tuple[str, str], datetime] = attrs.Factory(dict)
    briefed: dict[tuple[str, str], datetime] = attrs.Factory(dict)

    def saw(self, harness: str, run_id: str, at: datetime) -> None:
        """The resident reached the gateway with its token (an MCP session start, a tool call)."""
        if RESIDENT_RUN.fullmatch(run_id):
            self.connected[(harness, run_id)] = at

    def briefed_at(self, harness: str, run_id: str, at: datetime) -> None:
        """A briefing was served to the resident (its session-start hook, or the briefing tool)."""
        if RESIDENT_RUN.fullmatch(run_id):
            self.briefed[(harness, run_id)] = at


def read_installs(db: Any) -> list[dict[str, Any]]:
    """Every resident install in the store with its last recorded session and cached briefing (one read).

    A session belongs to the install of its harness and agent; when one agent has several installs on one
    harness (a project's and the user's), to the project install whose directory holds the session's
    working directory, else to the user's (`_attribute`)."""
    out = []
    rows = resident_tokens(db)
    for harness, run_id, workdir, created, expires in rows:
        m = RESIDENT_RUN.fullmatch(str(run_id))
        if m is None:
            continue
        agent = m.group("agent")
        cached = computed_at(db, str(harness), str(run_id))
        out.append({"agent": agent, "scope": m.group("scope"), "harness": str(harness), "run_id": str(run_id),
                    "workdir": str(workdir or "") or None, "installed_at": created, "expires_at": expires,
                    "last_session_at": None, "sessions": 0, "cached_briefing_at": cached})
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in out:
        groups.setdefault((row["harness"], row["agent"]), []).append(row)
    for (harness, agent), installs in groups.items():
        adapter = agent  # every agent's sessions are recorded under its own name (``adapters.kinds``)
        if len(installs) == 1:
            last_at, count = adapter_sessions(db, harness, adapter)
            installs[0].update(last_session_at=last_at, sessions=count)
            continue
        sessions = recent_records(db, harness, adapter, ATTRIBUTED_SESSIONS)
        for record, ingested in sessions:
            owner = _attribute(_cwds(record), installs)
            if owner is not None:
                owner["sessions"] += 1
                owner["last_session_at"] = _latest(owner["last_session_at"], ingested)
    return out


#: With several installs of one agent on one harness, how many of its latest sessions are attributed.
ATTRIBUTED_SESSIONS = 1000


def _cwds(record: Any) -> list[str]:
    try:
        data = json.loads(record) if isinstance(record, str) else record
        return [str(s["cwd"]) for s in data.get("sessions") or () if isinstance(s, dict) and s.get("cwd")]
    except (ValueError, TypeError, AttributeError):
        return []


def _attribute(cwds: list[str], installs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The install a session belongs to: the project install whose directory holds one of its working
    directories (the deepest), else the user install, else none."""
    best, depth = None, -1
    for row in installs:
        root = row.get("workdir")
        if row["scope"] != "project" or not root:
            continue
        if any(cwd == root or cwd.startswith(root.rstrip("/") + "/") for cwd in cwds) and len(root) > depth:
            best, depth = row, len(root)
    if best is not None:
        return best
    return next((row for row in installs if row["scope"] == "user"), None)


def _latest(*times: Any) -> datetime | None:
    parsed = []
    for t in times:
        if isinstance(t, datetime):
            parsed.append(t)
        elif isinstance(t, str) and t:
            try:
                parsed.append(parse_time(t))
            except ValueError:
                continue
    return max(parsed) if parsed else None


def install_rows(stored: Sequence[Mapping[str, Any]], activity: InstallActivity, now: datetime,
                 *, silent_seconds: float | None = None) -> list[dict[str, Any]]:
    """Each install as `memory status --json` shows it: its times, ``ok`` and, when not, ``problem``."""
    silent = SILENT_SECONDS if silent_seconds is None else silent_seconds
    up = (now - activity.started).total_seconds()
    out = []
    for row in stored:
        key = (row["harness"], row["run_id"])
        session = _latest(row.get("last_session_at"))
        briefing = _latest(activity.briefed.get(key), row.get("cached_briefing_at"))
        connected = activity.connected.get(key)
        installed = _latest(row.get("installed_at"))
        seen = _latest(connected, activity.briefed.get(key))
        problem = None
        if seen is not None and (session is None or session < seen) and (now - seen).total_seconds() >= silent:
            problem = (f"{row['agent']} reached the gateway at {iso(seen)} but no session has been recorded "
                       f"since: {likely_cause(row['agent'])}")
        elif (up >= silent and (session is None or (now - session).total_seconds() >= silent)
              and installed is not None and (now - installed).total_seconds() >= silent):
            since = f"since {iso(session)}" if session is not None else "since it was installed"
            problem = (f"no session recorded {since}, while the daemon ran for the last {int(up // 3600)} h "
                       f"(if {row['agent']} was used: {likely_cause(row['agent'])})")
        out.append({
            "agent": row["agent"], "scope": row["scope"], "harness": row["harness"], "run_id": row["run_id"],
            "workdir": row.get("workdir"), "installed_at": row.get("installed_at"),
            "last_connected_at": iso(connected) if connected else None,
            "last_briefing_at": iso(briefing) if briefing else None,
            "last_session_at": iso(session) if session else None, "sessions": row.get("sessions", 0),
            "ok": problem is None, "problem": problem,
        })
    return out
