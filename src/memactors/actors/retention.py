"""The retention actor: pending records and forgets retried with backoff for 24 hours, and the hourly
prune (SPEC-0030 REQ-10, REQ-13 record side).

Records. Every episode the index stores arrives here as a `pending` record row written in the same
transaction, so an acknowledged run is never lost: this actor records it to the provider from the
stored copy, now and after every failure with growing backoff (5 s doubling to 1 h), across daemon
restarts (the rows live in SQLite; times are wall-clock), until it succeeds or 24 hours have passed
since the row was queued, when the row is marked `failed` (`record_failed` in `memory status`). When
the provider session becomes ready again (after a reconnect or a contract that is supported again) it
sends `RetryNow`, and every pending row is due at once instead of waiting out its backoff.

Forgets, in REQ-10's order: `ForgetEpisode` first sets `forgotten_at` on the episode and on every index
row in one transaction (REQ-9 drops it from that commit on), queues one `pending` forget row per
(provider, provider id), then calls `memory_forget` for each; the stored body and text are deleted once
no forget is pending any more (each one done, or failed after 24 h of retries). The tombstone (the
index rows with `forgotten_at`) stays. A provider answering `{forgotten: false}` does not hold the id:
that is done too.

Reachability. Rows for the configured provider go through the provider session; rows for `builtin`
when another provider is configured are forgotten directly on the store (the built-in provider's
tables live there). Rows for an upstream that is no longer configured wait until it is again.

Prune. Once at start and then every hour (`trio.sleep`, so MockClock drives it in tests) every episode
whose `recorded_at` is older than `[memory.episodes] retention` is forgotten as above, for every
provider holding index rows for it.

Backoff waits use `trio.sleep`; the injected wall clock decides what is due.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import trio
from loguru import logger

from .. import contract
from .._limits import MAX_EPISODE_BODY_BYTES
from .._wire import parse_time
from ..errors import MemactorsError, ProviderTimeout, StoreUnavailable
from ..logs import LogThrottle
from ..metrics import Metrics
from ..redact import redact
from ..store import Db, Store, WallClock, iso, pending
from ..store.episodes import stored_copy
from ..store.pending import ForgetOutcome, tombstone
from .index import IndexIds, IndexIdsMany
from .kernel import Address, Ask, open_mailbox, serve
from .provider_session import provider_call

RETRY_WINDOW = timedelta(hours=24)
FIRST_BACKOFF = 5.0
MAX_BACKOFF = 3600.0
IDLE_POLL = 60.0
PRUNE_EVERY = 3600.0
#: How long the retry loop and the prune wait before trying a store that did not answer again.
STORE_RETRY = 2.0
PRUNE_BATCH = 500
#: Attempts in flight at once. MCP over stdio (or HTTP) carries concurrent requests, so a backlog is
#: limited by the provider's answers, not by round trips one after another; 32 in flight lets both the
#: provider's writes and the index rows written for its answers share group-commit transactions. It
#: stays within the provider session's own concurrency (32) and mailbox (64).
CONCURRENT_ATTEMPTS = 32
#: Due rows fetched (with their stored episodes) per read.
DUE_BATCH = 256
KINDS = ("record", "forget")


def backoff_seconds(attempts: int) -> float:
    """Delay before attempt `attempts + 1`: 5 s, 10 s, 20 s … capped at one hour."""
    factor: int = 2 ** max(attempts - 1, 0)  # int ** int is Any to the checker; the power is never negative
    return min(FIRST_BACKOFF * factor, MAX_BACKOFF)



#: Seconds between two retention lines for the same kind of failure (the rest are counted: ``suppressed``).
RETRY_LOG_SECONDS = 10.0


def record_arguments(episode_id: str, stored: tuple[dict[str, Any], str, str, str]) -> dict[str, Any]:
    """`memory_record_episode`'s arguments for a stored copy (episode, text, scope, trust class)."""
    episode, text, scope, trust_class = stored
    return {"episode_id": episode_id, "scope": scope, "trust_class": trust_class, "episode": episode, "text": text}


