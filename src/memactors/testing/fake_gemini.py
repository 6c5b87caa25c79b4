"""A loopback fake of the Gemini API (``generativelanguage`` v1beta), for running the real Gemini CLI in tests.

The Gemini CLI (``@google/gemini-cli``, through the ``@google/genai`` SDK) talks to its model over
``POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`` with a JSON body ``{contents,
systemInstruction, tools: [{functionDeclarations: [...]}], generationConfig}`` and the key in the
``x-goog-api-key`` header; it reads server-sent events, one ``data: {candidates: [{content: {role:
"model", parts: [...]}, finishReason}], usageMetadata, modelVersion, responseId}`` per chunk. A part
is ``{"text": …}`` or ``{"functionCall": {"name", "args", "id"?}}``; the CLI answers a function call
in the next request with a ``user`` content holding ``{"functionResponse": {"name", "id"?,
"response": {...}}}``. Side calls (``:generateContent`` without tools: the model router's classifier,
a title; ``:countTokens``) are answered too. ``GOOGLE_GEMINI_BASE_URL`` points the CLI here (its
"gateway" auth type: the base URL wins over the real endpoint; ``GEMINI_API_KEY`` is still sent).

The session is a script of :class:`Turn` values. A request that offers tools (the agent loop) gets the
turn whose index is the number of model function calls already in its ``contents`` — so a retried
request gets the same answer, as in ``fake_anthropic`` — and a request without tools gets a short
JSON-or-text answer. :class:`FunctionCall` calls a tool by its exact name; :class:`McpToolCall` finds
the declaration the CLI made of MCP server ``server``'s tool ``tool`` (Gemini CLI 0.61 names it
``mcp_<server>_<tool>``; an older bare ``<tool>`` is accepted too). Every request is kept in
``requests``.

Standalone: ``python -m memactors.testing.fake_gemini --port 0 --reply TEXT`` prints its base URL and
answers every call with one text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from ..net.asgi import http_request
from ._serve import send_json, serve_on_loopback

__all__ = ["FakeGemini", "FunctionCall", "GeminiRequest", "McpToolCall", "Text", "Turn", "run_fake_gemini"]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]

#: The model version every answer reports (``modelVersion``): what the CLI shows as the model served.
MODEL_VERSION = "gemini-fake-1"


@attrs.frozen
class Text:
    """The model answers ``text`` and ends its turn (``finishReason: STOP``)."""

    text: str


@attrs.frozen
class FunctionCall:
    """The model calls the function declared as ``name`` with ``args``."""

    name: str
    args: dict[str, Any]


@attrs.frozen
class McpToolCall:
    """The model calls MCP server ``server``'s tool ``tool`` under whatever name the CLI declared it."""

    server: str
    tool: str
    args: dict[str, Any]


@attrs.frozen
class Turn:
    """One model answer: its parts, in order, and the usage it reports."""

    parts: Sequence[Text | FunctionCall | McpToolCall]
    prompt_tokens: int = 100
    output_tokens: int = 20


@attrs.frozen
class GeminiRequest:
    """One request the fake received: method, path (with the ``:method`` suffix), JSON body, headers."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]

    @property
    def agent_turn(self) -> bool:
        """True for the agent loop's requests (they declare functions)."""
        return bool(self.function_names())

    def function_names(self) -> list[str]:
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        return [str(d.get("name")) for t in tools or () if isinstance(t, dict)
                for d in t.get("functionDeclarations") or () if isinstance(d, dict)]

    def contents(self) -> list[dict[str, Any]]:
        contents = self.body.get("contents") if isinstance(self.body, dict) else None
        return [c for c in contents or () if isinstance(c, dict)]

    def first_user_text(self) -> str:
        """The text parts of the conversation's first user content (the prompt the CLI sent)."""
        for content in self.contents():
            if content.get("role") == "user":
                return "\n".join(str(p["text"]) for p in content.get("parts") or ()
                                 if isinstance(p, dict) and isinstance(p.get("text"), str))
        return ""

    def function_responses(self) -> list[dict[str, Any]]:
        """Every ``functionResponse`` part of the conversation, in order."""
        return [p["functionResponse"] for c in self.contents() for p in c.get("parts") or ()
                if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)]

    def model_calls_so_far(self) -> int:
        return sum(1 for c in self.contents() if c.get("role") == "model" for p in c.get("parts") or ()
                   if isinstance(p, dict) and "functionCall" in p)


