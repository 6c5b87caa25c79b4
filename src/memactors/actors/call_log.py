"""The call-log writer: REQ-18's call log written in batches, off the request path.

Provider calls and refused gateway calls each add one row to ``call_log``. Writing each row in its own
transaction put a disk write on every request (and let a caller flooding refused calls queue writes);
instead ``record()`` bounds the row's caller-supplied strings, hashes the arguments and puts the row in
a bounded in-memory queue without waiting, and ``run()`` writes what is queued in one transaction every
``interval`` seconds (0.1) or every ``batch`` rows (100), whichever comes first.

Durability, as docs/operations.md states it: a clean stop (SIGINT/SIGTERM, the service closing) writes
everything queued; a crash of the process (kill -9, power loss) loses at most the rows of the last
``interval`` — the call log is an audit aid, not a record of episodes. When the queue is full (the disk
is far behind), further rows are dropped and counted (``dropped``), never waited for.
"""

from __future__ import annotations

from typing import Any

import trio
from loguru import logger

from ..store import Store, call_log_row, insert_call_log_rows

__all__ = ["CallLog"]


class CallLog:
    """Batches call-log rows; start ``run`` in a nursery (the service supervises it)."""

    def __init__(self, store: Store, *, batch: int = 100, interval: float = 0.1, capacity: int = 10_000) -> None:
        self._store = store
        self._batch = batch
        self._interval = interval
        self._send, self._receive = trio.open_memory_channel[tuple[Any, ...] | trio.Event](capacity)
        self._in_hand: list[tuple[Any, ...]] = []
        self.dropped = 0
        self.written = 0
        self._log = logger.bind(actor="call_log")

    def record(self, *, at: str, caller: str, server: str, tool: str, arguments: Any, outcome: str,
               duration_ms: int) -> None:
        """Queue one row without waiting. Strings are bounded and stripped of control characters here,
        so a 1 MiB tool name costs 128 characters of queue and disk."""
        row = call_log_row(at=at, caller=caller, server=server, tool=tool, arguments=arguments,
                           outcome=outcome, duration_ms=duration_ms)
        try:
            self._send.send_nowait(row)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.dropped += 1

    async def flush(self) -> None:
        """Wait until every row recorded before this call is written (tests, doctor, a clean stop)."""
        done = trio.Event()
        await self._send.send(done)
        await done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                item = await self._receive.receive()
                waiters = self._take(item)
                with trio.move_on_after(self._interval):
                    while len(self._in_hand) < self._batch and not waiters:
                        waiters += self._take(await self._receive.receive())
                await self._write()
                for waiter in waiters:
                    waiter.set()
        finally:
            # A clean stop writes what is queued: shielded, bounded.
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + 5
                waiters = []
                while True:
                    try:
                        waiters += self._take(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                        break
                await self._write()
                for waiter in waiters:
                    waiter.set()

    def _take(self, item: tuple[Any, ...] | trio.Event) -> list[trio.Event]:
        if isinstance(item, trio.Event):
            return [item]
        self._in_hand.append(item)
        return []

    async def _write(self) -> None:
        rows, self._in_hand = self._in_hand, []
        if not rows:
            return
        try:
            await self._store.write(lambda db: insert_call_log_rows(db, rows))
            self.written += len(rows)
        except Exception as exc:  # the call log must never take the service down
            self.dropped += len(rows)
            self._log.bind(error=type(exc).__name__, rows=len(rows)).warning("call log write failed")