@attrs.frozen
class RecordNow(Ask[str]):
    """Try to record this episode now (the caller's deadline bounds the wait); answers the outcome.

    `stored` is what the sender has just committed — (episode object, text, scope, trust class) — so the
    attempt need not read it back; without it the stored copy is read.
    """

    episode_id: str
    stored: tuple[dict[str, Any], str, str, str] | None = None


@attrs.frozen
class RecordMany(Ask["tuple[str, ...]"]):
    """`RecordNow` for many just-stored episodes (episode id, stored copy) of an ingest batch, answered
    in order. The built-in provider takes them in one call (`contract.RECORD_MANY`: one store
    transaction) and their index rows go in one more; another provider gets one call each."""

    episodes: tuple[tuple[str, tuple[dict[str, Any], str, str, str]], ...]


@attrs.frozen
class Kick:
    """Something became due: look at the pending rows now."""


@attrs.frozen
class RetryNow:
    """The provider is back: make every pending row due now and look at them."""


@attrs.frozen
class PendingCounts(Ask[dict[str, int]]):
    """Ask for {"<kind>_<state>": count} summed over providers (and refresh the pending gauges)."""


@attrs.frozen
class ForgetEpisode(Ask["ForgetOutcome"]):
    """Forget one episode (operator or retention). Answers a `ForgetOutcome`; `UnknownEpisode` if absent."""

    episode_id: str
    reason: str = "operator"


@attrs.frozen
class Attempt:
    kind: str
    episode_id: str
    provider_id: str
    provider: str
    #: a record's stored copy (episode object, text, scope, trust class), read with the due row
    stored: tuple[dict[str, Any], str, str, str] | None = attrs.field(default=None, eq=False)
    #: why a record's stored episode cannot be read (not JSON, not REQ-5's shape): it is quarantined
    unreadable: str | None = attrs.field(default=None, eq=False)


