"""The ``opencode`` adapter: ``opencode run --format json --dir <workdir> --title … [-m M]``, the prompt on stdin.

argv: ``<command> run --format json --dir <workdir> --title "memactors run <id>" [--model M]
[--auto] [extra_args...]``; the prompt (the fenced briefing, then the configured prompt: REQ-16) is
written to its stdin, which is then closed. Not an argument: OpenCode 1.18 joins its message arguments
with spaces and re-quotes each one that contains a space (``"…"``, every ``"`` inside escaped as ``\"``),
so the model would get the prompt in quotes with the fence's attributes escaped; what it reads from a
stdin that is not a terminal it sends as it is (with no message argument, the message is stdin's text).
``--dir`` names the working directory (OpenCode takes its project from ``$PWD``, which a daemon's
child inherits from the daemon, so ``PWD`` is set too); ``--title`` spares a model call that would
only title the session; ``permission_mode = "auto"`` passes ``--auto`` (approve every permission not
explicitly denied). The model is ``provider/model`` as OpenCode writes it.

The gateway: OpenCode merges the JSON in ``OPENCODE_CONFIG_CONTENT`` over its configuration files,
so the run's MCP server is given there — ``{"mcp": {"memactors": {"type": "remote", "url", "headers":
{"Authorization": "Bearer {env:MEMACTORS_RUN_TOKEN}"}, "oauth": false}}}`` — and OpenCode reads the
token from the environment itself: it is in no argv and no file. Its tools are ``memactors_recall``
and ``memactors_briefing``.

The stream is ``opencode run --format json``'s JSON lines, each with ``type``, ``timestamp`` (ms),
``sessionID`` and a ``part``:

* ``step_start`` — a model call begins (one turn);
* ``text`` — ``part.text``, one whole text of the model (a turn's answer);
* ``tool_use`` — ``part.tool`` with ``part.state`` (``status`` ``completed`` | ``error``, ``input``,
  ``output``, ``metadata``): ``write`` / ``edit`` / ``multiedit`` (``input.filePath``) and
  ``apply_patch`` (the files its patch adds, updates or deletes) are edits when completed; ``bash``
  (``input.command``) a shell command whose exit status is ``state.metadata.exit`` (unknown for an
  error: it did not finish); an MCP tool is ``<server>_<tool>``;
* ``step_finish`` — ``part.reason`` (``tool-calls``, ``stop``, …), ``part.tokens`` and ``part.cost``
  (USD, computed by OpenCode from the model's configured prices): summed over the run;
* ``error`` — ``error.name`` and ``error.data.message``: the run failed.

Only these facts are kept (never the prompt, tool output or reasoning); other lines are skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from . import CommandRun, FileEdit, JsonLinesParser, LaunchRequest, LaunchSpec, Transcript, json_object

__all__ = ["CONFIG_ENV", "GATEWAY_SERVER_NAME", "TOKEN_ENV", "OpenCodeAdapter", "OpenCodeParser", "gateway_config"]

GATEWAY_SERVER_NAME = "memactors"
TOKEN_ENV = "MEMACTORS_RUN_TOKEN"
CONFIG_ENV = "OPENCODE_CONFIG_CONTENT"
_EDIT_TOOLS = {"write": "filePath", "edit": "filePath", "multiedit": "filePath"}
_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$", re.MULTILINE)


def gateway_config(url: str, token: str) -> dict[str, Any]:
    """The gateway's entry in OpenCode's ``mcp`` table; ``token`` may be an ``{env:VAR}`` reference."""
    return {"type": "remote", "url": url, "headers": {"Authorization": f"Bearer {token}"}, "oauth": False,
            "enabled": True}


class OpenCodeParser(JsonLinesParser):
    """Reads ``opencode run --format json`` lines into a :class:`Transcript`; never raises."""

    def __init__(self) -> None:
        super().__init__()
        self.transcript = Transcript()
        #: Token usage summed over the steps (``step_finish.part.tokens``).
        self.usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0}
        self._cost = 0.0
        self._costed = False

    def _event(self, event: dict[str, Any], at: str) -> None:
        t = self.transcript
        t.session_id = t.session_id or _str(event.get("sessionID"))
        part = json_object(event.get("part"))
        match event.get("type"):
            case "step_start":
                t.turns += 1
            case "text":
                text = part.get("text")
                if isinstance(text, str) and text.strip():
                    t.texts += 1
                    t.last_text = t.result_text = text
            case "tool_use":
                self._tool(part, at)
            case "step_finish":
                tokens = json_object(part.get("tokens"))
                for key, field in (("input_tokens", "input"), ("output_tokens", "output"),
                                   ("reasoning_tokens", "reasoning")):
                    value = tokens.get(field)
                    if isinstance(value, int) and not isinstance(value, bool):
                        self.usage[key] += value
                cost = part.get("cost")
                if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
                    self._cost += float(cost)
                    self._costed = True
                    t.cost_usd = self._cost
                reason = part.get("reason")
                if reason in ("stop", "length", "content-filter", "end-turn"):
                    if t.result_ok is None:
                        t.result_ok, t.result_kind = True, "completed"
                    if reason != "stop":
                        t.result_kind = str(reason)
            case "error":
                error = json_object(event.get("error"))
                t.result_ok, t.result_kind = False, _str(error.get("name")) or "error"
            case _:
                pass

    def _tool(self, part: Mapping[str, object], at: str) -> None:
        t = self.transcript
        name = _str(part.get("tool"))
        if name is None:
            return
        t.tool_calls.append(name)
        state = json_object(part.get("state"))
        status = state.get("status")
        tool_input = json_object(state.get("input"))
        if name in _EDIT_TOOLS:
            path = _str(tool_input.get(_EDIT_TOOLS[name]))
            if path and status == "completed":
                t.edits.append(FileEdit(path, at))
        elif name == "apply_patch":
            patch = tool_input.get("patchText") or tool_input.get("patch") or tool_input.get("input")
            if isinstance(patch, str) and status == "completed":
                t.edits += [FileEdit(path, at) for path in _PATCH_FILE.findall(patch)]
        elif name == "bash":
            command = _str(tool_input.get("command"))
            if command is None:
                return
            metadata = json_object(state.get("metadata"))
            code = metadata.get("exit")
            exit_code = code if status == "completed" and isinstance(code, int) and not isinstance(code, bool) \
                else None
            t.commands.append(CommandRun(command, exit_code, at))


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


class OpenCodeAdapter:
    """``opencode run --format json --dir <workdir> --title … [-m M] [--auto] <extra> -- <prompt>``."""

    name = "opencode"
    default_command = "opencode"

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        argv: list[str] = [request.command or self.default_command, "run", "--format", "json",
                           "--dir", request.workdir, "--title", f"memactors run {request.run_id}"]
        if request.model:
            argv += ["--model", request.model]
        if request.permission_mode == "auto":
            argv.append("--auto")
        env: dict[str, str] = {"PWD": request.workdir}
        if request.gateway_url:
            token = f"{{env:{TOKEN_ENV}}}" if request.run_token else ""
            server = gateway_config(request.gateway_url, token)
            if not request.run_token:
                server.pop("headers")
            env[CONFIG_ENV] = json.dumps({"mcp": {GATEWAY_SERVER_NAME: server}})
        if request.run_token:
            env[TOKEN_ENV] = request.run_token
        argv += list(request.extra_args)
        return LaunchSpec(argv=tuple(argv), env=env, stdin=request.prompt)

    def parser(self) -> OpenCodeParser:
        return OpenCodeParser()
