"""A resident Gemini CLI or OpenCode session → a closed run record.

Residents are started by their user, so nobody read their stream; what happened is in what the CLI keeps
or hands its hooks, and each is read here by the parser of that CLI's own stream (``adapters``), so a
one-shot ``memactors run`` and a resident session of the same CLI are read by the same rules (edits when
their tool call succeeded, a shell command's exit status, the last answer as the result text):

* **Gemini CLI** keeps each session in a JSON-lines file, ``~/.gemini/tmp/<project>/chats/session-….jsonl``,
  and its ``SessionEnd`` hook names it as ``transcript_path``. Line one is the session's header
  (``sessionId``, ``startTime``); then messages (``id``, ``timestamp``, ``type`` ``user`` / ``gemini`` /
  ``info`` …, ``content``, and on a ``gemini`` message ``model`` and ``toolCalls``: ``{id, name, args,
  status, result: [{functionResponse: {response: {output | error}}}]}``), a message written again under
  the same ``id`` once its tool calls finished (the later one wins), and ``{"$set": {...}}`` updates
  (``messages`` among them). A shell call's ``output`` is the text its model got, wrapped in
  ``<untrusted_context>``: ``Output: …`` / ``Exit Code: N``, as ``--debug`` puts it in the stream. Each
  message becomes the ``stream-json`` event it was streamed as and goes through ``GeminiCliParser``.
* **OpenCode** has no session-end hook; the plugin ``memactors install opencode`` writes collects, from
  the bus events it is sent, the parts of each session's assistant messages (the same part objects
  ``opencode run --format json`` prints: ``step-start``, ``text``, ``tool`` with its ``state``,
  ``step-finish`` with tokens and cost) and, when OpenCode exits, pipes them to ``memactors hook opencode
  session-end``, which feeds them to ``OpenCodeParser`` as the events ``run`` would have printed.

Prompts and tool output are never kept: the user's messages are read past, and the record holds paths,
commands' verdicts, the answer and the model. Outcome and reason follow ``build_run_record``'s rules for a
run that exited 0 (a failed last test: ``failed`` / ``verify_failed``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from ..adapters import Transcript
from ..adapters.gemini_cli import GeminiCliParser
from ..adapters.opencode import OpenCodeParser
from ..adapters.pi import pi_event
from ..config import HarnessConfig
from .run_record import build_run_record, git_start
from .transcript import duration_ms

__all__ = ["gemini_session", "opencode_session", "pi_session", "qwen_session", "resident_record"]

#: The wrapper Gemini CLI puts around a tool's output in the text its model gets (and in its session file).
_UNTRUSTED = ("<untrusted_context>\n", "\n</untrusted_context>")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _unwrap(output: str) -> str:
    start, end = _UNTRUSTED
    if output.startswith(start):
        output = output[len(start):]
        output = output[: -len(end)] if output.endswith(end) else output
    return output


def _tool_events(call: dict[str, Any]) -> list[dict[str, Any]]:
    """One recorded tool call as the ``tool_use`` and ``tool_result`` events the stream carries."""
    tool_id, name = _str(call.get("id")), _str(call.get("name"))
    if tool_id is None or name is None:
        return []
    args = call.get("args")
    use: dict[str, Any] = {"type": "tool_use", "tool_name": name, "tool_id": tool_id,
                           "parameters": args if isinstance(args, dict) else {}}
    result: dict[str, Any] = {"type": "tool_result", "tool_id": tool_id, "status": call.get("status")}
    for item in call.get("result") or ():
        response = (item.get("functionResponse") or {}).get("response") if isinstance(item, dict) else None
        if isinstance(response, dict) and isinstance(response.get("output"), str):
            result["output"] = _unwrap(response["output"])
            break
    return [use, result]


class GeminiSession:
    """What a Gemini CLI session file says: the parsed transcript and the session's times."""

    def __init__(self) -> None:
        self.parser = GeminiCliParser()
        self.started_at: str | None = None
        self.ended_at: str | None = None

    @property
    def transcript(self) -> Transcript:
        return self.parser.transcript


