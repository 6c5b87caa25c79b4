"""A real OpenAI-compatible HTTP server on loopback that tests and benchmarks control.

A remote LLM cannot run here, so the utility model (``[model_api]``) is faked — but as a real HTTP server on
127.0.0.1 with a port the kernel picks, served by hypercorn's trio worker, not as a patched function.
The client under test therefore goes through its real HTTP stack: connection handling, status codes,
JSON bodies, slow answers.

It serves the two endpoints memactors uses:

- ``POST /v1/chat/completions`` answers with ``behaviour.chat_reply`` as the assistant message's
  content (a JSON-able object is serialised; a ``str`` is sent as is, so tests can send non-JSON).
- ``POST /v1/embeddings`` answers with one deterministic, unit-length vector per input text of
  ``behaviour.embed_dim`` dimensions. ``embed_mode = "hash"`` derives each vector from a hash of the
  whole text (reproducible, but unrelated texts are unrelated); ``"bag_of_words"`` sums hashed word
  buckets, so texts sharing words are closer by cosine — useful for hybrid-ranking tests.

Every request's path, JSON body and Authorization header are kept in ``requests`` in arrival order.
The behaviour object is mutable: a test may change it between requests. Delays use ``trio.sleep`` in
the caller's trio run, so under ``autojump_clock`` they pass in virtual time.

Standalone, for benchmarks: ``python -m memactors.testing.fake_model_api --port 0`` prints its base URL
and serves until interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import trio

from ..net.asgi import http_request
from ._serve import serve_on_loopback

__all__ = [
    "FakeBehaviour",
    "FakeModelApi",
    "RecordedRequest",
    "embedding_for",
    "run_fake_model_api",
]

EmbedMode = Literal["hash", "bag_of_words"]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]


@attrs.define
class FakeBehaviour:
    """What the fake answers; mutable so a test can change it between requests.

    ``chat_raw_response`` / ``embed_raw_response``, when not None, replace the whole JSON response body
    (to serve malformed envelopes, wrong vector counts and the like).
    """

    chat_reply: object = attrs.field(factory=lambda: {"summary": "Fixed the flaky ledger test."})
    chat_status: int = 200
    chat_delay: float = 0.0
    chat_raw_response: object | None = None
    embed_status: int = 200
    embed_delay: float = 0.0
    embed_dim: int = 64
    embed_mode: EmbedMode = "hash"
    embed_raw_response: object | None = None


@attrs.frozen
class RecordedRequest:
    """One request the fake received: its path, parsed JSON body (None if not JSON) and auth header."""

    path: str
    body: Any
    authorization: str | None


@attrs.define
class FakeModelApi:
    """A running fake: where it listens, what it received, and how it behaves."""

    base_url: str
    behaviour: FakeBehaviour
    requests: list[RecordedRequest] = attrs.field(factory=list)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """The received requests whose path is ``path`` (e.g. ``"/v1/embeddings"``), in order."""
        return [r for r in self.requests if r.path == path]

    async def _app(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """The ASGI application: lifespan plus the two OpenAI-compatible endpoints."""
        got = await http_request(scope, receive, send)
        if got is None:
            return
        body, headers = got
        path = scope["path"]
        self.requests.append(RecordedRequest(path, body, headers.get("authorization")))
        b = self.behaviour
        if scope["method"] != "POST":
            await _respond(send, 405, {"error": {"message": "method not allowed"}})
        elif path == "/v1/chat/completions":
            await trio.sleep(b.chat_delay)
            if b.chat_status != 200:
                await _respond(send, b.chat_status, {"error": {"message": "fake chat failure"}})
            elif b.chat_raw_response is not None:
                await _respond(send, 200, b.chat_raw_response)
            else:
                await _respond(send, 200, _chat_completion(body, b.chat_reply))
        elif path == "/v1/embeddings":
            await trio.sleep(b.embed_delay)
            if b.embed_status != 200:
                await _respond(send, b.embed_status, {"error": {"message": "fake embeddings failure"}})
            elif b.embed_raw_response is not None:
                await _respond(send, 200, b.embed_raw_response)
            else:
                await _respond(send, 200, _embeddings(body, b.embed_dim, b.embed_mode))
        else:
            await _respond(send, 404, {"error": {"message": "not found"}})


async def _respond(send: _Send, status: int, payload: object) -> None:
    data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _chat_completion(body: Any, reply: object) -> dict[str, Any]:
    content = reply if isinstance(reply, str) else json.dumps(reply)
    model = body.get("model") if isinstance(body, dict) else None
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _embeddings(body: Any, dim: int, mode: EmbedMode) -> dict[str, Any]:
    inputs = body.get("input") if isinstance(body, dict) else None
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list):
        inputs = []
    return {
        "object": "list",
        "model": body.get("model") if isinstance(body, dict) else None,
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding_for(str(text), dim, mode)}
            for i, text in enumerate(inputs)
        ],
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }


_WORD = re.compile(r"\w+", re.UNICODE)


def embedding_for(text: str, dim: int, mode: EmbedMode = "hash") -> list[float]:
    """The fake's deterministic unit vector for ``text``; exposed so tests can predict rankings."""
    if mode == "bag_of_words":
        vector = [0.0] * dim
        for word in _WORD.findall(text.lower()):
            digest = hashlib.sha256(word.encode()).digest()
            bucket = int.from_bytes(digest[:4], "big") % dim
            vector[bucket] += 1.0 if digest[4] & 1 else -1.0
        if any(vector):
            return _normalise(vector)
    # Whole-text hash: expand sha256 blocks into dim values in [-1, 1).
    values: list[float] = []
    counter = 0
    seed = text.encode()
    while len(values) < dim:
        block = hashlib.sha256(seed + struct.pack(">I", counter)).digest()
        values.extend(v / 2**31 for v in struct.unpack(">8i", block))
        counter += 1
    return _normalise(values[:dim])


def _normalise(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


@asynccontextmanager
async def run_fake_model_api(*, behaviour: FakeBehaviour | None = None) -> AsyncIterator[FakeModelApi]:
    """Serve a fake model API on 127.0.0.1 (kernel-picked port) for the duration of the block.

    The server runs in a nursery inside the caller's trio run and is cancelled on exit, so in-flight
    slow answers never outlive the test.
    """
    fake = FakeModelApi(base_url="", behaviour=behaviour if behaviour is not None else FakeBehaviour())
    async with serve_on_loopback(fake._app) as url:
        fake.base_url = url
        yield fake


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m memactors.testing.fake_model_api``: serve until interrupted."""
    parser = argparse.ArgumentParser(description="Serve a fake OpenAI-compatible model API on loopback.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 picks a free one)")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--embed-mode", choices=["hash", "bag_of_words"], default="bag_of_words")
    parser.add_argument("--summary", default="Fixed the flaky ledger test.", help="summary the chat returns")
    args = parser.parse_args(argv)
    behaviour = FakeBehaviour(
        chat_reply={"summary": args.summary}, embed_dim=args.embed_dim, embed_mode=args.embed_mode
    )

    async def run() -> None:
        fake = FakeModelApi(base_url="", behaviour=behaviour)
        async with serve_on_loopback(fake._app, args.port) as url:
            print(url, flush=True)
            await trio.sleep_forever()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
