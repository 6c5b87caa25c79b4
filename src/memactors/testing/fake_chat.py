"""A loopback fake of the OpenAI-compatible Chat Completions API, for the agent CLIs that speak it.

Qwen Code (its ``openai`` auth type with ``OPENAI_BASE_URL``), pi and GitHub Copilot CLI's bring-your-own
model reach an "OpenAI-compatible endpoint": ``POST {base_url}/chat/completions``. A remote model cannot
run here, so this module serves that wire format from a real HTTP server on 127.0.0.1 (a kernel-picked
port, hypercorn's trio worker), playing a **script** of turns:

- with ``"stream": true``: server-sent ``data: {chat.completion.chunk}`` lines (the role, the text in a
  few ``delta.content`` pieces or each tool call as one ``delta.tool_calls`` entry, a ``finish_reason``
  of ``stop`` or ``tool_calls``, a usage chunk) and ``data: [DONE]``;
- without: one ``chat.completion`` object;
- ``GET …/models``: one model, the one the client asked for last (or ``fake-chat``).

A request offering ``tools`` is the agent loop: it gets the turn whose index is the number of assistant
messages already in the conversation (so a retried request gets the same answer). A request without
tools (a title, a summary, a next-speaker check) gets a short plain text. Past the script's end the
fake answers :attr:`FakeChat.fallback`. Every request is recorded (``requests``) for assertions.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs

from ..net.asgi import http_request
from ._serve import send_json, serve_on_loopback

__all__ = ["Call", "ChatRequest", "FakeChat", "Reply", "Step", "run_fake_chat"]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]


@attrs.frozen
class Reply:
    """A turn in which the model answers ``text`` and stops."""

    text: str


@attrs.frozen
class Call:
    """A tool call by ``name``; ``name`` may end in ``*`` to call the first offered tool whose name starts so
    (an MCP tool's prefix differs between CLIs: ``mcp__memactors__recall``, ``memactors__recall``, …) or
    list alternatives separated by ``|`` (the first the request offers is called)."""

    name: str
    arguments: dict[str, Any]


@attrs.frozen
class Step:
    """One model call's answer: text and/or tool calls, and the usage it reports."""

    items: Sequence[Reply | Call]
    prompt_tokens: int = 100
    completion_tokens: int = 20


@attrs.frozen
class ChatRequest:
    """One request the fake received."""

    method: str
    path: str
    body: Any
    authorization: str | None

    @property
    def offers_tools(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("tools"))

    def tool_names(self) -> list[str]:
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        return [str((t.get("function") or {}).get("name")) for t in tools or () if isinstance(t, dict)]

    def tool_results(self) -> list[str]:
        """The content of every ``role: tool`` message of the conversation, in order."""
        messages = self.body.get("messages") if isinstance(self.body, dict) else None
        out = []
        for message in messages or ():
            if isinstance(message, dict) and message.get("role") == "tool":
                content = message.get("content")
                out.append(content if isinstance(content, str) else json.dumps(content))
        return out


def _resolve(name: str, offered: list[str]) -> str:
    for option in name.split("|"):
        if option.endswith("*"):
            found = next((n for n in offered if n.startswith(option[:-1])), None)
            if found:
                return found
        elif option in offered:
            return option
    return name.split("|")[0].rstrip("*")


@attrs.define
class FakeChat:
    """A running fake: its base URL (``http://127.0.0.1:<port>/v1``), script and what it received."""

    base_url: str
    script: list[Step]
    fallback: str = "Nothing left in the script."
    model: str = "fake-chat"
    requests: list[ChatRequest] = attrs.field(factory=list)
    _ids: Any = attrs.field(factory=lambda: itertools.count(1))

    def agent_requests(self) -> list[ChatRequest]:
        """The agent loop's ``POST …/chat/completions`` requests (they offer tools), in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions") and r.offers_tools]

    async def _app(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        got = await http_request(scope, receive, send)
        if got is None:
            return
        body, headers = got
        path = scope["path"]
        request = ChatRequest(scope["method"], path, body, headers.get("authorization"))
        self.requests.append(request)
        if scope["method"] == "GET" and path.endswith("/models"):
            await send_json(send, 200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}]})
            return
        if scope["method"] != "POST" or not path.endswith("/chat/completions") or not isinstance(body, dict):
            await send_json(send, 404, {"error": {"message": f"not found: {path}", "type": "invalid_request_error"}})
            return
        model = str(body.get("model") or self.model)
        if request.offers_tools:
            index = sum(1 for m in body.get("messages") or () if isinstance(m, dict) and m.get("role") == "assistant")
            step = self.script[index] if index < len(self.script) else Step([Reply(self.fallback)])
        else:
            step = Step([Reply("ok")])
        text = "".join(i.text for i in step.items if isinstance(i, Reply))
        calls = [{"id": f"call_{next(self._ids):04d}", "type": "function",
                  "function": {"name": _resolve(i.name, request.tool_names()), "arguments": json.dumps(i.arguments)}}
                 for i in step.items if isinstance(i, Call)]
        finish = "tool_calls" if calls else "stop"
        usage = {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens,
                 "total_tokens": step.prompt_tokens + step.completion_tokens}
        completion_id = f"chatcmpl-{next(self._ids):04d}"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            await send_json(send, 200, {"id": completion_id, "object": "chat.completion", "created": 1_700_000_000,
                                    "model": model, "choices": [{"index": 0, "message": message,
                                                                 "finish_reason": finish}], "usage": usage})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
            payload = {"id": completion_id, "object": "chat.completion.chunk", "created": 1_700_000_000,
                       "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                       **extra}
            return f"data: {json.dumps(payload)}\n\n".encode()

        pieces = [chunk({"role": "assistant", "content": ""})]
        for start in range(0, len(text), 16):
            pieces.append(chunk({"content": text[start:start + 16]}))
        for n, call in enumerate(calls):
            pieces.append(chunk({"tool_calls": [{"index": n, **call}]}))
        pieces.append(chunk({}, finish))
        pieces.append(f"data: {json.dumps({'id': completion_id, 'object': 'chat.completion.chunk', 'created': 1_700_000_000, 'model': model, 'choices': [], 'usage': usage})}\n\n".encode())  # noqa: E501
        pieces.append(b"data: [DONE]\n\n")
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@asynccontextmanager
async def run_fake_chat(script: Sequence[Step] = (), *, port: int = 0) -> AsyncIterator[FakeChat]:
    """Serve the fake on 127.0.0.1 for the duration of the block; ``base_url`` ends in ``/v1``."""
    fake = FakeChat(base_url="", script=list(script))
    async with serve_on_loopback(fake._app, port) as url:
        fake.base_url = url + "/v1"
        yield fake
