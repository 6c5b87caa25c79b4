"""The ``codex`` adapter: ``codex exec --json … <prompt>`` and its JSON-lines event stream.

Codex (the OpenAI CLI) prints one thread event per line with ``--json``: ``thread.started`` (the
thread id), ``turn.started``, ``item.started`` / ``item.updated`` / ``item.completed`` carrying a
thread item (``agent_message``, ``reasoning``, ``command_execution``, ``file_change``,
``mcp_tool_call``, ``todo_list``, ``web_search``, ``error``), then ``turn.completed`` (token usage)
or ``turn.failed``, and a bare ``error`` for stream-level trouble. Items and events carry no
timestamps, so an observation is stamped with the time its line was read.

The gateway reaches Codex as a streamable-HTTP MCP server given with ``-c`` overrides
(``mcp_servers.memactors.url`` and ``bearer_token_env_var``): Codex reads the bearer token from the
environment variable named there, so the token never appears in argv (which ``ps`` shows to every
local user). A third override, ``default_tools_approval_mode = "approve"``, approves the server's
tools: ``codex exec`` runs with the approval policy ``never``, under which Codex answers every MCP
tool call that is not approved in configuration with "MCP tool call requires approval, but approval
policy is never" — the agent would never get its memory. The gateway serves only ``recall`` and
``briefing`` (REQ-2), both read-only, so approving the server's tools approves exactly those. The same facts are in the environment as ``MEMACTORS_GATEWAY_URL``,
``MEMACTORS_RUN_TOKEN`` and ``MEMACTORS_MCP_CONFIG`` for wrappers and scripts.

Nothing the agent printed is kept beyond the transcript's fields: command output
(``aggregated_output``), reasoning text and MCP results are read past, not stored.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from . import CommandRun, FileEdit, JsonLinesParser, LaunchRequest, LaunchSpec, Transcript

__all__ = ["APPROVAL_KEY", "APPROVE", "GATEWAY_SERVER_NAME", "TOKEN_ENV", "CodexAdapter", "CodexParser", "unwrap_shell"]

#: The name the gateway has in Codex's ``mcp_servers`` table (the model sees its tools in the
#: ``mcp__memactors`` namespace, once Codex's ``tool_search`` has loaded them).
GATEWAY_SERVER_NAME = "memactors"
TOKEN_ENV = "MEMACTORS_RUN_TOKEN"
#: Codex's per-server approval setting, and the value that lets a headless run call the memory tools.
APPROVAL_KEY = "default_tools_approval_mode"
APPROVE = "approve"
_SHELLS = frozenset({"bash", "sh", "zsh", "dash"})


def _toml_string(value: str) -> str:
    """A TOML basic string for a ``-c key=value`` override (Codex parses the value as TOML)."""
    return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes


def unwrap_shell(command: str) -> str:
    """``bash -lc 'pytest -q'`` → ``pytest -q``: Codex reports commands as the shell argv it ran.

    Verify patterns match the command the agent meant, so the login-shell wrapper is dropped; any
    other form is returned unchanged.
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if len(argv) == 3 and os.path.basename(argv[0]) in _SHELLS and argv[1] in ("-c", "-lc"):
        return argv[2]
    return command


