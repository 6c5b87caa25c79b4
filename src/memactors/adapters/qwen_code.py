"""The ``qwen-code`` adapter: Qwen Code (``@qwen-code/qwen-code``, a Gemini CLI fork) as a one-shot run.

``qwen --output-format stream-json [--model M] [--approval-mode MODE] --mcp-config FILE [extra]``, the prompt
on stdin (a prompt argument after ``--`` is ignored by its argument parser, and one starting with ``-``
would be read as a flag), the gateway comes from the run's MCP config file in Qwen Code's own format (:meth:`QwenCodeAdapter.mcp_config`:
``httpUrl`` is its streamable-HTTP transport; the ``url`` Claude Code's format uses would be SSE). The model
endpoint is the user's own (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` or their settings).

Its ``stream-json`` is Claude Code's shape (``system``/``init``, ``assistant`` messages with ``text`` and
``tool_use`` blocks, ``user`` messages with ``tool_result`` blocks, a final ``result``) carrying Gemini
CLI's tools (``write_file``/``edit``/``replace`` with ``file_path``, ``run_shell_command`` with ``command``),
so :class:`QwenCodeParser` reads each block as the Gemini CLI stream event it is and lets Gemini CLI's
reader keep the facts. A shell command that exited non-zero is an ``is_error`` result whose text still
has its ``Exit Code: N`` line: a command that finished, with that status. Qwen Code reports no cost.
"""

from __future__ import annotations

import re
from typing import Any

from . import LaunchRequest, LaunchSpec, json_object
from .gemini_cli import GATEWAY_SERVER_NAME, GeminiCliParser

__all__ = ["QwenCodeAdapter", "QwenCodeParser", "qwen_event"]

_EXIT = re.compile(r"^Exit Code: (-?\d+)\s*$", re.MULTILINE)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return ""


def qwen_event(event: dict[str, Any]) -> list[dict[str, Any]]:
    """One Qwen Code ``stream-json`` line as the Gemini CLI stream events it stands for."""
    kind = event.get("type")
    message = json_object(event.get("message"))
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if kind == "system" and event.get("subtype") == "init":
        return [{"type": "init", "session_id": event.get("session_id"), "model": event.get("model")}]
    if kind == "assistant":
        out: list[dict[str, Any]] = []
        if isinstance(message.get("model"), str):
            out.append({"type": "init", "model": message["model"]})
        for block in blocks:
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                out.append({"type": "message", "role": "assistant", "content": block["text"]})
            elif block.get("type") == "tool_use":
                out.append({"type": "tool_use", "tool_name": block.get("name"), "tool_id": block.get("id"),
                            "parameters": json_object(block.get("input"))})
        return out
    if kind == "user":
        out = []
        for block in blocks:
            if block.get("type") != "tool_result":
                continue
            text = _text(block.get("content"))
            finished = not block.get("is_error") or bool(_EXIT.search(text))
            out.append({"type": "tool_result", "tool_id": block.get("tool_use_id"),
                        "status": "success" if finished else "error", "output": text})
        return out
    if kind == "result":
        usage = json_object(event.get("usage"))
        ok = event.get("subtype") == "success" and not event.get("is_error")
        stats = {k: usage[k] for k in ("input_tokens", "output_tokens", "total_tokens") if isinstance(usage.get(k), int)}
        if isinstance(event.get("duration_ms"), int):
            stats["duration_ms"] = event["duration_ms"]
        return [{"type": "result", "status": "success" if ok else "error", "stats": stats}]
    return []


class QwenCodeParser(GeminiCliParser):
    """Reads ``qwen --output-format stream-json`` lines into a :class:`~memactors.adapters.Transcript`."""

    def _event(self, event: dict[str, Any], at: str) -> None:
        for translated in qwen_event(event):
            super()._event(translated, at)


class QwenCodeAdapter:
    """``qwen --output-format stream-json …``, the prompt on stdin."""

    name = "qwen-code"
    default_command = "qwen"

    @staticmethod
    def mcp_config(gateway_url: str, token: str) -> dict[str, Any]:
        """The run's ``--mcp-config`` file in Qwen Code's format (see the module docstring)."""
        return {"mcpServers": {GATEWAY_SERVER_NAME: {"httpUrl": gateway_url, "trust": True,
                                                     "headers": {"Authorization": f"Bearer {token}"}}}}

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        argv: list[str] = [request.command or self.default_command, "--output-format", "stream-json"]
        if request.model:
            argv += ["--model", request.model]
        if request.permission_mode:
            # Qwen Code's approval modes: plan | default | auto-edit | auto | yolo.
            argv += ["--approval-mode", request.permission_mode]
        if request.mcp_config_path:
            argv += ["--mcp-config", request.mcp_config_path]
        argv += list(request.extra_args)
        # The prompt on stdin (Qwen Code reads it there when no prompt argument is given): a prompt that
        # starts with "-" is never read as a flag, and it stays out of argv, which `ps` shows.
        return LaunchSpec(argv=tuple(argv), stdin=request.prompt)

    def parser(self) -> QwenCodeParser:
        return QwenCodeParser()
