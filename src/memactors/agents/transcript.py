"""A resident Claude Code session's transcript → a closed run record (``memactors hook claude-code session-end``).

Residents are not spawned by memactors, so nobody watched their stdout; what happened is in the
session's transcript, the JSON-lines file Claude Code keeps per session (its ``SessionEnd`` hook
names it as ``transcript_path``). Each line is one entry: ``type`` ``user`` / ``assistant`` (plus
``summary``, ``system``, ``attachment``, ``api-request-blob`` replays … which are read past, and
``cost-state`` with Claude Code's running ``totalCostUSD``) with ``sessionId``,
``cwd``, ``gitBranch``, ``timestamp`` and ``message.content`` blocks. An assistant's ``tool_use``
blocks and the user's matching ``tool_result`` blocks (``is_error``) are what the record is built
from:

- one ``edit`` event per file an ``Edit`` / ``MultiEdit`` / ``Write`` / ``NotebookEdit`` call wrote
  (a call whose result is an error wrote nothing);
- one ``verify`` event per ``Bash`` call whose command matches a verify pattern (pytest, go test,
  cargo test, npm test by default) and that has an exit status: ``ok`` when it is 0, ``error_class``
  ``test_failure`` otherwise. The status is Claude Code's leading ``Exit code N`` line, or 0 for a
  result that is not an error. A command Claude Code refused to run (the entry's ``toolDenialKind``, or
  a ``reject`` in its ``permissionDecision``) or an error result with no exit status tested nothing and
  is no verify event (a refusal is not a failed test);
- the result text is the session's last assistant text; the model is the one that served it.

The claude-code adapter's stream parser reads the same message shapes, but a transcript differs where
it matters here: every line has its own timestamp, there is no final ``result`` event (the answer is
the last assistant text), and an edit whose tool result is an error wrote nothing, so this reader
pairs each edit with its result before counting it.

Prompts, tool inputs other than paths and commands, tool output and thinking are never kept: the
reader holds only the fields above, and the record carries no prompt. A session with a failed last
verify is ``failed`` / ``verify_failed``; otherwise it ended as the user ended it: ``succeeded`` /
``completed``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..adapters.claude_code import bash_exit_status, refused_ids
from ..config import DEFAULT_VERIFY_PATTERNS
from ..models import round_cost

__all__ = [
    "DEFAULT_VERIFY_PATTERNS",
    "SessionTranscript",
    "read_claude_transcript",
    "read_entries",
    "run_record_from_transcript",
]

_EDIT_TOOLS = {"Edit": "file_path", "MultiEdit": "file_path", "Write": "file_path", "NotebookEdit": "notebook_path"}


@attrs.frozen
class Edit:
    path: str
    at: str


@attrs.frozen
class Verify:
    command: str
    ok: bool
    at: str


@attrs.define
class SessionTranscript:
    """What one Claude Code session did, read from its transcript (no prompt, no tool output)."""

    session_id: str | None = None
    cwd: str | None = None
    git_branch: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    model: str | None = None
    #: Claude Code's own running total (``cost-state`` entries' ``totalCostUSD``), None if it wrote none.
    cost_usd: float | None = None
    result_text: str | None = None
    edits: list[Edit] = attrs.field(factory=list)
    verifies: list[Verify] = attrs.field(factory=list)
    tool_calls: int = 0
    lines: int = 0
    unparsed: int = 0


def read_claude_transcript(lines: Iterable[str], verify_patterns: Sequence[str] = DEFAULT_VERIFY_PATTERNS
                           ) -> SessionTranscript:
    """Read a Claude Code transcript (one JSON entry per line); bad lines are counted, never fatal."""
    patterns = [re.compile(p) for p in verify_patterns]
    out = SessionTranscript()
    pending: dict[str, tuple[str, str, str]] = {}  # tool_use id → (kind, path-or-command, at)
    return read_entries(lines, out, lambda entry: _entry(out, entry, pending, patterns))


def read_entries(lines: Iterable[str], out: SessionTranscript,
                 handle: Callable[[dict[str, Any]], None]) -> SessionTranscript:
    """Each non-blank line of a session file that is a JSON object, to ``handle``; lines counted in
    ``out``, and those that are no JSON object or hold a field of an unexpected type counted unparsed
    (skipped, never fatal)."""
    for line in lines:
        if not line.strip():
            continue
        out.lines += 1
        try:
            entry = json.loads(line)
            if isinstance(entry, dict):
                handle(entry)
            else:
                out.unparsed += 1
        except (ValueError, TypeError, AttributeError):
            out.unparsed += 1
    return out


def _entry(out: SessionTranscript, entry: dict[str, Any], pending: dict[str, tuple[str, str, str]],
           patterns: list[re.Pattern[str]]) -> None:
    kind = entry.get("type")
    at = entry.get("timestamp")
    if isinstance(at, str) and at:  # every timed entry (system ones too) bounds the session, in any order
        out.started_at = min(out.started_at or at, at)
        out.ended_at = max(out.ended_at or at, at)
    else:
        at = out.ended_at or ""
    if kind == "cost-state":
        cost = entry.get("totalCostUSD")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            out.cost_usd = float(cost)
        return
    if kind not in ("user", "assistant"):
        return  # summary, system, attachment, api-request(-blob) replays, last-prompt: nothing to record
    for field, attr in (("sessionId", "session_id"), ("cwd", "cwd"), ("gitBranch", "git_branch")):
        value = entry.get(field)
        if isinstance(value, str) and value and getattr(out, attr) is None:
            setattr(out, attr, value)
    message = entry.get("message")
    if not isinstance(message, dict):
        return
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if kind == "assistant":
        if isinstance(message.get("model"), str) and not message["model"].startswith("<"):
            out.model = message["model"]  # "<synthetic>" marks Claude Code's own messages
        for block in blocks:
            if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"].strip():
                out.result_text = block["text"]
            elif block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                out.tool_calls += 1
                _tool_use(block, at, pending, patterns)
        return
    refused = _refused(entry)
    for block in blocks:
        if block.get("type") == "tool_result" and block.get("tool_use_id") in pending:
            use_kind, value, used_at = pending.pop(block["tool_use_id"])
            failed = block.get("is_error") is True
            if use_kind == "edit" and not failed:
                out.edits.append(Edit(path=value, at=used_at))
            elif use_kind == "verify":
                status = None if refused else bash_exit_status(block)
                if status is not None:  # a verify event needs an exit status
                    out.verifies.append(Verify(command=value, ok=status == 0, at=at or used_at))


def _refused(entry: dict[str, Any]) -> bool:
    """The entry is the result of a tool call Claude Code did not run: refused by its permission check
    or by the user (``toolDenialKind``, a ``reject`` decision); the stream's ``tool_result_meta`` too."""
    decision = entry.get("permissionDecision")
    if entry.get("toolDenialKind") or (isinstance(decision, dict) and decision.get("decision") == "reject"):
        return True
    return bool(refused_ids(entry.get("tool_result_meta")))