def readable_copy(body: str) -> tuple[tuple[dict[str, Any], str] | None, str | None]:
    """`stored_copy(body)`, or None and why it cannot be read: a body no check let in (an older import, a
    damaged row) must never crash the retry loop into a daemon that cannot start."""
    if len(body) > MAX_EPISODE_BODY_BYTES:
        return None, f"the stored episode is {len(body)} characters; the limit is {MAX_EPISODE_BODY_BYTES}"
    try:
        episode, text = stored_copy(body)
    except RecursionError:
        return None, "the stored episode is nested too deeply"
    except Exception as exc:  # ok: any failure to read the body is this one row's, reported by type
        return None, f"the stored episode is not REQ-5's episode ({type(exc).__name__})"
    if not isinstance(episode, dict):
        return None, "the stored episode is not a JSON object"
    return (episode, text), None


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
        retention: Callable[[], float] = lambda: 90 * 86400.0,
    ) -> None:
        self._store = store
        self._provider = provider
        self._provider_address = provider_address
        self._index = index_address
        self._metrics = metrics
        self._clock = wall_clock
        self._provider_timeout = provider_timeout
        self._retention = retention
        self._wake = trio.Event()
        self._failing = False  # the last record attempt failed: the next success makes the backlog due
        self._inflight: set[tuple[str, str, str, str]] = set()
        #: in-flight keys whose due row the loop skipped: their attempt wakes the loop when it settles
        self._skipped: set[tuple[str, str, str, str]] = set()
        self._builtin: Any = None
        self.address, self._mailbox = open_mailbox("retention", 32)
        self._log = logger.bind(actor="retention", provider=provider)
        #: One failure line per kind of failure per RETRY_LOG_SECONDS, however many queued records fail the
        #: same way (a store failover failed every retry of every queued record, one WARNING each).
        self._failures = LogThrottle(RETRY_LOG_SECONDS)

    @property
    def reachable(self) -> tuple[str, ...]:
        """Providers whose pending rows this actor can act on."""
        return (self._provider,) if self._provider == "builtin" else (self._provider, "builtin")

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._loop)
            nursery.start_soon(self._prune_loop)
            task_status.started(self.address)
            await serve(self._mailbox, self._handle, concurrency=8)
            nursery.cancel_scope.cancel()

    async def _handle(self, message: object) -> object:
        match message:
            case RecordNow(episode_id=episode_id, stored=stored):
                # The ingest committed the row not due before its own attempt is over (`record_after`),
                # so the loop does not race this attempt for a fresh record.
                return await self._attempt(Attempt("record", episode_id, "", self._provider), stored)
            case RecordMany(episodes=episodes):
                return await self._record_many(episodes)
            case Kick():
                self._wake.set()
                return None
            case RetryNow():
                await self._make_due()
                self._wake.set()
                return None
            case PendingCounts():
                return await self.counts()
            case ForgetEpisode(episode_id=episode_id, reason=reason):
                return await self.forget(episode_id, reason)
            case _:
                raise TypeError(f"retention cannot handle {type(message).__name__}")

    async def counts(self) -> dict[str, int]:
        rows = await self._store.read(pending.counts_by_state)
        out: dict[str, int] = {}
        per_provider: dict[tuple[str, str], int] = {(self._provider, kind): 0 for kind in KINDS}
        for provider, kind, state, n in rows:
            out[f"{kind}_{state}"] = out.get(f"{kind}_{state}", 0) + n
            if state == "pending":
                per_provider[(provider, kind)] = per_provider.get((provider, kind), 0) + n
            else:
                per_provider.setdefault((provider, kind), 0)
        for (provider, kind), n in per_provider.items():
            self._metrics.set_pending(provider, kind, n)
        return out

    # -- forgetting -----------------------------------------------------------------------------------
    async def forget(self, episode_id: str, reason: str = "operator") -> ForgetOutcome:
        """REQ-10: tombstone first, then one bounded round of memory_forget; retries continue in the loop."""
        now = iso(self._clock())
        me = self._store.daemon_id
        claim = (me, iso(self._clock() + timedelta(seconds=self._lease())))
        first = await self._store.write(lambda db: tombstone(db, episode_id, now, claim=claim))
        log = self._log.bind(episode=episode_id, reason=reason)
        if first:
            due = await self._store.read(lambda db: pending.claimed_forgets(db, episode_id, me))
            attempts = [Attempt("forget", episode_id, pid, provider) for pid, provider in due
                        if provider in self.reachable]
            settled: set[tuple[str, str, str, str]] = set()

            async def attempt_one(attempt: Attempt) -> None:
                await self._attempt(attempt)
                settled.add(_key(attempt))

            with trio.move_on_after(self._provider_timeout):
                async with trio.open_nursery() as nursery:
                    for attempt in attempts:
                        nursery.start_soon(attempt_one, attempt)
            for attempt in attempts:
                if _key(attempt) not in settled:
                    # The operator's round is bounded by provider_timeout; a forget still unanswered then
                    # stays pending for the retry loop. Said as a record's or a recall's timeout is.
                    late = ProviderTimeout("memory_forget", self._provider_timeout, provider=attempt.provider)
                    log.bind(provider=attempt.provider, op="memory_forget", error=type(late).__name__,
                             detail=str(late), state="queued").warning("forget failed")
            # Whatever is still pending is the retry loop's now (this daemon's or another's).
            await self._store.write(lambda db: pending.release_forgets(db, episode_id, me))
            self._wake.set()
        outcome = await self._store.read(lambda db: pending.forget_outcome(db, episode_id))
        if outcome.body_deleted:
            await self._store.checkpoint()  # no page image of the deleted text left in the WAL
        log.bind(ids=outcome.ids, pending=outcome.pending, failed=outcome.failed, first=first).info("episode forgotten")
        await self.counts()
        return outcome

    async def prune(self) -> int:
        """Forget every live episode older than the configured retention, and delete the tombstones of
        episodes forgotten longer than the retention ago whose forget is over (`prune_tombstones`), so
        under steady traffic the store stops growing (bench/steady_state.py); returns how many episodes
        it forgot."""
        retention = self._retention()
        cutoff = iso(self._clock() - timedelta(seconds=retention))
        now = iso(self._clock())

        def write(db: Db) -> int:
            return sum(tombstone(db, eid, now) for eid in pending.expired_episodes(db, cutoff, PRUNE_BATCH))

        async with self._store.singleton("prune") as mine:
            if not mine:  # another daemon sharing the store is pruning it now
                self._log.debug("retention prune left to another daemon")
                return 0
            total = await self._store.write_in_batches(write, PRUNE_BATCH)
            await self._store.prune_call_log(cutoff)  # the call log keeps the same window
            tombstones = await self._store.write_in_batches(lambda db: pending.prune_tombstones(db, cutoff, PRUNE_BATCH),
                                                            PRUNE_BATCH)
        if tombstones:
            self._log.bind(tombstones=tombstones, retention_s=retention).info("retention prune deleted tombstones")
        if total:
            self._log.bind(episodes=total, retention_s=retention).info("retention prune forgot episodes")
            self._wake.set()
        return total

    async def _prune_loop(self) -> None:
        while True:
            try:
                await self.prune()
            except StoreUnavailable as exc:  # PostgreSQL down: the next prune comes in STORE_RETRY
                self._log.bind(error=exc.message).warning("retention prune skipped: store unavailable")
                await trio.sleep(STORE_RETRY)
                continue
            await trio.sleep(PRUNE_EVERY)

    # -- the retry loop -------------------------------------------------------------------------------
    def _lease(self) -> float:
        """How long a claimed row is this daemon's: twice the longest an attempt may take (then another
        daemon, or this one after a restart, may try it)."""
        return max(self._provider_timeout * 5, 5.0) * 2

    async def _loop(self) -> None:
        """The retry loop, kept alive through store outages: a pass that cannot reach the store
        (PostgreSQL down) waits STORE_RETRY and tries again, so the daemon stays up and the loop picks
        the work up by itself when the server is back."""
        limiter = trio.CapacityLimiter(CONCURRENT_ATTEMPTS)
        me = self._store.daemon_id
        released = False

        async def one(attempt: Attempt, outcomes: dict[str, int]) -> None:
            async with limiter:
                try:
                    state = await self._attempt(attempt, attempt.stored)
                except StoreUnavailable:
                    state = "store_unavailable"  # the row stays; its claim runs out (or is released)
            outcomes[f"{attempt.kind}_{state}"] = outcomes.get(f"{attempt.kind}_{state}", 0) + 1

        while True:
            self._wake = trio.Event()
            try:
                if not released:
                    # Claims this daemon held before a restart (its attempts died with it) are released at
                    # once: the state directory's lock makes this process the only one with this daemon id.
                    await self._store.write(lambda db: pending.release_claims(db, me))
                    released = True
                due = []
                for attempt in await self._due():
                    if _key(attempt) in self._inflight:
                        self._skipped.add(_key(attempt))  # its attempt wakes the loop when it settles
                    else:
                        due.append(attempt)
                outcomes: dict[str, int] = {}
                async with trio.open_nursery() as nursery:
                    for attempt in due:
                        nursery.start_soon(one, attempt, outcomes)
                if outcomes:
                    # One line per pass (each record's own line is DEBUG: a drained backlog of thousands of
                    # records logged one INFO line each).
                    self._log.bind(attempts=len(due), **outcomes).info("pending rows retried")
                await self.counts()
                if due:
                    continue  # a backlog drains as fast as the provider answers
                # Sleep until the earliest row is due; a new or rescheduled row, a finished attempt or
                # RetryNow wakes the loop sooner.
                wait = await self._until_next_due()
            except StoreUnavailable as exc:
                # (the store itself logs one WARNING per outage, and one line when it is back)
                self._log.bind(error=exc.message).debug("retry loop waiting: store unavailable")
                wait = STORE_RETRY
            with trio.move_on_after(wait):
                await self._wake.wait()

    async def _until_next_due(self) -> float:
        """Seconds until the earliest pending row is due (at most IDLE_POLL), by the wall clock: its
        next_at, or the end of its claim when another attempt holds it."""
        reachable = self.reachable
        due_at = await self._store.read(lambda db: pending.next_due_at(db, reachable, self._provider))
        if due_at is None:
            return IDLE_POLL
        wait = (parse_time(due_at) - self._clock()).total_seconds()
        return min(max(wait, 0.05), IDLE_POLL)

    async def _due(self) -> list[Attempt]:
        """Claim the due rows, oldest next_at first, each record with its stored copy read in the same
        transaction (one write for the batch, not one read per record).

        A claimed row is this daemon's until its attempt settles it (deleted, or rescheduled by
        `_failed`) or the lease runs out: with several daemons on one store, each due row is tried by
        one of them (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so claims that race skip each other's rows).
        """
        now = iso(self._clock())
        until = iso(self._clock() + timedelta(seconds=self._lease()))
        me = self._store.daemon_id
        reachable = self.reachable

        def claim(db: Db) -> list[Any]:
            return pending.claim_due(db, reachable=reachable, provider=self._provider, now=now, until=until,
                                     daemon_id=me, limit=DUE_BATCH)

        def attempts(rows: list[Any]) -> list[Attempt]:
            out = []
            for k, e, p, prov, body, scope, trust_class, forgotten_at in rows:
                stored, unreadable = None, None
                if k == "record" and body is not None and forgotten_at is None:
                    copy, unreadable = readable_copy(body)  # rendered here, off the trio loop
                    stored = None if copy is None else (*copy, scope, trust_class)
                # (a record without a live body: _record drops the row; an unreadable one is quarantined)
                out.append(Attempt(k, e, p, prov, stored, unreadable))
            return out

        rows = await self._store.write(claim)
        return await trio.to_thread.run_sync(attempts, rows) if rows else []

    async def _make_due(self) -> None:
        now = iso(self._clock())
        await self._store.write(lambda db: pending.make_due(db, self._provider, now))

    async def _attempt(self, attempt: Attempt, stored: tuple[dict[str, Any], str, str, str] | None = None) -> str:
        key = _key(attempt)
        if key in self._inflight:
            return "queued"  # another attempt is in flight; the row stays until it settles
        self._inflight.add(key)
        try:
            if attempt.unreadable is not None:
                return await self._quarantine(attempt, attempt.unreadable)
            if attempt.kind == "record":
                return await self._record(attempt.episode_id, stored)
            return await self._forget(attempt)
        finally:
            self._inflight.discard(key)
            if key in self._skipped:
                # The loop skipped this row while the attempt was in flight: it may be due still. (Not
                # on every attempt: that cost the loop three reads per recorded episode.)
                self._skipped.discard(key)
                self._wake.set()

    async def _record_many(self, episodes: tuple[tuple[str, tuple[dict[str, Any], str, str, str]], ...]
                           ) -> tuple[str, ...]:
        if self._provider != "builtin" or len(episodes) < 2:
            return tuple([await self._attempt(Attempt("record", episode_id, "", self._provider), stored)
                          for episode_id, stored in episodes])
        outcomes = ["queued"] * len(episodes)  # another attempt in flight: the row stays until it settles
        mine = [n for n, (episode_id, _) in enumerate(episodes)
                if _key(Attempt("record", episode_id, "", self._provider)) not in self._inflight]
        keys = [_key(Attempt("record", episodes[n][0], "", self._provider)) for n in mine]
        self._inflight.update(keys)
        try:
            arguments = {"episodes": [record_arguments(*episodes[n]) for n in mine]}
            try:
                payload = await self._call_within(contract.RECORD_MANY, arguments, len(mine))
                ids = [tuple(str(i) for i in result["ids"]) for result in payload["results"]]
                if len(ids) != len(mine):
                    raise contract.ProviderSchemaError(f"{contract.RECORD_MANY} answered {len(ids)} results for "
                                              f"{len(mine)} episodes", provider=self._provider)
                forgets_queued = await self._index.ask(IndexIdsMany(self._provider, tuple(
                    (episodes[n][0], i) for n, i in zip(mine, ids, strict=True))))
            except (MemactorsError, trio.TooSlowError):
                # Each episode's own attempt, with its own failure handling (backoff, quarantine, the
                # log line): what one call per episode would have done.
                self._inflight.difference_update(keys)
                keys = []
                for n in mine:
                    outcomes[n] = await self._attempt(Attempt("record", episodes[n][0], "", self._provider),
                                                      episodes[n][1])
                return tuple(outcomes)
            for n in mine:
                self._metrics.episode_recorded(self._provider, "ok")
                outcomes[n] = "recorded"
            if self._failing:
                self._failing = False
                await self._make_due()
                self._wake.set()
            if forgets_queued:
                self._wake.set()
            self._log.bind(episodes=len(mine)).debug("episodes recorded")
            return tuple(outcomes)
        finally:
            self._inflight.difference_update(keys)
            if self._skipped.intersection(keys):
                self._skipped.difference_update(keys)
                self._wake.set()

    async def _record(self, episode_id: str, stored: tuple[dict[str, Any], str, str, str] | None = None) -> str:
        if stored is None:
            row = await self._store.read(lambda db: pending.stored_episode(db, episode_id))
            if row is None or row[0] is None or row[3] is not None:
                await self._store.write(lambda db: pending.drop_record(db, self._provider, episode_id))
                return "gone"
            copy, unreadable = await trio.to_thread.run_sync(readable_copy, row[0])
            if copy is None:
                assert unreadable is not None
                return await self._quarantine(Attempt("record", episode_id, "", self._provider), unreadable)
            stored = (*copy, row[1], row[2])
        # Just stored by the ingest path: forgotten meanwhile is handled when the ids are indexed.
        arguments = record_arguments(episode_id, stored)
        try:
            payload = await self._call_within("memory_record_episode", arguments)
            ids = tuple(str(i) for i in payload["ids"])
            # Index rows and the pending row's removal in one transaction; ids of an episode forgotten
            # while its record was in flight are tombstoned and queued for forget in it too.
            forgets_queued = await self._index.ask(IndexIds(self._provider, episode_id, ids))
        except (MemactorsError, trio.TooSlowError) as exc:
            self._failing = True
            state = await self._failed(Attempt("record", episode_id, "", self._provider), exc)
            # The provider's own message, redacted and cut (ProviderError builds it that way), names
            # what went wrong upstream: SPEC-0030 "A provider error is attributable".
            suppressed = self._failures.allow(f"record {type(exc).__name__} {state}")
            if suppressed is not None:
                self._log.bind(episode=episode_id, op="memory_record_episode", error=type(exc).__name__,
                               detail=redact(str(exc))[:300], state=state,
                               suppressed=suppressed).warning("episode record failed")
            return state
        self._metrics.episode_recorded(self._provider, "ok")
        if self._failing:
            # The first success after failures: the provider is back, so whatever waits out a backoff
            # is due now rather than at its next_at (up to an hour away).
            self._failing = False
            await self._make_due()
            self._wake.set()
        if forgets_queued:
            self._wake.set()
        # DEBUG: the ingest logs its own attempt's outcome (`run ingested` / `runs ingested`), the retry
        # loop one line per pass; a line per record was a measurable share of a batch's CPU.
        self._log.bind(episode=episode_id, ids=len(ids)).debug("episode recorded")
        return "recorded"

    async def _quarantine(self, attempt: Attempt, why: str) -> str:
        """Set a record row aside whose stored episode cannot be read: kept (state failed, `last_error`
        saying why), never retried, counted as `record_quarantined` in `memory status` and doctor, and
        logged naming the episode; the loop goes on with the rest."""

        def write(db: Db) -> bool:
            return pending.quarantine(db, kind=attempt.kind, provider=attempt.provider,
                                      episode_id=attempt.episode_id, provider_id=attempt.provider_id, why=why)

        if await self._store.write(write):
            self._metrics.episode_recorded(attempt.provider, "error")
            self._log.bind(episode=attempt.episode_id, reason=why, state="quarantined").error(
                "pending record quarantined: its stored episode cannot be read; "
                "`memactors memory forget` removes it, or import it again from a good export")
        return "quarantined"

    async def _forget(self, attempt: Attempt) -> str:
        log = self._log.bind(episode=attempt.episode_id, target=attempt.provider)
        try:
            if attempt.provider == self._provider:
                payload = await self._call_within("memory_forget", {"id": attempt.provider_id})
            elif attempt.provider == "builtin":
                payload = await self._builtin_provider().forget({"id": attempt.provider_id})
            else:
                return "unreachable"
        except (MemactorsError, trio.TooSlowError) as exc:
            state = await self._failed(attempt, exc)
            suppressed = self._failures.allow(f"forget {attempt.provider} {type(exc).__name__} {state}")
            if suppressed is not None:
                log.bind(op="memory_forget", error=type(exc).__name__, detail=redact(str(exc))[:300],
                         state=state, suppressed=suppressed).warning("forget failed")
            return state

        def done(db: Db) -> bool:
            return pending.forget_done(db, provider=attempt.provider, episode_id=attempt.episode_id,
                                       provider_id=attempt.provider_id)

        if await self._store.write(done):
            await self._store.checkpoint()  # the body is gone: no page image of it left in the WAL
        log.bind(known=bool(payload.get("forgotten"))).info("provider forgot id")
        return "forgotten"

    async def _call_within(self, tool: str, arguments: dict[str, Any], episodes: int = 1) -> dict[str, Any]:
        """``tool`` on the provider under the retry loop's deadline (five provider_timeouts, at least
        5 s, for each 8 of the `episodes` it records); a call that does not answer in time raises
        ProviderTimeout naming the provider, the tool and the deadline (a bare TooSlowError says none
        of them)."""
        deadline = max(self._provider_timeout * 5, 5.0) * -(-episodes // 8)
        try:
            with trio.fail_after(deadline):
                payload: dict[str, Any] = await provider_call(self._provider_address, tool, arguments)
        except trio.TooSlowError:
            raise ProviderTimeout(tool, deadline, provider=self._provider) from None
        return payload

    def _builtin_provider(self) -> Any:
        if self._builtin is None:
            from ..builtin import BuiltinProvider  # the built-in tables live in our store

            self._builtin = BuiltinProvider(self._store)
        return self._builtin

    async def _failed(self, attempt: Attempt, exc: BaseException) -> str:
        now = self._clock()
        message = f"{type(exc).__name__}: {str(exc)[:300]}"
        kind, provider, episode_id, provider_id = attempt.kind, attempt.provider, attempt.episode_id, attempt.provider_id

        def write(db: Db) -> str:
            row = pending.attempts_so_far(db, kind=kind, provider=provider, episode_id=episode_id,
                                          provider_id=provider_id)
            if row is None:
                return "gone"
            attempts = row[0] + 1
            expired = now - parse_time(row[1]) >= RETRY_WINDOW
            state = "failed" if expired else "pending"
            next_at = iso(now + timedelta(seconds=backoff_seconds(attempts)))
            pending.reschedule(db, kind=kind, provider=provider, episode_id=episode_id, provider_id=provider_id,
                               attempts=attempts, next_at=next_at, state=state, error=message)
            if expired and kind == "forget":
                pending.delete_body_if_done(db, episode_id)
            if kind == "record" and attempts == 1:
                # REQ-21 counts episodes: an episode's failed record counts once, however often it is retried.
                self._metrics.episode_recorded(provider, "error")
            return "failed" if expired else "queued"

        state = await self._store.write(write)
        self._wake.set()  # the row's next_at changed: the loop sleeps until the earliest one again
        return state


def _key(attempt: Attempt) -> tuple[str, str, str, str]:
    return (attempt.kind, attempt.episode_id, attempt.provider_id, attempt.provider)
