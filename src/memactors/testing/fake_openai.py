"""A loopback fake of the OpenAI Responses streaming API, for running the real Codex CLI in tests.

The Codex CLI (``codex exec``) talks to its model over ``POST {base_url}/responses`` with
``"stream": true`` and reads server-sent events: ``response.created``, then for each output item
``response.output_item.added`` … (``response.output_text.delta`` for message text) …
``response.output_item.done``, and finally ``response.completed`` carrying the usage. A remote model
cannot run here, so this module serves that wire format from a real HTTP server on 127.0.0.1 (port
picked by the kernel, hypercorn's trio worker) and answers from a **script**: the n-th model call
gets the n-th :class:`Turn`'s output items. A session with a shell command, a file change and a
final answer is three turns::

    script = [
        Turn([ShellCall(["bash", "-lc", "pytest -q"])]),
        Turn([PatchCall("*** Begin Patch\\n*** Add File: notes.txt\\n+hi\\n*** End Patch\\n")]),
        Turn([Message("Done.")]),
    ]

Which tool names exist is up to the client: a Codex request lists them in ``tools`` (read
``FakeOpenAI.tool_names()``). :class:`FunctionCall` sends any function call by name;
:class:`ShellCall` and :class:`PatchCall` pick whatever shell / apply_patch tool the request offered,
as a function or a freeform ("custom") tool, so a script keeps working across Codex versions.

MCP tools are deferred in current Codex: the request offers a ``tool_search`` tool instead of the
MCP tools themselves, and a model first searches (a ``tool_search_call`` item; Codex answers with a
``tool_search_output`` listing ``namespace`` groups such as ``mcp__memactors``), then calls a tool as
a function call carrying that ``namespace``. :class:`ToolSearch` plays the first step and
:class:`McpToolCall` the second, addressing the tool by server and name; it calls the flat function
``mcp__<server>__<tool>`` instead when a request offers one (a Codex that does not defer MCP tools).

Every request body is recorded (``requests``) for assertions: the prompt the model was sent, the
tool outputs Codex returned, the tools it offered. When the script runs out the fake answers with a
plain message so the client ends its turn instead of hanging.

Standalone: ``python -m memactors.testing.fake_openai --port 0 --reply TEXT`` prints its base URL
(ending in ``/v1``) and answers every call with one message.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from ..net.asgi import http_request
from ._serve import send_json, serve_on_loopback

__all__ = [
    "FakeOpenAI",
    "FunctionCall",
    "McpToolCall",
    "Message",
    "PatchCall",
    "RecordedRequest",
    "ShellCall",
    "ToolSearch",
    "Turn",
    "run_fake_openai",
]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]

_SHELL_TOOLS = ("shell", "shell_command", "exec_command", "local_shell")
_PATCH_TOOLS = ("apply_patch",)


@attrs.frozen
class Message:
    """An assistant message with ``text`` (streamed as a few ``output_text`` deltas)."""

    text: str


@attrs.frozen
class FunctionCall:
    """A function tool call by exact ``name`` with JSON ``arguments``."""

    name: str
    arguments: dict[str, Any]


@attrs.frozen
class ShellCall:
    """Run ``command`` (an argv list) with whichever shell tool the request offered."""

    command: list[str]
    workdir: str | None = None
    #: How long the client may let the command run (Codex's `timeout_ms`, `yield_time_ms` for
    #: `exec_command`); None: the client's default (Codex: 10 s, which a loaded machine's pytest exceeds).
    timeout_ms: int | None = None


@attrs.frozen
class PatchCall:
    """Apply ``patch`` (Codex's ``*** Begin Patch`` format) with the request's apply_patch tool."""

    patch: str


@attrs.frozen
class ToolSearch:
    """Search the client's deferred tools (Codex's ``tool_search``) for ``query``."""

    query: str
    limit: int = 8


@attrs.frozen
class McpToolCall:
    """Call MCP tool ``tool`` of server ``server`` with JSON ``arguments``, however the client offers it."""

    server: str
    tool: str
    arguments: dict[str, Any]


Item = Message | FunctionCall | ShellCall | PatchCall | ToolSearch | McpToolCall


@attrs.frozen
class Turn:
    """One model call's answer: its output items, in order, and the usage it reports."""

    items: Sequence[Item]
    input_tokens: int = 100
    output_tokens: int = 20


@attrs.frozen
class RecordedRequest:
    """One request the fake received: method, path, JSON body (None if not JSON), auth header."""

    method: str
    path: str
    body: Any
    authorization: str | None


