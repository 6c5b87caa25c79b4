"""The ``pi`` adapter: pi (``@mariozechner/pi-coding-agent``) as a one-shot run, and its event reader.

``pi --mode json -e <run extension> [--model M] [extra] -p <prompt>``: pi has no MCP client, so the run's
"MCP config" is memactors' pi extension (``adapters/pi_extension``; :meth:`PiAdapter.mcp_config` gives its
text, which the runs actor writes, mode 0600, beside the other runs' configs): it registers ``recall`` and
``briefing`` as pi tools that call the gateway through ``memactors hook pi tool`` with the run's own URL and
token (``MEMACTORS_GATEWAY_URL`` / ``MEMACTORS_RUN_TOKEN``, set for every run). The model is the user's (a
provider in ``~/.pi/agent/models.json`` or a built-in one, ``--model``).

pi's ``--mode json`` stream and its session files carry the same entries: a ``session`` header (``id``,
``cwd``), and messages (``message_end`` in the stream, ``message`` in the file): an assistant's ``toolCall``
and ``text`` blocks (``model``), a ``toolResult`` (``toolCallId``, ``isError``, its text). :func:`pi_event`
reads each as the Gemini CLI stream events it stands for (``write``/``edit`` with a ``path`` are edits,
``bash`` a command whose status is its ``Command exited with code N`` line, 0 for a result that is not an
error), and Gemini CLI's reader keeps the facts. pi reports costs only for priced models; none is kept.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from . import LaunchRequest, LaunchSpec, json_object
from .gemini_cli import GeminiCliParser
from .pi_extension import extension_source

__all__ = ["PiAdapter", "PiParser", "pi_event"]

_TOOLS = {"write": "write_file", "edit": "write_file", "bash": "run_shell_command"}
_EXIT = re.compile(r"Command exited with code (-?\d+)\s*\Z")


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def pi_event(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """One pi stream event or session-file entry as Gemini CLI stream events (see the module docstring)."""
    if entry.get("type") == "session" and _str(entry.get("id")):
        return [{"type": "init", "session_id": entry["id"]}]
    message = entry.get("message") if entry.get("type") in ("message", "message_end") else None
    if not isinstance(message, dict):
        return []
    blocks = [b for b in message.get("content") or () if isinstance(b, dict)]
    out: list[dict[str, Any]] = []
    if message.get("role") == "assistant":
        if _str(message.get("model")):
            out.append({"type": "init", "model": message["model"]})
        text = "".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
        if text.strip():
            out.append({"type": "message", "role": "assistant", "content": text})
        for block in blocks:
            if block.get("type") != "toolCall" or not _str(block.get("id")) or not _str(block.get("name")):
                continue
            arguments = json_object(block.get("arguments"))
            name = _TOOLS.get(block["name"], block["name"])
            params = {"file_path": arguments.get("path")} if name == "write_file" else arguments
            out.append({"type": "tool_use", "tool_name": name, "tool_id": block["id"], "parameters": params})
    elif message.get("role") == "toolResult" and _str(message.get("toolCallId")):
        text = "".join(b.get("text", "") for b in blocks if isinstance(b.get("text"), str))
        exited = _EXIT.search(text)
        code = int(exited.group(1)) if exited else (None if message.get("isError") else 0)
        result: dict[str, Any] = {"type": "tool_result", "tool_id": message["toolCallId"],
                                  "status": "error" if message.get("isError") and code is None else "success"}
        if code is not None:
            result["output"] = f"Exit Code: {code}"
        out.append(result)
    return out


class PiParser(GeminiCliParser):
    """Reads ``pi --mode json`` lines into a :class:`~memactors.adapters.Transcript`; never raises."""

    def _event(self, event: dict[str, Any], at: str) -> None:
        for translated in pi_event(event):
            super()._event(translated, at)
        if event.get("type") == "agent_end":
            super()._event({"type": "session_end"}, at)
            self.transcript.result_ok = self.transcript.result_kind != "error"
            self.transcript.result_kind = self.transcript.result_kind or "success"


class PiAdapter:
    """``pi --mode json -e <run extension> … -p <prompt>``."""

    name = "pi"
    default_command = "pi"
    #: The run's "MCP config" is a TypeScript extension (pi loads it by its suffix).
    mcp_config_suffix = ".ts"

    @staticmethod
    def mcp_config(gateway_url: str, token: str) -> str:
        """The run's extension: the memory tools through ``memactors hook pi tool``, which reads this run's
        gateway and token from its environment (never from the file: it holds neither)."""
        return extension_source(f"{sys.executable} -m memactors.cli hook pi tool", "")

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        argv: list[str] = [request.command or self.default_command, "--mode", "json"]
        if request.mcp_config_path:
            argv += ["-e", request.mcp_config_path]
        if request.model:
            argv += ["--model", request.model]
        argv += list(request.extra_args)
        if request.prompt is not None:
            argv += ["-p", request.prompt]
        return LaunchSpec(argv=tuple(argv))

    def parser(self) -> PiParser:
        return PiParser()
