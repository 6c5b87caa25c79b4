"""The ``claude-code`` adapter: ``claude -p --output-format stream-json --verbose … -- <prompt>``.

argv: ``<command> -p --output-format stream-json --verbose --mcp-config <file> [--permission-mode M]
[--model M] [--max-turns N] [--max-budget-usd X] --allowedTools <tools...> [extra_args...] -- <prompt>``:
the prompt is the last element (REQ-16), after ``--``; the caps are the harness's ``max_turns`` and
``max_cost_usd``. The allowed tools are the
configured ``allowed_tools`` plus ``mcp__memactors__recall`` and ``mcp__memactors__briefing`` always,
so a headless agent is never refused its own memory. The ``--mcp-config`` file names the gateway with
this run's bearer token (server name ``memactors``, :data:`MCP_SERVER`).

The stream is Claude Code's JSON lines, one object per line:

* ``{"type": "system", "subtype": "init", "session_id", "model", "cwd", ...}`` — session and model asked for;
* ``{"type": "assistant", "message": {"id", "model", "content": [...]}}`` — one event per content block of
  a model response (a new turn is an assistant event after another kind, or with a new message id);
  the model served; ``text`` blocks (the agent's words, for ``runs logs``); ``tool_use`` blocks: ``Edit``, ``Write``,
  ``MultiEdit`` (``file_path``) and ``NotebookEdit`` (``notebook_path``) are edits, ``Bash``
  (``command``) a shell command whose result follows;
* ``{"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id", "is_error",
  "content"}]}, "tool_result_meta": [{"id", "non_execution_kind"?, "permission_decision"?}]}`` — a Bash
  result. Its exit status: N when the content starts with Claude Code's ``Exit code N`` line, 0 when
  ``is_error`` is false, and **unknown** otherwise — in particular for a command Claude Code refused
  to run (a ``system``/``permission_denied`` event names it, and its result's meta carries
  ``non_execution_kind`` or a ``reject`` decision): the command never ran, so it is no test result.
  A command that did run but whose result has no exit status (timed out, interrupted) or never came
  is ``finished=False``: a verify call among those makes the run ``verify_incomplete``;
* ``{"type": "system", "subtype": "permission_denied", "tool_use_id", ...}`` — a refused tool call;
* ``{"type": "result", "subtype", "is_error", "result", "duration_ms", "total_cost_usd", ...}`` — the
  agent's own verdict and final answer.

Only these facts are kept (tool names, paths, commands, statuses, the final answer); nothing else of
the stream, and never the prompt. A line that is not JSON or not one of these is skipped.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from . import CommandRun, FileEdit, LaunchRequest, LaunchSpec, Transcript, json_object

__all__ = ["MCP_SERVER", "ClaudeCodeAdapter", "ClaudeCodeParser", "bash_exit_status", "memory_tools",
           "refused_ids"]

#: The gateway's server name in the --mcp-config file; Claude Code calls its tools mcp__<server>__<tool>.
MCP_SERVER = "memactors"
_EDIT_TOOLS = {"Edit": "file_path", "Write": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}
#: Claude Code's first line of a Bash result whose command exited non-zero.
_EXIT_CODE = re.compile(r"\AExit code (\d+)")


def memory_tools(server: str = MCP_SERVER) -> tuple[str, ...]:
    """The gateway tools a headless run may always call."""
    return (f"mcp__{server}__recall", f"mcp__{server}__briefing")


@attrs.define
class ClaudeCodeParser:
    transcript: Transcript = attrs.field(factory=Transcript)
    _bash: dict[str, tuple[str, str]] = attrs.field(factory=dict)   # tool_use id -> (command, at)
    _refused: set[str] = attrs.field(factory=set)   # tool_use ids Claude Code refused to run
    _in_turn: bool = False   # the last event was an assistant message (its blocks come one per event)
    _message: str | None = None   # that message's id

    def feed(self, line: str, *, at: str) -> None:
        line = line.strip()
        if not line.startswith("{"):
            return
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        t = self.transcript
        kind = event.get("type")
        if kind != "assistant":
            self._in_turn = False
        if kind == "system" and event.get("subtype") == "init":
            t.session_id = _str(event.get("session_id")) or t.session_id
            t.model = _str(event.get("model")) or t.model
        elif kind == "system" and event.get("subtype") == "permission_denied":
            tool_id = _str(event.get("tool_use_id"))
            if tool_id:
                self._refused.add(tool_id)
        elif kind == "assistant":
            message = event.get("message")
            if isinstance(message, dict):  # the model the API served wins over the one asked for at init
                t.model = _str(message.get("model")) or t.model
            # Claude Code prints one assistant event per content block of a model response: a new turn
            # is an assistant event after anything else, or one with another message id.
            message_id = _str(message.get("id")) if isinstance(message, dict) else None
            if not self._in_turn or (message_id is not None and message_id != self._message):
                t.turns += 1
            self._in_turn, self._message = True, message_id
            for block in _content(event):
                if block.get("type") == "tool_use":
                    self._tool_use(block, at)
                elif block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"].strip():
                    t.texts += 1
                    t.last_text = block["text"]
        elif kind == "user":
            self._refused |= refused_ids(event.get("tool_result_meta"))
            for block in _content(event):
                if block.get("type") == "tool_result":
                    self._tool_result(block, at)
        elif kind == "result":
            t.session_id = t.session_id or _str(event.get("session_id"))
            t.result_kind = _str(event.get("subtype"))
            t.result_ok = event.get("is_error") is not True and (t.result_kind in (None, "success"))
            result = event.get("result")
            t.result_text = result if isinstance(result, str) else t.result_text
            if isinstance(event.get("duration_ms"), int):
                t.duration_ms = event["duration_ms"]
            cost = event.get("total_cost_usd")
            if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
                t.cost_usd = float(cost)

    def _tool_use(self, block: dict[str, Any], at: str) -> None:
        name = _str(block.get("name"))
        if name is None:
            return
        self.transcript.tool_calls.append(name)
        tool_input = json_object(block.get("input"))
        if name in _EDIT_TOOLS:
            path = _str(tool_input.get(_EDIT_TOOLS[name]))
            if path:
                self.transcript.edits.append(FileEdit(path, at))
        elif name == "Bash":
            command = _str(tool_input.get("command"))
            tool_id = _str(block.get("id"))
            if command and tool_id:
                self._bash[tool_id] = (command, at)
                # Until its tool_result arrives: a Bash call whose result never comes never finished.
                self.transcript.running[tool_id] = (len(self.transcript.commands),
                                                    CommandRun(command, None, at, finished=False))

    def _tool_result(self, block: dict[str, Any], at: str) -> None:
        tool_id = _str(block.get("tool_use_id"))
        if tool_id is None or tool_id not in self._bash:
            return
        command, _ = self._bash.pop(tool_id)
        self.transcript.running.pop(tool_id, None)
        refused = tool_id in self._refused
        code = None if refused else bash_exit_status(block)
        # A refused command never ran (finished, no status); an error result without an exit status
        # (Claude Code's Bash timed out or was interrupted) is a command that did not finish.
        self.transcript.commands.append(CommandRun(command, code, at, finished=refused or code is not None))


def refused_ids(meta: object) -> set[str]:
    """The tool_use ids a result's metadata marks as not run: refused by the permission check or the
    user (``non_execution_kind``, a ``reject`` decision). Claude Code writes it as ``tool_result_meta``
    on stream-json events; a session transcript carries the same facts as ``toolDenialKind`` and
    ``permissionDecision`` on the entry (see ``agents/transcript.py``)."""
    out: set[str] = set()
    for item in meta if isinstance(meta, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        decision = item.get("permission_decision")
        if item.get("non_execution_kind") or (isinstance(decision, dict) and decision.get("decision") == "reject"):
            out.add(item["id"])
    return out


def bash_exit_status(block: dict[str, Any]) -> int | None:
    """A Bash tool_result's exit status: N from Claude Code's leading ``Exit code N`` line, 0 when the
    result is not an error, None when it is an error without an exit status (refused, interrupted, a
    timeout): such a command did not finish, so it is no verify event (a refused or
    interrupted test run proves nothing either way)."""
    match = _EXIT_CODE.match(_result_text(block.get("content")))
    if match:
        return int(match.group(1))
    return 0 if block.get("is_error") is not True else None


def _content(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


@attrs.frozen
class ClaudeCodeAdapter:
    name: str = "claude-code"
    default_command: str = "claude"

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        argv: list[str] = [request.command or self.default_command, "-p", "--output-format", "stream-json",
                           "--verbose"]
        if request.mcp_config_path:
            argv += ["--mcp-config", request.mcp_config_path]
        if request.permission_mode:
            argv += ["--permission-mode", request.permission_mode]
        if request.model:
            argv += ["--model", request.model]
        if request.max_turns is not None:  # a hidden flag of claude -p; its result then says error_max_turns
            argv += ["--max-turns", str(request.max_turns)]
        if request.max_cost_usd is not None:  # its result then says error_max_budget_usd
            argv += ["--max-budget-usd", f"{request.max_cost_usd:g}"]
        # --allowedTools takes a list of values up to the next option, so it comes last but extra_args.
        tools = tuple(dict.fromkeys((*request.allowed_tools, *memory_tools())))
        argv += ["--allowedTools", *tools]
        argv += request.extra_args
        if request.prompt is not None:
            # REQ-16: the prompt (the fenced briefing, a blank line, the operator's prompt) is the last
            # argv element. `--` ends the options, so --allowedTools (which takes every value up to the
            # next option) does not swallow it, and a prompt starting with "-" is never read as a flag.
            argv += ["--", request.prompt]
        return LaunchSpec(argv=tuple(argv))

    def parser(self) -> ClaudeCodeParser:
        return ClaudeCodeParser()