@attrs.define
class FakeOpenAI:
    """A running fake: its base URL (``http://127.0.0.1:<port>/v1``), script and what it received."""

    base_url: str
    script: list[Turn]
    fallback: str = "Nothing left in the script."
    requests: list[RecordedRequest] = attrs.field(factory=list)
    _ids: Any = attrs.field(factory=lambda: itertools.count(1))

    @property
    def model_calls(self) -> list[RecordedRequest]:
        """The ``POST …/responses`` requests, in order."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/responses")]

    def tool_names(self, index: int = 0) -> list[str]:
        """The tool names the ``index``-th model call offered (functions and freeform tools)."""
        body = self.model_calls[index].body or {}
        return [str(tool.get("name") or tool.get("type")) for tool in body.get("tools") or ()]

    def first_user_text(self, index: int = 0) -> str:
        """All ``input_text`` of the user messages in the ``index``-th model call, joined."""
        body = self.model_calls[index].body or {}
        parts = []
        for item in body.get("input") or ():
            if isinstance(item, dict) and item.get("role") == "user":
                for block in item.get("content") or ():
                    if isinstance(block, dict) and isinstance(block.get("text"), str):
                        parts.append(block["text"])
        return "\n".join(parts)

    def tool_outputs(self, index: int) -> list[str]:
        """The text of every tool result (``function_call_output``) the ``index``-th model call carried,
        in order; an output Codex sent as content parts (an MCP tool's result) is joined."""
        body = self.model_calls[index].body or {}
        outputs = []
        for item in body.get("input") or ():
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                output = item.get("output")
                if isinstance(output, list):
                    output = "\n".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
                outputs.append(str(output))
        return outputs

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}"

    async def _app(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        got = await http_request(scope, receive, send)
        if got is None:
            return
        body, headers = got
        path = scope["path"]
        self.requests.append(RecordedRequest(scope["method"], path, body, headers.get("authorization")))
        if scope["method"] == "GET" and path.endswith("/models"):
            await send_json(send, 200, {"object": "list", "data": []})
            return
        if scope["method"] != "POST" or not path.endswith("/responses"):
            await send_json(send, 404, {"error": {"message": f"not found: {path}", "type": "invalid_request_error"}})
            return
        if not isinstance(body, dict) or not body.get("stream"):
            await send_json(send, 400, {"error": {"message": "this fake serves only stream: true",
                                              "type": "invalid_request_error"}})
            return
        index = len(self.model_calls) - 1
        turn = self.script[index] if index < len(self.script) else Turn([Message(self.fallback)])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for event in self._events(turn, body):
            data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    # -- the SSE event sequence of one response --------------------------------------------------------
    def _events(self, turn: Turn, body: dict[str, Any]) -> list[dict[str, Any]]:
        response_id = self._next_id("resp")
        model = str(body.get("model") or "fake")
        response = {"id": response_id, "object": "response", "created_at": 1_700_000_000, "model": model,
                    "status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [{"type": "response.created", "response": dict(response)},
                                        {"type": "response.in_progress", "response": dict(response)}]
        offered = {str(tool.get("name") or tool.get("type")): tool for tool in body.get("tools") or ()}
        output = []
        for index, item in enumerate(turn.items):
            done = self._item(item, offered, body)
            output.append(done)
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**done, "status": "in_progress",
                                    **({"content": []} if done["type"] == "message" else {})}})
            if done["type"] == "message":
                events += _text_events(done, index)
            events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        usage = {"input_tokens": turn.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": turn.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": turn.input_tokens + turn.output_tokens}
        events.append({"type": "response.completed",
                       "response": {**response, "status": "completed", "output": output, "usage": usage}})
        for seq, event in enumerate(events):
            event["sequence_number"] = seq
        return events

    def _item(self, item: Item, offered: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        match item:
            case ToolSearch(query=query, limit=limit):
                if "tool_search" not in offered:
                    raise LookupError(f"the request offered no tool_search tool (tools: {sorted(offered)})")
                return {"type": "tool_search_call", "id": self._next_id("ts"), "call_id": self._next_id("call"),
                        "status": "completed", "execution": "client", "arguments": {"query": query, "limit": limit}}
            case McpToolCall(server=server, tool=tool, arguments=arguments):
                flat = f"mcp__{server}__{tool}"
                if flat in offered:
                    return self._function_call(flat, json.dumps(arguments))
                namespace = f"mcp__{server}"
                if tool not in _namespace_tools(body, namespace):
                    raise LookupError(f"neither {flat} nor {tool} in namespace {namespace} was offered "
                                      f"(tools: {sorted(offered)}; search with ToolSearch first)")
                return {**self._function_call(tool, json.dumps(arguments)), "namespace": namespace}
            case Message(text=text):
                return {"type": "message", "id": self._next_id("msg"), "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}
            case FunctionCall(name=name, arguments=arguments):
                return self._function_call(name, json.dumps(arguments))
            case ShellCall(command=command, workdir=workdir, timeout_ms=timeout_ms):
                shell = next((n for n in _SHELL_TOOLS if n in offered), None)
                if shell is None:
                    raise LookupError(f"the request offered no shell tool (tools: {sorted(offered)})")
                args: dict[str, Any]
                if shell == "shell_command":
                    args = {"command": command[-1] if command[:2] in (["bash", "-lc"], ["bash", "-c"]) else
                            " ".join(command)}
                elif shell == "exec_command":
                    args = {"cmd": command[-1] if command[:2] in (["bash", "-lc"], ["bash", "-c"]) else
                            " ".join(command)}
                else:
                    args = {"command": command}
                if workdir:
                    args["workdir"] = workdir
                if timeout_ms is not None:
                    args["yield_time_ms" if shell == "exec_command" else "timeout_ms"] = timeout_ms
                return self._function_call(shell, json.dumps(args))
            case PatchCall(patch=patch):
                patch_tool = offered.get("apply_patch")
                if patch_tool is None:
                    raise LookupError(f"the request offered no apply_patch tool (tools: {sorted(offered)})")
                if patch_tool.get("type") == "custom":
                    return {"type": "custom_tool_call", "id": self._next_id("ctc"), "call_id": self._next_id("call"),
                            "name": "apply_patch", "input": patch, "status": "completed"}
                return self._function_call("apply_patch", json.dumps({"input": patch}))
        raise TypeError(f"unknown script item {item!r}")

    def _function_call(self, name: str, arguments: str) -> dict[str, Any]:
        return {"type": "function_call", "id": self._next_id("fc"), "call_id": self._next_id("call"), "name": name,
                "arguments": arguments, "status": "completed"}


def _namespace_tools(body: dict[str, Any], namespace: str) -> set[str]:
    """Names of the functions in ``namespace`` that the request's tools or an earlier tool_search_output
    in its input made available."""
    groups = [*(body.get("tools") or ())]
    for item in body.get("input") or ():
        if isinstance(item, dict) and item.get("type") == "tool_search_output":
            groups += item.get("tools") or ()
    return {str(fn.get("name")) for group in groups if isinstance(group, dict) and group.get("type") == "namespace"
            and group.get("name") == namespace for fn in group.get("tools") or () if isinstance(fn, dict)}


def _text_events(done: dict[str, Any], index: int) -> list[dict[str, Any]]:
    text = done["content"][0]["text"]
    item_id = done["id"]
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[dict[str, Any]] = [{"type": "response.content_part.added", "item_id": item_id,
                                     "output_index": index, "content_index": 0, "part": part}]
    step = max(1, len(text) // 3)
    for start in range(0, len(text), step):
        events.append({"type": "response.output_text.delta", "item_id": item_id, "output_index": index,
                       "content_index": 0, "delta": text[start:start + step]})
    events.append({"type": "response.output_text.done", "item_id": item_id, "output_index": index,
                   "content_index": 0, "text": text})
    events.append({"type": "response.content_part.done", "item_id": item_id, "output_index": index,
                   "content_index": 0, "part": {**part, "text": text}})
    return events


@asynccontextmanager
async def run_fake_openai(script: Sequence[Turn] = (), *, port: int = 0) -> AsyncIterator[FakeOpenAI]:
    """Serve the fake on 127.0.0.1 for the duration of the block; ``base_url`` ends in ``/v1``."""
    fake = FakeOpenAI(base_url="", script=list(script))
    async with serve_on_loopback(fake._app, port) as url:
        fake.base_url = url + "/v1"
        yield fake


def main(argv: list[str] | None = None) -> None:
    """``python -m memactors.testing.fake_openai``: serve a one-message fake until interrupted."""
    parser = argparse.ArgumentParser(description="Serve a fake OpenAI Responses API on loopback.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 picks a free one)")
    parser.add_argument("--reply", default="Hello from the fake model.", help="the message every call answers")
    args = parser.parse_args(argv)

    async def run() -> None:
        async with run_fake_openai(port=args.port) as fake:
            fake.fallback = args.reply
            print(fake.base_url, flush=True)
            await trio.sleep_forever()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