@attrs.define
class FakeGemini:
    """A running fake: its base URL (for ``GOOGLE_GEMINI_BASE_URL``), the script and what it received."""

    base_url: str
    script: list[Turn]
    fallback: str = "Nothing left in the script."
    requests: list[GeminiRequest] = attrs.field(factory=list)

    def agent_requests(self) -> list[GeminiRequest]:
        """The agent loop's model calls (``streamGenerateContent`` declaring functions), in order."""
        return [r for r in self.requests if r.path.endswith(":streamGenerateContent") and r.agent_turn]

    async def _app(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        got = await http_request(scope, receive, send)
        if got is None:
            return
        body, headers = got
        path = scope["path"]
        request = GeminiRequest(scope["method"], path, body, headers)
        self.requests.append(request)
        try:
            await self._reply(scope["method"], path, body, request, send)
        except LookupError as exc:
            # A script calling a tool the CLI did not declare: 400, which Gemini CLI does not retry (a 500
            # would be retried ten times over minutes), with the tools it did declare in the message.
            await send_json(send, 400, {"error": {"code": 400, "message": str(exc), "status": "INVALID_ARGUMENT"}})

    async def _reply(self, method: str, path: str, body: Any, request: GeminiRequest, send: _Send) -> None:
        if method == "POST" and path.endswith(":countTokens"):
            await send_json(send, 200, {"totalTokens": max(1, len(json.dumps(body)) // 4)})
        elif method == "POST" and path.endswith(":streamGenerateContent"):
            chunks = self._answer(request)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
            for chunk in chunks:
                await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\r\n\r\n".encode(),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif method == "POST" and path.endswith(":generateContent"):
            chunks = self._answer(request)
            parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
            await send_json(send, 200, {**chunks[-1], "candidates": [{**chunks[-1]["candidates"][0],
                                                                  "content": {"role": "model", "parts": parts}}]})
        elif method == "POST" and path.endswith(":embedContent"):
            await send_json(send, 200, {"embedding": {"values": [0.0] * 8}})
        else:
            await send_json(send, 404, {"error": {"code": 404, "message": f"not found: {path}", "status": "NOT_FOUND"}})

    def _answer(self, request: GeminiRequest) -> list[dict[str, Any]]:
        """The response chunks for one model call."""
        if not request.agent_turn:
            return [_chunk([{"text": _side_answer(request.body)}], "STOP", Turn(()))]
        index = request.model_calls_so_far()
        turn = self.script[index] if index < len(self.script) else Turn([Text(self.fallback)])
        parts: list[dict[str, Any]] = []
        for n, item in enumerate(turn.parts):
            match item:
                case Text(text=text):
                    half = max(1, len(text) // 2)
                    parts += [{"text": text[:half]}, {"text": text[half:]}] if len(text) > 1 else [{"text": text}]
                case FunctionCall(name=name, args=args):
                    parts.append({"functionCall": {"name": name, "args": args, "id": f"call_{index:02d}_{n}"}})
                case McpToolCall(server=server, tool=tool, args=args):
                    name = _mcp_name(request.function_names(), server, tool)
                    parts.append({"functionCall": {"name": name, "args": args, "id": f"call_{index:02d}_{n}"}})
        # Text streams as a chunk per part; the last chunk carries the finish reason and the usage.
        chunks = [_chunk([p], None, turn) for p in parts[:-1]]
        chunks.append(_chunk(parts[-1:], "STOP", turn))
        return chunks


def _mcp_name(declared: list[str], server: str, tool: str) -> str:
    for name in (f"mcp_{server}_{tool}", f"{server}__{tool}", tool):
        if name in declared:
            return name
    raise LookupError(f"no declaration of MCP tool {tool} of server {server} (declared: {sorted(declared)})")


def _side_answer(body: Any) -> str:
    """A request without tools: one asking for JSON (``responseMimeType``; the model router's classifier)
    gets an object that fits its schema, any other ``ok``."""
    config = body.get("generationConfig") if isinstance(body, dict) else None
    if isinstance(config, dict) and config.get("responseMimeType") == "application/json":
        schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
        return json.dumps(_fitting(schema))
    return "ok"


def _fitting(schema: Any) -> Any:
    """A small value of a JSON schema's type: the first enum value, an object with its required keys."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            props = {}
        return {key: _fitting(props.get(key)) for key in schema.get("required") or props}
    return {"string": "a scripted test session", "number": 10, "integer": 10, "boolean": False,
            "array": []}.get(kind)


def _chunk(parts: list[dict[str, Any]], finish: str | None, turn: Turn) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    usage = {"promptTokenCount": turn.prompt_tokens, "candidatesTokenCount": turn.output_tokens if finish else 0,
             "totalTokenCount": turn.prompt_tokens + (turn.output_tokens if finish else 0)}
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": MODEL_VERSION,
            "responseId": "resp-fake"}


@asynccontextmanager
async def run_fake_gemini(script: Sequence[Turn] = (), *, port: int = 0) -> AsyncIterator[FakeGemini]:
    """Serve the fake on 127.0.0.1 for the duration of the block; ``base_url`` has no path."""
    fake = FakeGemini(base_url="", script=list(script))
    async with serve_on_loopback(fake._app, port) as url:
        fake.base_url = url
        yield fake


def main(argv: list[str] | None = None) -> None:
    """``python -m memactors.testing.fake_gemini``: serve a one-text fake until interrupted."""
    parser = argparse.ArgumentParser(description="Serve a fake Gemini API on loopback.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 picks a free one)")
    parser.add_argument("--reply", default="Hello from the fake model.", help="the text every call answers")
    args = parser.parse_args(argv)

    async def run() -> None:
        async with run_fake_gemini(port=args.port) as fake:
            fake.fallback = args.reply
            print(fake.base_url, flush=True)
            await trio.sleep_forever()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
