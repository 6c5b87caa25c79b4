"""A past Codex session's rollout file → what the session did (``memactors import codex``).

Codex keeps every session as a JSON-lines *rollout* under ``$CODEX_HOME/sessions/YYYY/MM/DD/
rollout-<time>-<id>.jsonl``. Each line is ``{"timestamp", "type", "payload"}``:

- ``session_meta``: the session's ``id``, ``cwd`` and (in some versions) ``git.branch``;
- ``turn_context`` and ``event_msg`` ``thread_settings_applied``: the model in use;
- ``event_msg`` ``item_completed`` with a thread item (Codex 0.16x): ``CommandExecution`` (``command``
  argv, ``exit_code``), ``FileChange`` (``changes`` keyed by path, ``status``), ``AgentMessage`` (its text);
- older versions' ``event_msg`` ``exec_command_end`` (``command``, ``exit_code``), ``patch_apply_end``
  (``changes``, ``success``) and ``agent_message`` (``message``); ``task_complete``'s
  ``last_agent_message``; ``response_item`` ``message``s of role ``assistant`` (its answer).

The reader turns that into the same :class:`~memactors.agents.transcript.SessionTranscript` a Claude Code
transcript gives, so one record builder (``run_record_from_transcript``) serves both: an edit per path a
completed change wrote, a verify per command matching a verify pattern that has an exit status (the
``bash -lc`` wrapper dropped, as the codex adapter does), the last answer, the model. The user's and
developer's messages (the prompt), tool arguments other than the command, command output and reasoning
are read past and never kept.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from ..adapters.codex import unwrap_shell
from ..config import DEFAULT_VERIFY_PATTERNS
from .transcript import Edit, SessionTranscript, Verify, read_entries

__all__ = ["read_codex_rollout"]


def read_codex_rollout(lines: Iterable[str], verify_patterns: Sequence[str] = DEFAULT_VERIFY_PATTERNS
                       ) -> SessionTranscript:
    """Read a Codex rollout (one JSON object per line); bad lines are counted, never fatal."""
    patterns = [re.compile(p) for p in verify_patterns]
    out = SessionTranscript()
    seen_calls: set[tuple[str, str]] = set()  # a command or change reported twice (item and legacy event) counts once
    return read_entries(lines, out, lambda entry: _entry(out, entry, patterns, seen_calls))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _command(value: Any) -> str | None:
    """A command as Codex reports it (an argv list or a string), without its login-shell wrapper."""
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return unwrap_shell(shlex.join(value)) if value else None
    return unwrap_shell(value) if isinstance(value, str) and value else None


def _entry(out: SessionTranscript, entry: dict[str, Any], patterns: list[re.Pattern[str]],
           seen: set[tuple[str, str]]) -> None:
    at = _str(entry.get("timestamp"))
    if at:
        out.started_at = out.started_at or at
        out.ended_at = at
    at = at or out.ended_at or ""
    payload = entry.get("payload")
    if not isinstance(payload, dict):
        return
    kind = entry.get("type")
    if kind == "session_meta":
        out.session_id = out.session_id or _str(payload.get("id")) or _str(payload.get("session_id"))
        out.cwd = out.cwd or _str(payload.get("cwd"))
        git = payload.get("git")
        if isinstance(git, dict):
            out.git_branch = out.git_branch or _str(git.get("branch"))
        return
    if kind == "turn_context":
        out.model = _str(payload.get("model")) or out.model
        out.cwd = out.cwd or _str(payload.get("cwd"))
        return
    if kind == "response_item":
        if payload.get("type") == "message" and payload.get("role") == "assistant":
            text = "".join(c.get("text", "") for c in payload.get("content") or ()
                           if isinstance(c, dict) and c.get("type") == "output_text" and isinstance(c.get("text"), str))
            if text.strip():
                out.result_text = text
        return
    if kind != "event_msg":
        return
    event = payload.get("type")
    if event == "thread_settings_applied" and isinstance(payload.get("thread_settings"), dict):
        out.model = _str(payload["thread_settings"].get("model")) or out.model
    elif event == "item_completed" and isinstance(payload.get("item"), dict):
        item = payload["item"]
        call = _str(item.get("id")) or ""
        match item.get("type"):
            case "CommandExecution":
                _verify(out, call, _command(item.get("command")), item.get("exit_code"), at, patterns, seen)
            case "FileChange":
                if item.get("status") == "completed":
                    _edits(out, call, item.get("changes"), at, seen)
            case "AgentMessage":
                text = "".join(c.get("text", "") for c in item.get("content") or ()
                               if isinstance(c, dict) and isinstance(c.get("text"), str))
                if text.strip():
                    out.result_text = text
    elif event == "exec_command_end":
        _verify(out, _str(payload.get("call_id")) or "", _command(payload.get("command")), payload.get("exit_code"),
                at, patterns, seen)
    elif event == "patch_apply_end":
        if payload.get("success") is True:
            _edits(out, _str(payload.get("call_id")) or "", payload.get("changes"), at, seen)
    elif event == "agent_message" and _str(payload.get("message")):
        out.result_text = payload["message"]
    elif event == "task_complete" and _str(payload.get("last_agent_message")):
        out.result_text = payload["last_agent_message"]


def _verify(out: SessionTranscript, call: str, command: str | None, code: Any, at: str,
            patterns: list[re.Pattern[str]], seen: set[tuple[str, str]]) -> None:
    out.tool_calls += 1
    if call and ("cmd", call) in seen:
        return
    if call:
        seen.add(("cmd", call))
    if command is None or not isinstance(code, int) or isinstance(code, bool):
        return  # a command without an exit status tested nothing (a refusal is no failed test)
    if any(p.search(command) for p in patterns):
        out.verifies.append(Verify(command=command, ok=code == 0, at=at))


def _edits(out: SessionTranscript, call: str, changes: Any, at: str, seen: set[tuple[str, str]]) -> None:
    out.tool_calls += 1
    if call and ("patch", call) in seen:
        return
    if call:
        seen.add(("patch", call))
    for path in changes if isinstance(changes, dict) else ():
        if isinstance(path, str) and path:
            out.edits.append(Edit(path=path, at=at))
