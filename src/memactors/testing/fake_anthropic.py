"""A real loopback server speaking the Anthropic Messages API, playing a scripted agent session.

The real ``claude`` CLI cannot reach a model here, so the model is faked — as a real HTTP server on
127.0.0.1 (a kernel-picked port, hypercorn's trio worker) that ``claude`` reaches through
``ANTHROPIC_BASE_URL``, never as a patched function. It speaks the wire format the CLI reads:

- ``POST /v1/messages`` with ``"stream": true``: server-sent events ``message_start``,
  ``content_block_start`` / ``content_block_delta`` (``text_delta``, or ``input_json_delta`` for a
  ``tool_use`` block) / ``content_block_stop``, ``message_delta`` (``stop_reason``) and ``message_stop``;
  without ``stream``: one JSON message.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``.
- anything else the CLI asks for at start: an empty JSON object (200), recorded like the rest so a test
  can see what the CLI asked for.

The session is a :class:`Script` of turns. A request that offers tools (the agent loop) gets the next
scripted turn — the turn index is the number of tool calls already in the conversation (the CLI
merges consecutive assistant turns into one message), so a retried request gets the same answer — and a request without tools (titles, topic checks, the CLI's
side calls) gets a short plain text. Every request's path, JSON body and headers are kept in
``requests`` in arrival order.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs

from ..net.asgi import http_request
from ._serve import send_json, serve_on_loopback

__all__ = ["FakeAnthropic", "Request", "Script", "Text", "ToolUse", "run_fake_anthropic"]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]

MODEL = "claude-fake-1"


@attrs.frozen
class ToolUse:
    """A turn in which the model calls one tool with ``input``."""

    name: str
    input: dict[str, Any]


@attrs.frozen
class Text:
    """A turn in which the model answers with ``text`` and ends its turn."""

    text: str


@attrs.frozen
class Script:
    """The turns the model plays, in order; past the end it repeats the last text turn — or, with
    ``loop``, plays the turns again from the start forever (an agent that never finishes, for caps)."""

    turns: tuple[ToolUse | Text, ...]
    model: str = MODEL
    loop: bool = False


@attrs.frozen
class Request:
    """One request the fake received."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]

    @property
    def agent_turn(self) -> bool:
        """True for the agent loop's requests (they offer tools)."""
        return isinstance(self.body, dict) and bool(self.body.get("tools"))

    def first_user_text(self) -> str:
        """All text of the conversation's first user message (what the CLI sent as the prompt)."""
        messages = self.body.get("messages", []) if isinstance(self.body, dict) else []
        for message in messages:
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        return ""

    def tool_names(self) -> list[str]:
        tools = self.body.get("tools", []) if isinstance(self.body, dict) else []
        return [str(t.get("name")) for t in tools if isinstance(t, dict)]

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool_result block the conversation carries, in order."""
        messages = self.body.get("messages", []) if isinstance(self.body, dict) else []
        out = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                out += [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        return out


@attrs.define
class FakeAnthropic:
    """A running fake: its base URL (for ``ANTHROPIC_BASE_URL``), the script and what it received."""

    base_url: str
    script: Script
    requests: list[Request] = attrs.field(factory=list)

    def agent_requests(self) -> list[Request]:
        """The agent loop's turns (``POST /v1/messages`` offering tools), in order."""
        return [r for r in self.requests if r.path.rstrip("/") == "/v1/messages" and r.agent_turn]

    async def _app(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        got = await http_request(scope, receive, send)
        if got is None:
            return
        body, headers = got
        request = Request(scope["method"], scope["path"], body, headers)
        self.requests.append(request)
        path = scope["path"].rstrip("/")
        if scope["method"] == "POST" and path == "/v1/messages/count_tokens":
            await send_json(send, 200, {"input_tokens": _rough_tokens(body)})
        elif scope["method"] == "POST" and path == "/v1/messages":
            blocks, stop = self._answer(request)
            if isinstance(body, dict) and body.get("stream"):
                await _stream(send, self.script.model, blocks, stop)
            else:
                await send_json(send, 200, _message(self.script.model, blocks, stop))
        else:
            await send_json(send, 200, {})

    def _answer(self, request: Request) -> tuple[list[dict[str, Any]], str]:
        if not request.agent_turn:
            return [{"type": "text", "text": "ok"}], "end_turn"
        # The CLI merges consecutive assistant turns into one message, so count tool calls, not messages.
        messages = request.body.get("messages", [])
        index = sum(1 for m in messages if m.get("role") == "assistant" and isinstance(m.get("content"), list)
                    for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use")
        turns = self.script.turns
        played = index % len(turns) if self.script.loop else index
        turn = turns[played] if played < len(turns) else next(
            (t for t in reversed(turns) if isinstance(t, Text)), Text("done"))
        if isinstance(turn, Text):
            return [{"type": "text", "text": turn.text}], "end_turn"
        tool_id = f"toolu_fake_{index:02d}"
        return [{"type": "tool_use", "id": tool_id, "name": turn.name, "input": turn.input}], "tool_use"


def _rough_tokens(body: Any) -> int:
    return max(1, len(json.dumps(body)) // 4) if body is not None else 1


_USAGE = {"input_tokens": 120, "output_tokens": 24, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _message(model: str, blocks: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
    # stop is None in a stream's message_start: the reason comes with message_delta
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop, "stop_sequence": None, "usage": _USAGE}


async def _stream(send: _Send, model: str, blocks: Sequence[dict[str, Any]], stop: str) -> None:
    """One assistant message as the Messages API streams it (server-sent events)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

    async def event(name: str, data: dict[str, Any]) -> None:
        chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    start = _message(model, [], None)
    start["usage"] = {**_USAGE, "output_tokens": 1}
    await event("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            await event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": {"type": "text", "text": ""}})
            text = block["text"]
            for part in (text[: len(text) // 2], text[len(text) // 2:]):
                await event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                     "delta": {"type": "text_delta", "text": part}})
        else:
            await event("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})
            partial = json.dumps(block["input"])
            for part in (partial[: len(partial) // 2], partial[len(partial) // 2:]):
                await event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                     "delta": {"type": "input_json_delta", "partial_json": part}})
        await event("content_block_stop", {"type": "content_block_stop", "index": index})
    await event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": _USAGE["output_tokens"]}})
    await event("message_stop", {"type": "message_stop"})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@asynccontextmanager
async def run_fake_anthropic(script: Script) -> AsyncIterator[FakeAnthropic]:
    """Serve the fake on 127.0.0.1 (kernel-picked port) for the duration of the block."""
    fake = FakeAnthropic(base_url="", script=script)
    async with serve_on_loopback(fake._app) as url:
        fake.base_url = url
        yield fake