def gemini_session(lines: Iterable[str]) -> GeminiSession:
    """Read a Gemini CLI session file (JSON lines); a bad line is skipped, never fatal."""
    out = GeminiSession()
    messages: dict[str, dict[str, Any]] = {}   # id -> the message as last written (insertion: first seen)
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if "sessionId" in entry and "type" not in entry:
            out.parser.feed(json.dumps({"type": "init", "session_id": entry.get("sessionId")}),
                            at=str(entry.get("startTime") or ""))
            out.started_at = _str(entry.get("startTime")) or out.started_at
            continue
        updates = entry.get("$set")
        found = updates.get("messages") if isinstance(updates, dict) else [entry]
        for message in found if isinstance(found, list) else ():
            if isinstance(message, dict) and _str(message.get("id")):
                messages[message["id"]] = message
    for message in messages.values():
        at = _str(message.get("timestamp")) or ""
        if at:
            out.started_at = out.started_at or at
            out.ended_at = at
        if message.get("type") != "gemini":
            continue  # the user's prompts (and Gemini CLI's own info lines) are read past
        if _str(message.get("model")):
            out.parser.feed(json.dumps({"type": "init", "model": message["model"]}), at=at)
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        events: list[dict[str, Any]] = []  # the text first: a message's tool calls come after its words
        if isinstance(content, str) and content.strip():
            events.append({"type": "message", "role": "assistant", "content": content})
        for event in events:
            out.parser.feed(json.dumps(event), at=at)
        for call in message.get("toolCalls") or ():
            if isinstance(call, dict):
                for event in _tool_events(call):
                    out.parser.feed(json.dumps(event), at=_str(call.get("timestamp")) or at)
    # Any event that is not the model's text completes the answer being read (the last one: the result text).
    out.parser.feed(json.dumps({"type": "session_end"}), at=out.ended_at or "")
    return out


_EXIT_LINE = re.compile(r"^Exit Code: (-?\d+)\s*$", re.MULTILINE)


def _qwen_result(call_id: str, response: Any, status: Any) -> dict[str, Any]:
    """A Qwen Code ``functionResponse`` as Gemini CLI's ``tool_result`` event. Qwen Code reports a shell
    command that exited non-zero as an error whose text still carries its ``Exit Code: N`` line: that is
    a command that finished (a failed test), so it is read as one, with that status."""
    result: dict[str, Any] = {"type": "tool_result", "tool_id": call_id,
                              "status": "success" if status == "success" else "error"}
    if isinstance(response, dict):
        if isinstance(response.get("output"), str):
            result["output"] = response["output"]
        elif isinstance(response.get("error"), str) and _EXIT_LINE.search(response["error"]):
            result.update(status="success", output=response["error"])
    return result


def _timed_entries(lines: Iterable[str], out: GeminiSession) -> Iterator[tuple[dict[str, Any], str]]:
    """Each JSON object line of a session file with its time (its ``timestamp``, else the latest seen), widening
    ``out``'s first and last times as it goes; a line that is not a JSON object is skipped."""
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        at = _str(entry.get("timestamp")) or out.ended_at or ""
        if _str(entry.get("timestamp")):
            out.started_at = min(out.started_at or at, at)
            out.ended_at = max(out.ended_at or at, at)
        yield entry, at


def qwen_session(lines: Iterable[str]) -> GeminiSession:
    """Read a Qwen Code chat recording (``~/.qwen/projects/<project>/chats/<session id>.jsonl``, the
    ``transcript_path`` of its hooks: one JSON entry a line, ``type`` ``user`` / ``assistant`` /
    ``tool_result`` / ``system``, each with ``sessionId``, ``timestamp``, ``cwd``). Qwen Code is a Gemini CLI
    fork and keeps Gemini's message parts: an assistant's ``functionCall`` parts and text, a tool result's
    ``functionResponse``; they are fed to Gemini CLI's reader as its stream events. The user's prompts and
    the system entries are read past (their times bound the session). A bad line is skipped."""
    out = GeminiSession()
    for entry, at in _timed_entries(lines, out):
        if out.parser.transcript.session_id is None and _str(entry.get("sessionId")):
            out.parser.feed(json.dumps({"type": "init", "session_id": entry["sessionId"]}), at=at)
        message = entry.get("message")
        parts = [p for p in (message.get("parts") if isinstance(message, dict) else None) or ()
                 if isinstance(p, dict)]
        if entry.get("type") == "assistant":
            if _str(entry.get("model")):
                out.parser.transcript.model = entry["model"]
            text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought"))
            if text.strip():
                out.parser.feed(json.dumps({"type": "message", "role": "assistant", "content": text}), at=at)
            for part in parts:
                call = part.get("functionCall")
                if isinstance(call, dict) and _str(call.get("id")) and _str(call.get("name")):
                    out.parser.feed(json.dumps({"type": "tool_use", "tool_name": call["name"], "tool_id": call["id"],
                                                "parameters": call.get("args") if isinstance(call.get("args"), dict)
                                                else {}}), at=at)
        elif entry.get("type") == "tool_result":
            status = (entry.get("toolCallResult") or {}).get("status") if isinstance(
                entry.get("toolCallResult"), dict) else None
            for part in parts:
                response = part.get("functionResponse")
                if isinstance(response, dict) and _str(response.get("id")):
                    out.parser.feed(json.dumps(_qwen_result(response["id"], response.get("response"), status)),
                                    at=at)
    out.parser.feed(json.dumps({"type": "session_end"}), at=out.ended_at or "")
    return out


