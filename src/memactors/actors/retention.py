"""The retention actor: pending records and forgets, retried with backoff for 24 hours (REQ-10, REQ-13).

Every episode the index stores arrives here as a `pending` row written in the same transaction, so an
acknowledged run is never lost: this actor records it to the provider from the stored copy, now and
after every failure with growing backoff, across daemon restarts (the rows live in SQLite and times are
wall-clock), until it succeeds or 24 hours have passed since the first attempt, when the row is marked
`failed` (record_failed / forget_failed in `memory status`).

Backoff waits use `trio.sleep` (MockClock in tests) and the wall clock decides what is due.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import attrs
import sqlite_utils
import trio
from loguru import logger

from .._kernel import Address, open_mailbox, serve
from .._wire import parse_time
from ..errors import MemactorsError
from ..metrics import Metrics
from ..store import Store, WallClock, iso
from .index import IndexIds
from .provider_session import provider_call

RETRY_WINDOW = timedelta(hours=24)
FIRST_BACKOFF = 5.0
MAX_BACKOFF = 3600.0
IDLE_POLL = 60.0


def backoff_seconds(attempts: int) -> float:
    """Delay before attempt `attempts + 1`: 5 s, 10 s, 20 s … capped at one hour."""
    return min(FIRST_BACKOFF * (2 ** max(attempts - 1, 0)), MAX_BACKOFF)


@attrs.frozen
class RecordNow:
    """Try to record this episode now (the caller's deadline bounds the wait); answers the outcome."""

    episode_id: str


@attrs.frozen
class Kick:
    """Something became due: look at the pending rows now."""


@attrs.frozen
class PendingCounts:
    """Ask for {(kind, state): count} for the configured provider."""


@attrs.frozen
class Attempt:
    kind: str
    episode_id: str
    provider_id: str


class Retention:
    def __init__(
        self,
        *,
        store: Store,
        provider: str,
        provider_address: Address[Any],
        index_address: Address[Any],
        metrics: Metrics,
        wall_clock: WallClock,
        provider_timeout: float,
    ) -> None:
        self._store = store
        self._provider = provider
        self._provider_address = provider_address
        self._index = index_address
        self._metrics = metrics
        self._clock = wall_clock
        self._provider_timeout = provider_timeout
        self._wake = trio.Event()
        self._inflight: set[tuple[str, str, str]] = set()
        self.address, self._mailbox = open_mailbox("retention", 32)
        self._log = logger.bind(actor="retention", provider=provider)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._loop)
            task_status.started(self.address)
            await serve(self._mailbox, self._handle, concurrency=8)
            nursery.cancel_scope.cancel()

    async def _handle(self, message: object) -> object:
        match message:
            case RecordNow(episode_id=episode_id):
                return await self._attempt(Attempt("record", episode_id, ""))
            case Kick():
                self._wake.set()
                return None
            case PendingCounts():
                return await self.counts()
            case _:
                raise TypeError(f"retention cannot handle {type(message).__name__}")

    async def counts(self) -> dict[str, int]:
        rows = await self._store.read(lambda db: db.execute(
            "SELECT kind, state, count(*) FROM pending WHERE provider = ? GROUP BY kind, state",
            [self._provider]).fetchall())
        out = {f"{kind}_{state}": n for kind, state, n in rows}
        for kind in ("record", "forget"):
            self._metrics.set_pending(self._provider, kind, out.get(f"{kind}_pending", 0))
        return out

    # -- the retry loop -------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._wake = trio.Event()
            due = await self._due()
            for attempt in due:
                await self._attempt(attempt)
            await self.counts()
            with trio.move_on_after(IDLE_POLL if not due else 0.5):
                await self._wake.wait()

    async def _due(self) -> list[Attempt]:
        now = iso(self._clock())
        rows = await self._store.read(lambda db: db.execute(
            "SELECT kind, episode_id, provider_id FROM pending WHERE provider = ? AND state = 'pending'"
            " AND next_at <= ? ORDER BY next_at LIMIT 100", [self._provider, now]).fetchall())
        return [Attempt(k, e, p) for k, e, p in rows]

    async def _attempt(self, attempt: Attempt) -> str:
        key = (attempt.kind, attempt.episode_id, attempt.provider_id)
        if key in self._inflight:
            return "in_flight"
        self._inflight.add(key)
        try:
            if attempt.kind == "record":
                return await self._record(attempt.episode_id)
            return await self._forget(attempt.episode_id, attempt.provider_id)
        finally:
            self._inflight.discard(key)

    async def _record(self, episode_id: str) -> str:
        row = await self._store.read(lambda db: db.execute(
            "SELECT body, text, scope, trust_class, forgotten_at FROM episodes WHERE episode_id = ?",
            [episode_id]).fetchone())
        if row is None or row[0] is None or row[4] is not None:
            await self._store.write(lambda db: db.execute(
                "DELETE FROM pending WHERE kind = 'record' AND provider = ? AND episode_id = ?",
                [self._provider, episode_id]))
            return "gone"
        body, text, scope, trust_class, _ = row
        log = self._log.bind(episode=episode_id)
        arguments = {"episode_id": episode_id, "scope": scope, "trust_class": trust_class,
                     "episode": json.loads(body), "text": text}
        try:
            with trio.fail_after(max(self._provider_timeout * 5, 5.0)):
                payload = await provider_call(self._provider_address, "memory_record_episode", arguments)
            ids = tuple(str(i) for i in payload["ids"])
            await self._index.ask(IndexIds(self._provider, episode_id, ids))
        except (MemactorsError, trio.TooSlowError) as exc:
            self._metrics.episode_recorded(self._provider, "error")
            state = await self._failed("record", episode_id, "", exc)
            log.bind(error=type(exc).__name__, detail=str(exc)[:200], state=state).warning("episode record failed")
            return state
        self._metrics.episode_recorded(self._provider, "ok")
        log.bind(ids=len(ids)).info("episode recorded")
        return "recorded"

    async def _forget(self, episode_id: str, provider_id: str) -> str:
        # Filled in with REQ-10 forgetting; a forget row without a handler stays pending, never lost.
        return "pending"

    async def _failed(self, kind: str, episode_id: str, provider_id: str, exc: BaseException) -> str:
        now = self._clock()
        message = f"{type(exc).__name__}: {str(exc)[:300]}"

        def write(db: sqlite_utils.Database) -> str:
            row = db.execute(
                "SELECT attempts, first_at FROM pending WHERE kind = ? AND provider = ? AND episode_id = ?"
                " AND provider_id = ?", [kind, self._provider, episode_id, provider_id]).fetchone()
            if row is None:
                return "gone"
            attempts = row[0] + 1
            expired = now - parse_time(row[1]) >= RETRY_WINDOW
            state = "failed" if expired else "pending"
            next_at = iso(now + timedelta(seconds=backoff_seconds(attempts)))
            db.execute(
                "UPDATE pending SET attempts = ?, next_at = ?, state = ?, last_error = ? WHERE kind = ?"
                " AND provider = ? AND episode_id = ? AND provider_id = ?",
                [attempts, next_at, state, message, kind, self._provider, episode_id, provider_id])
            return "failed" if expired else "queued"

        return await self._store.write(write)
