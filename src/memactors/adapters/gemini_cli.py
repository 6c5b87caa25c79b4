"""The ``gemini-cli`` adapter: ``gemini --output-format stream-json --debug --skip-trust … --prompt <prompt>``.

argv: ``<command> --output-format stream-json --debug --skip-trust [--model M] [--approval-mode M]
[--allowed-tools <memory tools>] [extra_args...] --prompt <prompt>``; the prompt is the last element
(REQ-16). Gemini CLI 0.61 reads a positional prompt only on a terminal, so ``--prompt`` carries it; a
prompt that starts with ``-`` (which yargs would read as a flag) is given as ``--prompt=<prompt>``.
``--skip-trust`` trusts the working directory for this session only: an untrusted folder turns the
approval mode back to ``default`` and ignores the workspace settings. ``--debug`` is what makes the
stream say how a shell command ended: without it a ``tool_result`` carries the command's output only,
with it the text the model gets (``Output: …`` / ``Exit Code: N`` / ``Process Group PGID: …``); its
debug log goes to stderr, of which the run keeps the redacted 4 KiB tail.

The gateway: Gemini CLI has no ``--mcp-config`` flag, but reads its **system settings file** from
``GEMINI_CLI_SYSTEM_SETTINGS_PATH``, and the run's MCP config file (``{"mcpServers": {"memactors":
{"type": "http", "url", "headers"}}}``) is valid Gemini settings as it is: so that variable names it.
System settings win over the user's and the project's, so the run's own token is the one sent even
where ``memactors install gemini-cli`` put a resident's ``memactors`` server in the user settings. In
headless mode a tool the policy would ask about is refused, so the memory tools are passed to
``--allowed-tools`` (Gemini CLI names an MCP tool ``mcp_<server>_<tool>``).

The stream is Gemini CLI's JSON lines (``--output-format stream-json``), one object per line:

* ``{"type": "init", "session_id", "model"}`` — the session and the model asked for;
* ``{"type": "message", "role": "user", "content"}`` — the prompt: read past, never kept;
* ``{"type": "message", "role": "assistant", "content", "delta": true}`` — the model's text, in
  pieces; the pieces of one answer are joined (one text event per answer in ``runs logs``);
* ``{"type": "tool_use", "tool_name", "tool_id", "parameters"}`` — ``write_file`` and ``replace``
  (``file_path``) are edits once their result succeeds, ``run_shell_command`` (``command``) a shell
  command, an MCP tool ``mcp_<server>_<tool>``;
* ``{"type": "tool_result", "tool_id", "status": "success"|"error", "output"?, "error"?}`` — a shell
  command's exit status: N from its ``Exit Code: N`` line, 0 from an ``Output:`` text without one,
  **unknown** for an error, a cancel or a timeout (it did not finish: no verify event);
* ``{"type": "error", "severity", "message"}`` — a loop, a turn limit, an invalid answer;
* ``{"type": "result", "status": "success"|"error", "stats": {input_tokens, output_tokens,
  total_tokens, duration_ms, tool_calls, models: {<model served>: …}}}`` — the agent's verdict and
  its token usage (Gemini CLI reports no cost).

Only these facts are kept; a line that is not JSON (debug text) or not one of these is skipped.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import CommandRun, FileEdit, JsonLinesParser, LaunchRequest, LaunchSpec, Transcript, json_object

__all__ = ["GATEWAY_SERVER_NAME", "SETTINGS_ENV", "GeminiCliAdapter", "GeminiCliParser", "memory_tools",
           "shell_exit_status"]

GATEWAY_SERVER_NAME = "memactors"
#: The variable naming Gemini CLI's system settings file (the run's MCP config file).
SETTINGS_ENV = "GEMINI_CLI_SYSTEM_SETTINGS_PATH"
_EDIT_TOOLS = {"write_file": "file_path", "replace": "file_path", "edit": "file_path"}
_SHELL_TOOLS = frozenset({"run_shell_command"})
_EXIT = re.compile(r"^Exit Code: (-?\d+)\s*$", re.MULTILINE)
_EXITED = re.compile(r"\ACommand exited with code: (-?\d+)")


def memory_tools(server: str = GATEWAY_SERVER_NAME) -> tuple[str, ...]:
    """The gateway's tools as Gemini CLI names them."""
    return (f"mcp_{server}_recall", f"mcp_{server}_briefing")


def shell_exit_status(result: Mapping[str, object]) -> int | None:
    """A ``run_shell_command`` result's exit status (see the module docstring); None when unknown."""
    if result.get("status") != "success":
        return None
    output = result.get("output")
    if not isinstance(output, str):
        return None
    match = _EXIT.search(output)
    if match:
        return int(match.group(1))
    match = _EXITED.match(output)
    if match:
        return int(match.group(1))
    # --debug: the model's text starts "Output:"; a cancelled or timed-out command's says so instead.
    return 0 if output.startswith("Output:") else None