def _tool_use(block: dict[str, Any], at: str, pending: dict[str, tuple[str, str, str]],
              patterns: list[re.Pattern[str]]) -> None:
    name, tool_input = block.get("name"), block.get("input")
    if not isinstance(tool_input, dict):
        return
    if name in _EDIT_TOOLS:
        path = tool_input.get(_EDIT_TOOLS[name])
        if isinstance(path, str) and path:
            pending[block["id"]] = ("edit", path, at)
    elif name == "Bash":
        command = tool_input.get("command")
        if isinstance(command, str) and any(p.search(command) for p in patterns):
            pending[block["id"]] = ("verify", command, at)


def duration_ms(started_at: str, ended_at: str) -> int:
    """Milliseconds from one ISO-8601 time to another (a session's first and last transcript entry, or the
    hook's time); 0 when either is unreadable or they run backwards."""
    try:
        start = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
        end = datetime.fromisoformat(ended_at.replace("Z", "+00:00"))
        return max(0, int((end - start).total_seconds() * 1000))
    except (ValueError, TypeError):
        return 0


def run_record_from_transcript(session: SessionTranscript, *, harness: str, fallback_session_id: str,
                               fallback_cwd: str, ended_at: str, trigger_name: str = "session-end"
                               ) -> dict[str, Any]:
    """The closed run record (schemas/run_record.schema.json) for a resident session, run_id = session id.

    Times are the transcript's first and last entry; ``ended_at`` (the hook's time) stands in when it
    has none. The ``fallback_*`` values come from the hook input when the transcript lacks them.
    """
    session_id = session.session_id or fallback_session_id
    started_at = session.started_at or ended_at
    last = session.ended_at or ended_at
    failed = bool(session.verifies) and not session.verifies[-1].ok
    events: list[dict[str, Any]] = [
        {"kind": "edit", "session_id": session_id, "at": e.at or started_at, "path": e.path} for e in session.edits]
    events += [{"kind": "verify", "session_id": session_id, "at": v.at or started_at, "ok": v.ok,
                "error_class": None if v.ok else "test_failure"} for v in session.verifies]
    events.sort(key=lambda e: e["at"])
    return {
        "harness": harness,
        "adapter": "claude-code",
        "run_id": session_id,
        "started_at": started_at,
        "ended_at": last,
        "duration_ms": duration_ms(started_at, last),
        "cost_usd": round_cost(session.cost_usd),
        "cost_source": "unknown" if session.cost_usd is None else "reported",
        "model": {"served": session.model, "pinned": None, "configured": None},
        "outcome": "failed" if failed else "succeeded",
        "reason": "verify_failed" if failed else "completed",
        "result_text": session.result_text,
        "trigger": {"source": "manual", "name": trigger_name},
        "spawned_process": True,  # the resident was a real agent process, started by its user
        "prompt": None,
        "sessions": [{"session_id": session_id, "subagent": False, "cwd": session.cwd or fallback_cwd,
                      "git_branch": session.git_branch or None, "started_at": started_at}],
        "events": events,
    }
