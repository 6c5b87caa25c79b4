"""A resident's briefing at session start: what the agent's own session-start hook pulls.

Claude Code runs its ``SessionStart`` hooks before the session's first model request and adds what a hook
prints as ``hookSpecificOutput.additionalContext`` to the session's context. ``memactors install
claude-code`` adds one (``memactors hook claude-code session-start``) that asks the gateway for this
resident's briefing with its own token — the ``briefing`` tool, so REQ-15's semantics hold: the gateway
composes it once per session (``refresh`` at a session's start, the cached one on ``resume`` and after a
compaction) and writes the exposure of the facts it served (REQ-17) — and prints it inside REQ-16's fence.
Nothing is typed into a terminal: the agent pulls it.

The daemon down or slow must never hold a session up: the whole exchange has :data:`TIMEOUT_SECONDS`, and
on any failure the hook prints nothing (the session starts at once, without a briefing), appends one line to
``session-start-failures.jsonl`` in the state directory, and ``memactors doctor`` counts those of the last
24 hours. Standard library only (a hook's start-up is part of every session's start).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["FAILURES_FILE", "TIMEOUT_SECONDS", "BriefingUnavailable", "additional_context", "call_tool", "fetch_briefing",
           "recent_failures", "record_failure"]

#: The gateway's whole exchange (initialize, the briefing call, closing the session) must fit in this.
TIMEOUT_SECONDS = 3.0
FAILURES_FILE = "session-start-failures.jsonl"
#: What the daemon reads of that file at most (its newest part): the file only grows while sessions fail.
_READ_BYTES = 256 * 1024
_PROTOCOL = "2025-06-18"


class BriefingUnavailable(Exception):
    """The gateway gave no briefing in time; the message says why (no token, refused, down, slow)."""


def inside_a_run() -> str | None:
    """The run id when this session is a ``memactors run`` (the runs actor sets ``MEMACTORS_RUN_ID`` for the
    agent, and its hooks and plugins inherit it): a user install's hooks fire in those sessions too, but the
    daemon records that run from its stream and gave it its briefing in its prompt (REQ-16), so every
    agent's session hooks do nothing there — no second briefing, no second record."""
    return os.environ.get("MEMACTORS_RUN_ID") or None


def not_recorded_here(run: str) -> str:
    """What a session-end hook says on stderr when it skips a supervised run's session."""
    return f"memactors: not recorded here: this session is run {run}, which the daemon records itself"


def _post(url: str, body: dict[str, Any], headers: dict[str, str], deadline: float) -> tuple[Any, Any]:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BriefingUnavailable(f"no answer within {TIMEOUT_SECONDS:g} s")
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        **headers, "content-type": "application/json", "accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(request, timeout=left) as answer:  # noqa: S310 -- the gateway's own URL
            raw = answer.read()
            return answer.headers, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as exc:
        raise BriefingUnavailable(f"the gateway answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BriefingUnavailable(f"the gateway at {url} did not answer ({reason})") from None


def fetch_briefing(url: str, token: str, *, refresh: bool, timeout: float = TIMEOUT_SECONDS) -> str:
    """The resident's briefing text from the gateway's ``briefing`` tool ("" when it is empty)."""
    return call_tool(url, token, "briefing", {"refresh": refresh}, timeout=timeout)


def call_tool(url: str, token: str, tool: str, arguments: dict[str, Any], *, timeout: float = TIMEOUT_SECONDS) -> str:
    """One gateway tool call as the resident (``initialize``, the call, the session closed): the tool's text.
    For an agent with no MCP client of its own (pi's extension runs this through ``memactors hook pi tool``)
    and for the session-start hooks. BriefingUnavailable says why a call failed."""
    deadline = time.monotonic() + timeout
    auth = {"authorization": f"Bearer {token}"}
    headers, answer = _post(url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": _PROTOCOL, "capabilities": {},
        "clientInfo": {"name": "memactors-session-start", "version": "1"}}}, auth, deadline)
    session = headers.get("mcp-session-id")
    if session:
        auth["mcp-session-id"] = session
    auth["mcp-protocol-version"] = str((answer or {}).get("result", {}).get("protocolVersion") or _PROTOCOL)
    try:
        _post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, auth, deadline)
        _, answer = _post(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments}}, auth, deadline)
    finally:
        if session:
            _close(url, auth)
    if not isinstance(answer, dict) or "result" not in answer:
        error = answer.get("error", {}).get("message") if isinstance(answer, dict) else None
        raise BriefingUnavailable(f"the {tool} call failed ({error or 'no result'})")
    result = answer["result"]
    texts = [c.get("text", "") for c in result.get("content") or () if isinstance(c, dict) and c.get("type") == "text"]
    if result.get("isError"):
        raise BriefingUnavailable(f"the {tool} call failed ({' '.join(texts)[:200] or 'an error'})")
    return "\n".join(t for t in texts if t)


def _close(url: str, headers: dict[str, str]) -> None:
    """End the MCP session at once (the gateway keeps each for 30 minutes otherwise); best effort."""
    request = urllib.request.Request(url, method="DELETE", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=0.5):  # noqa: S310 -- the gateway's own URL
            pass
    except (urllib.error.URLError, OSError, ValueError):
        pass


def additional_context(fenced: str) -> str:
    """The SessionStart hook output adding ``fenced`` to the session's context (Claude Code's and Codex's)."""
    return json.dumps({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": fenced}})


def record_failure(state_dir: Path, *, at: str, harness: str, error: str) -> None:
    """Append one failed session start (0600, one line: a concurrent hook's line is never interleaved)."""
    line = json.dumps({"at": at, "harness": harness, "error": error[:500]}, ensure_ascii=False) + "\n"
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(state_dir / FAILURES_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def recent_failures(state_dir: Path, now: datetime, *, window: timedelta = timedelta(hours=24)) -> dict[str, Any]:
    """``{count, last_at, last_error, harnesses}`` of the session starts that got no briefing in ``window``."""
    path = state_dir / FAILURES_FILE
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _READ_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return {"count": 0, "last_at": None, "last_error": None, "harnesses": []}
    since = now - window
    count, last, harnesses = 0, None, set()
    for line in lines:
        try:
            row = json.loads(line)
            at = datetime.fromisoformat(str(row["at"]).replace("Z", "+00:00"))
        except (ValueError, KeyError, TypeError):
            continue  # the first, cut line of the tail read, or a damaged one
        if at < since:
            continue
        count += 1
        last = row
        harnesses.add(str(row.get("harness") or ""))
    return {"count": count, "last_at": last.get("at") if last else None,
            "last_error": last.get("error") if last else None, "harnesses": sorted(h for h in harnesses if h)}