def pi_session(lines: Iterable[str]) -> GeminiSession:
    """Read a pi session file (``~/.pi/agent/sessions/<cwd>/<time>_<id>.jsonl``: a ``session`` header with
    ``id`` and ``cwd``, then ``message`` entries whose ``message`` is an assistant's (``toolCall`` and ``text``
    blocks, ``model``), a ``toolResult`` (``toolCallId``, ``isError``, its text) or the user's (read past).
    ``write``/``edit`` with a ``path`` are edits once they succeed; ``bash`` a command whose status is its
    ``Command exited with code N`` line, 0 for a result that is not an error. Fed to Gemini CLI's reader as
    its stream events. A bad line is skipped."""
    out = GeminiSession()
    for entry, at in _timed_entries(lines, out):
        for event in pi_event(entry):
            out.parser.feed(json.dumps(event), at=at)
    out.parser.feed(json.dumps({"type": "session_end"}), at=out.ended_at or "")
    return out


def _iso_ms(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(value / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return None


_PART_EVENTS = {"step-start": "step_start", "text": "text", "tool": "tool_use", "step-finish": "step_finish"}


def opencode_session(doc: dict[str, Any]) -> tuple[Transcript, str | None, str | None]:
    """Read the plugin's session document (``{session_id, started_at, ended_at, parts: [...], errors}``;
    times in milliseconds, as OpenCode keeps them): (transcript, started_at, ended_at)."""
    parser = OpenCodeParser()
    started, ended = _iso_ms(doc.get("started_at")), _iso_ms(doc.get("ended_at"))
    for part in doc.get("parts") or ():
        if not isinstance(part, dict) or part.get("type") not in _PART_EVENTS:
            continue
        timing = part.get("state", {}).get("time") if isinstance(part.get("state"), dict) else part.get("time")
        at = (_iso_ms(timing.get("end") or timing.get("start")) if isinstance(timing, dict) else None) or started
        event = {"type": _PART_EVENTS[part["type"]], "sessionID": doc.get("session_id"), "part": part}
        parser.feed(json.dumps(event), at=at or "")
    for error in doc.get("errors") or ():
        parser.feed(json.dumps({"type": "error", "error": error if isinstance(error, dict) else {}}), at=ended or "")
    transcript = parser.transcript
    transcript.session_id = _str(doc.get("session_id")) or transcript.session_id
    transcript.model = _str(doc.get("model")) or transcript.model
    return transcript, started, ended


def _toplevel(cwd: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        out = subprocess.run(["git", "-C", cwd, "rev-parse", "--show-toplevel"], capture_output=True, env=env,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.decode("utf-8", "replace").strip() or None


def resident_record(transcript: Transcript, *, harness: str, adapter: str, cfg: HarnessConfig, session_id: str,
                    cwd: str, started_at: str, ended_at: str, trigger_name: str = "session-end") -> dict[str, Any]:
    """The closed run record of one resident session (run id: the session id)."""
    branch, _, _ = git_start(cwd)
    duration = duration_ms(started_at, ended_at)
    transcript.session_id = transcript.session_id or session_id
    record = build_run_record(harness=harness, adapter=adapter, run_id=session_id, cfg=cfg, transcript=transcript,
                              exit_code=0, stopped=None, spawn_error=False, started_at=started_at,
                              ended_at=ended_at, duration_ms=duration, workdir=cwd, repo_key=None,
                              toplevel=_toplevel(cwd), branch=branch, changed=None)
    # The resident was a real agent process, started by its user; its session ended as the user ended it.
    record["trigger"] = {"source": "manual", "name": trigger_name}
    record["spawned_process"] = True
    return record