class GeminiCliParser(JsonLinesParser):
    """Reads ``gemini --output-format stream-json`` lines into a :class:`Transcript`; never raises."""

    def __init__(self) -> None:
        super().__init__()
        self.transcript = Transcript()
        #: Token usage from the result event's stats (zeros until it arrives).
        self.usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        self._calls: dict[str, tuple[str, Mapping[str, object]]] = {}   # tool_id -> (tool name, parameters)
        self._text: list[str] = []   # the pieces of the answer being streamed
        self._in_turn = False   # the last event was the model's (text or a tool call)

    def _event(self, event: dict[str, Any], at: str) -> None:
        t = self.transcript
        kind = event.get("type")
        is_text = kind == "message" and event.get("role") == "assistant"
        if not is_text:
            self._end_text()
        model_side = is_text or kind == "tool_use"
        if model_side and not self._in_turn:
            t.turns += 1
        self._in_turn = model_side
        if kind == "init":
            t.session_id = _str(event.get("session_id")) or t.session_id
            t.model = _str(event.get("model")) or t.model
        elif is_text:
            content = event.get("content")
            if isinstance(content, str):
                if not event.get("delta"):
                    self._end_text()
                self._text.append(content)
        elif kind == "tool_use":
            name, tool_id = _str(event.get("tool_name")), _str(event.get("tool_id"))
            if name is None:
                return
            t.tool_calls.append(name)
            params = json_object(event.get("parameters"))
            if tool_id:
                self._calls[tool_id] = (name, params)
        elif kind == "tool_result":
            tool_id = _str(event.get("tool_id"))
            if tool_id is None or tool_id not in self._calls:
                return
            name, params = self._calls.pop(tool_id)
            if name in _EDIT_TOOLS and event.get("status") == "success":
                path = _str(params.get(_EDIT_TOOLS[name]))
                if path:
                    t.edits.append(FileEdit(path, at))
            elif name in _SHELL_TOOLS:
                command = _str(params.get("command"))
                if command:
                    t.commands.append(CommandRun(command, shell_exit_status(event), at))
        elif kind == "error":
            if event.get("severity") == "error":
                t.result_kind = "error"
        elif kind == "result":
            status = _str(event.get("status"))
            t.result_ok = status == "success" and t.result_kind != "error"
            t.result_kind = "success" if t.result_ok else (t.result_kind or status or "error")
            stats = json_object(event.get("stats"))
            for key in self.usage:
                value = stats.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    self.usage[key] = value
            duration_ms = stats.get("duration_ms")
            if isinstance(duration_ms, int):
                t.duration_ms = duration_ms
            models = stats.get("models")
            if isinstance(models, dict) and models:
                t.model = str(list(models)[-1])  # the model that served (the last one used)

    def _end_text(self) -> None:
        """The answer being streamed is complete: one text, and the result text so far."""
        if not self._text:
            return
        text, self._text = "".join(self._text), []
        if text.strip():
            t = self.transcript
            t.texts += 1
            t.last_text = t.result_text = text


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _check_settings_path(path: Path) -> None:
    """Refuse, naming the directory, a run whose MCP config Gemini CLI would skip: it ignores a system
    settings file below a directory that group or others may write ("Parent directory '/tmp' is
    insecure"), silently — the agent would run without its memory tools. The state directory decides
    where the file is, so the fix is `[store] path`."""
    for parent in path.parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                f"gemini-cli skips a settings file below a directory others may write ({parent}, mode "
                f"{stat.S_IMODE(mode):o}), so this run's MCP config {path} would be ignored and the agent would "
                "have no memory tools: set [store] path to a directory whose parents only their owner may write",
                key="store.path", value=str(parent))


class GeminiCliAdapter:
    """``gemini --output-format stream-json --debug --skip-trust … --prompt <prompt>``."""

    name = "gemini-cli"
    default_command = "gemini"

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        argv: list[str] = [request.command or self.default_command, "--output-format", "stream-json", "--debug",
                           "--skip-trust"]
        if request.model:
            argv += ["--model", request.model]
        if request.permission_mode:
            # Gemini CLI's approval modes: default | auto_edit | yolo | plan.
            argv += ["--approval-mode", request.permission_mode]
        tools = tuple(dict.fromkeys((*request.allowed_tools, *memory_tools())))
        argv += ["--allowed-tools", ",".join(tools)]
        env: dict[str, str] = {}
        if request.mcp_config_path:
            _check_settings_path(Path(request.mcp_config_path))
            env[SETTINGS_ENV] = request.mcp_config_path
        argv += list(request.extra_args)
        if request.prompt is not None:
            if request.prompt.startswith("-"):
                argv.append(f"--prompt={request.prompt}")
            else:
                argv += ["--prompt", request.prompt]
        return LaunchSpec(argv=tuple(argv), env=env)

    def parser(self) -> GeminiCliParser:
        return GeminiCliParser()
