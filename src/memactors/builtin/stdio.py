"""The built-in provider served over stdio (`memactors provider serve-builtin --stdio`), so it can be
configured as an `[mcp.<name>]` upstream and exercised exactly as a third-party one.

Split out of `builtin/__init__.py`: the provider's contract and ranking are there; this is its wire.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import mcp.types as mt
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from ..store.engines import open_store
from . import BuiltinProvider, Embedder


async def serve_builtin_stdio(target: Path | str, *, embedder: Embedder | None = None,
                              embedding_model: str | None = None) -> None:
    """Serve the built-in provider over stdio on the store at `target` (a SQLite file, or a
    ``postgresql://`` store URL: its documents then live in that database, `builtin.index_pg`) until stdin
    closes.

    `memactors provider serve-builtin --stdio` runs this, so the built-in provider can be configured as
    an `[mcp.<name>]` upstream (and exercised exactly as a third-party one).

    The wire is read and written with non-blocking pipes on trio's own I/O loop (`_wire`), not the SDK's
    `stdio_server` and its file wrappers, which run every line read and every write and
    flush in a worker thread: one request at a time went through stdin that way, and a queued backlog
    drained at ~150 records/s (docs/benchmarks.md, "drain"). As the SDK does, fd 0 and 1 are moved off
    the wire while serving (to the null device and to stderr), so nothing a handler prints can corrupt it.
    """
    store = await open_store(target, daemon_id="serve-builtin")
    try:
        provider = BuiltinProvider(store, embedder=embedder, embedding_model=embedding_model)
        server = provider.server(validate_requests=True)
        with _claimed_stdio() as (wire_in, wire_out):
            async with _wire(wire_in, wire_out) as (read, write), trio.open_nursery() as nursery:
                if provider.hybrid and await provider.check_vectors():
                    await nursery.start(provider.embed_worker)  # vectors in the background (REQ-11)
                await server.run(read, write, server.create_initialization_options())
                nursery.cancel_scope.cancel()
    finally:
        store.close()


@contextmanager
def _claimed_stdio() -> Iterator[tuple[int, int]]:
    """Private duplicates of fd 0 and 1 (the wire), with fd 0 pointed at the null device and fd 1 at
    stderr meanwhile; restored on exit."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.close(null)
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


@asynccontextmanager
async def _wire(wire_in: int, wire_out: int) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]]:
    """The MCP session's (read, write) streams over the wire's pipes (fds this closes on exit), as the
    SDK's `stdio_server` makes them: each line read is one JSON-RPC message (a line that is not one
    reaches the session as its error), each message written is one line, one `send_all`."""
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    async with trio.lowlevel.FdStream(wire_in) as stdin, _closing_quietly(trio.lowlevel.FdStream(wire_out)) as stdout:

        async def reader() -> None:
            with contextlib.suppress(anyio.ClosedResourceError):  # the session closed its end first
                async with read_writer:
                    async for line in _lines(stdin):
                        message: SessionMessage | Exception
                        try:
                            message = SessionMessage(mt.jsonrpc_message_adapter.validate_json(line, by_name=False))
                        except ValueError as exc:  # pydantic's ValidationError: the session answers it
                            message = exc
                        await read_writer.send(message)

        async def writer() -> None:
            with contextlib.suppress(anyio.ClosedResourceError):
                async with write_reader:
                    async for session_message in write_reader:
                        data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        await stdout.send_all((data + "\n").encode("utf-8"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(writer)
            yield read_stream, write_stream


async def _lines(stream: trio.lowlevel.FdStream) -> AsyncIterator[str]:
    """The non-blank lines of newline-delimited JSON-RPC on a pipe, read in chunks."""
    buffer = b""
    while True:
        chunk = await stream.receive_some(1 << 16)
        if not chunk:
            if buffer.strip():
                yield buffer.decode("utf-8", "replace")
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", "replace")


@asynccontextmanager
async def _closing_quietly(stream: trio.lowlevel.FdStream) -> AsyncIterator[trio.lowlevel.FdStream]:
    """`stream`, closed on exit; a pipe the reader already closed is no error then."""
    try:
        yield stream
    finally:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.aclose()