class CodexParser(JsonLinesParser):
    """Reads ``codex exec --json`` lines into a :class:`Transcript`; never raises on bad input."""

    def __init__(self) -> None:
        super().__init__()
        self.transcript = Transcript()
        #: Token usage summed over the turns seen (``turn.completed.usage``); zeros until one completes.
        self.usage: dict[str, int] = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}

    def _event(self, event: dict[str, Any], at: str) -> None:
        tr = self.transcript
        match event.get("type"):
            case "thread.started":
                if isinstance(event.get("thread_id"), str):
                    tr.session_id = event["thread_id"]
            case "item.started":
                item = event.get("item")
                if isinstance(item, dict) and item.get("type") == "command_execution":
                    command, item_id = item.get("command"), item.get("id")
                    if isinstance(command, str) and isinstance(item_id, str):
                        # Kept until its item.completed: a command Codex never reports the end of (it ran
                        # past Codex's command window) never finished, and the run record says so.
                        tr.running[item_id] = (len(tr.commands), CommandRun(
                            command=unwrap_shell(command), exit_code=None, at=at, finished=False))
            case "item.completed":
                item = event.get("item")
                if isinstance(item, dict):
                    self._item(item, at)
            case "turn.completed":
                usage = event.get("usage")
                if isinstance(usage, dict):
                    for key in self.usage:
                        value = usage.get(key)
                        if isinstance(value, int) and not isinstance(value, bool):
                            self.usage[key] += value
                tr.result_ok, tr.result_kind = True, "completed"
            case "turn.failed":
                tr.result_ok, tr.result_kind = False, "turn_failed"
            case "error":
                # A stream-level error; a later turn.completed (Codex retries) overrides it.
                tr.result_ok, tr.result_kind = False, "error"
            case _:
                pass  # turn.started, item.started/updated, plan deltas: nothing to record

    def _item(self, item: dict[str, Any], at: str) -> None:
        tr = self.transcript
        match item.get("type"):
            case "agent_message":
                # One model message: a turn and a text event in `runs logs`, as Claude Code's are.
                tr.turns += 1
                text = item.get("text")
                if isinstance(text, str) and text.strip():
                    tr.result_text = tr.last_text = text
                    tr.texts += 1
            case "command_execution":
                command = item.get("command")
                if not isinstance(command, str):
                    raise TypeError("command_execution.command is not a string")
                if isinstance(item.get("id"), str):
                    tr.running.pop(item["id"], None)
                code = item.get("exit_code")
                exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
                # "declined": Codex refused to run it, so it tested nothing (finished, no status); an end
                # without an exit status otherwise is a command that did not finish.
                finished = exit_code is not None or item.get("status") == "declined"
                tr.commands.append(CommandRun(command=unwrap_shell(command), exit_code=exit_code, at=at,
                                              finished=finished))
                tr.tool_calls.append("command_execution")
            case "file_change":
                tr.tool_calls.append("file_change")
                if item.get("status") != "completed":
                    return  # a patch that failed to apply wrote nothing
                for change in item.get("changes") or ():
                    if isinstance(change, dict) and isinstance(change.get("path"), str) and change["path"]:
                        tr.edits.append(FileEdit(path=change["path"], at=at))
            case "mcp_tool_call":
                server, tool = item.get("server"), item.get("tool")
                if isinstance(server, str) and isinstance(tool, str):
                    tr.tool_calls.append(f"mcp__{server}__{tool}")
            case "web_search":
                tr.tool_calls.append("web_search")
            case _:
                pass  # reasoning, todo_list, error items: not observations the record carries


class CodexAdapter:
    """``codex exec --json [--skip-git-repo-check] [-m model] [-s sandbox] [-c gateway…] <extra> -- <prompt>``."""

    name = "codex"
    default_command = "codex"

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        argv: list[str] = [request.command or self.default_command, "exec", "--json", "--skip-git-repo-check"]
        if request.model:
            argv += ["-m", request.model]
        if request.permission_mode:
            # Codex's permission knob is its sandbox: read-only | workspace-write | danger-full-access.
            argv += ["-s", request.permission_mode]
        env: dict[str, str] = {}
        if request.gateway_url:
            argv += ["-c", f"mcp_servers.{GATEWAY_SERVER_NAME}.url={_toml_string(request.gateway_url)}"]
            env["MEMACTORS_GATEWAY_URL"] = request.gateway_url
            if request.run_token:
                argv += ["-c", f"mcp_servers.{GATEWAY_SERVER_NAME}.bearer_token_env_var={_toml_string(TOKEN_ENV)}"]
            argv += ["-c", f"mcp_servers.{GATEWAY_SERVER_NAME}.{APPROVAL_KEY}={_toml_string(APPROVE)}"]
        if request.run_token:
            env[TOKEN_ENV] = request.run_token
        if request.mcp_config_path:
            env["MEMACTORS_MCP_CONFIG"] = request.mcp_config_path
        argv += list(request.extra_args)
        if request.prompt is not None:
            argv += ["--", request.prompt]
        return LaunchSpec(argv=tuple(argv), env=env)

    def parser(self) -> CodexParser:
        return CodexParser()
