"""The built-in provider served over stdio (`memactors provider serve-builtin --stdio`), so it can be
configured as an `[mcp.<name>]` upstream and exercised exactly as a third-party one.

Split out of `builtin/__init__.py`: the provider's contract and ranking are there; this is its wire.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from ..store.engines import open_store
from . import BuiltinProvider, Embedder


async def serve_builtin_stdio(target: Path | str, *, embedder: Embedder | None = None,
                              embedding_model: str | None = None) -> None:
    """Serve the built-in provider over stdio on the store at `target` (a SQLite file, or a
    ``postgresql://`` store URL: its documents then live in that database, `builtin.index_pg`) until stdin
    closes.

    `memactors provider serve-builtin --stdio` runs this, so the built-in provider can be configured as
    an `[mcp.<name>]` upstream (and exercised exactly as a third-party one).

    The wire is read and written with non-blocking pipes on trio's own I/O loop (`_PipeLines` /
    `_PipeWriter`), not the SDK's default file wrappers, which run every line read and every write and
    flush in a worker thread: one request at a time went through stdin that way, and a queued backlog
    drained at ~150 records/s (docs/benchmarks.md, "drain"). As the SDK does, fd 0 and 1 are moved off
    the wire while serving (to the null device and to stderr), so nothing a handler prints can corrupt it.
    """
    from mcp.server.stdio import stdio_server

    store = await open_store(target, daemon_id="serve-builtin")
    try:
        server = BuiltinProvider(store, embedder=embedder, embedding_model=embedding_model).server(
            validate_requests=True)
        with _claimed_stdio() as (wire_in, wire_out):
            async with _PipeLines(wire_in) as stdin, _PipeWriter(wire_out) as stdout, \
                    stdio_server(stdin=stdin, stdout=stdout) as (read, write):  # type: ignore[arg-type]
                await server.run(read, write, server.create_initialization_options())
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


class _PipeLines:
    """`async for line in …` over a pipe: the lines of newline-delimited JSON-RPC, read in chunks."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.lowlevel.FdStream(fd)  # owns and closes fd

    async def __aenter__(self) -> _PipeLines:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stream.aclose()

    async def __aiter__(self) -> AsyncIterator[str]:
        buffer = b""
        while True:
            chunk = await self._stream.receive_some(1 << 16)
            if not chunk:
                if buffer.strip():
                    yield buffer.decode("utf-8", "replace")
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield line.decode("utf-8", "replace")


class _PipeWriter:
    """`write` / `flush` as the SDK's stdout writer calls them, one `send_all` per message."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.lowlevel.FdStream(fd)

    async def __aenter__(self) -> _PipeWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._stream.aclose()

    async def write(self, text: str) -> None:
        await self._stream.send_all(text.encode("utf-8"))

    async def flush(self) -> None:
        return None
