"""The ingest path: closed run records in; each stored, assembled into its episode and recorded to the
provider, or refused by name (IngestRun, IngestRuns, and the record of every run the daemon starts).

MemoryService's ``ingest_run`` and ``ingest_runs`` are the entries; :func:`ingest` is the one pipeline
behind both (its docstring has the stages), reaching the actors through the `Stages` it is handed (the
service, which calls this module; this module never imports the service). One refused record never
costs the rest of its batch, and nothing is answered before it is committed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

import trio
from loguru import logger

from .._limits import MAX_RECORD_BYTES, oversize_message, record_size
from .._wire import episode_to_dict, parse_run_record
from ..actors.assembler import Assembled, AssembleMany, Assembler
from ..actors.index import Index, RecordRun, RecordRuns, Stored
from ..actors.retention import Kick, RecordMany, RecordNow, Retention
from ..config import Config, HarnessConfig
from ..episode import stored_record
from ..errors import InvalidArgument, MemactorsError, StoreFull
from ..metrics import Metrics
from ..models import RunRecord
from ..store import Store, WallClock, iso
from ..store.pending import release_records
from ..store.run_history import sessions_recorded, stored_runs
from ..telemetry import memory_span


class Stages(Protocol):
    """What the pipeline reaches through (MemoryService has all of it): the store, the three actors a
    record goes through, the metrics, the configured provider's name and the wall clock."""

    store: Store
    assembler: Assembler
    index: Index
    retention: Retention
    metrics: Metrics
    provider: str
    wall_clock: WallClock

    @property
    def config(self) -> Config: ...

#: IngestRuns takes at most this many records per call (the shared contract).
MAX_BATCH = 500
#: Episodes of one IngestRuns call recorded to the provider at once (the retention actor serves 8 at a
#: time: more would only wait in its mailbox while their provider_timeout runs).
RECORD_CONCURRENCY = 8
#: Episodes of one IngestRuns call sent to the provider in one attempt (`RecordMany`): the built-in
#: provider writes them in one transaction, so a batch costs a few commits rather than two per episode.
RECORD_CHUNK = 50


def prepare_record(data: Any, source: str) -> RunRecord:
    """Bound, validate and clean a run record (CPU work: run in a worker thread, not on the trio loop).

    Raises InvalidArgument naming the size and the limit for a record over MAX_RECORD_BYTES, and
    naming the field for an invalid one. The prompt is dropped and every string redacted (REQ-6).
    """
    size = record_size(data)
    if size > MAX_RECORD_BYTES:
        raise InvalidArgument(oversize_message(source, size), field="record", bytes=size, limit=MAX_RECORD_BYTES)
    return stored_record(parse_run_record(data, source=source))


def _prepare_all(items: list[tuple[Any, str]]) -> list[RunRecord | MemactorsError]:
    """`prepare_record` for each (data, source), the refusal in place of a bad one (worker thread).

    A record that makes preparation fail in a way no check foresaw is refused alone (INTERNAL, its
    error type logged), so one record can never cost the rest of its batch."""
    out: list[RunRecord | MemactorsError] = []
    for data, source in items:
        try:
            out.append(prepare_record(data, source))
        except MemactorsError as exc:
            out.append(exc)
        except Exception as exc:  # ok: answered as this record's refusal; its type is logged
            logger.bind(error=type(exc).__name__, source_chars=len(source)).error("run record could not be prepared")
            out.append(MemactorsError(f"{source[:256]}: run record could not be prepared ({type(exc).__name__}); "
                                      "see the daemon log"))
    return out


def _duplicate(record: RunRecord, episode_id: str | None) -> dict[str, Any]:
    """IngestRun's answer for a run already ingested (with its episode id when it has an episode)."""
    duplicate = {"harness": record.harness, "run_id": record.run_id, "outcome": "duplicate"}
    return duplicate | ({"episode_id": episode_id} if episode_id else {})


def _imported_session(record: RunRecord) -> bool:
    """A record `memactors import <agent>` made of an agent's session (not git's commits: a commit's run id
    is its own; not a live run: its run id is the daemon's)."""
    return record.trigger.name.startswith("import ") and record.adapter != "git"


def _rejected(source: str, exc: MemactorsError) -> dict[str, Any]:
    return {"source": source, "outcome": "rejected", "error": {"code": exc.code, "message": str(exc)}}


async def ingest_batch(service: Stages, entries: list[Any]) -> dict[str, Any]:
    """IngestRuns for `service` (see ``MemoryService.ingest_runs``)."""
    if len(entries) > MAX_BATCH:
        raise InvalidArgument(f"params.records holds {len(entries)} records; at most {MAX_BATCH} per call",
                              field="records")
    results: list[dict[str, Any]] = [{} for _ in entries]
    work: list[tuple[Any, str, HarnessConfig | None]] = []
    where: list[int] = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("record"), dict):
            source = (str(entry.get("source") or f"records[{n}]")[:256] if isinstance(entry, dict)
                      else f"records[{n}]")
            results[n] = _rejected(source, InvalidArgument(f"records[{n}].record must be an object",
                                                           field=f"records[{n}].record"))
            continue
        work.append((entry["record"], str(entry.get("source") or f"records[{n}]")[:256], None))
        where.append(n)
    outcomes: dict[str, int] = {}
    for n, (_, source, _), result in zip(where, work, await ingest(service, work), strict=True):
        results[n] = _rejected(source, result) if isinstance(result, MemactorsError) else result
        outcomes[results[n]["outcome"]] = outcomes.get(results[n]["outcome"], 0) + 1
    logger.bind(records=len(entries), **outcomes).info("runs ingested")
    return {"results": results}


async def ingest(service: Stages, items: list[tuple[Any, str, HarnessConfig | None]]
                 ) -> list[dict[str, Any] | MemactorsError]:
    """The ingest path for one record or a batch: (data, source, harness config) in, IngestRun's result
    (or the MemactorsError refusing that record) out, in order.

    Stages, each one thread hop or message for the whole batch: bound, parse and redact every record
    (REQ-6: prompt dropped, every string redacted, once, at the boundary); look up which runs the store
    already holds (a closed run is recorded once: the first record wins, its scope never changes);
    assemble the episodes (a failed assembly writes nothing); store every run, episode and pending
    record in one transaction; then record the new episodes to the provider, concurrently, each
    attempt bounded by provider_timeout (past it the record stays queued: it was committed).
    The same run twice in one batch: the first (in order) is ingested, the later ones answer
    "duplicate", exactly as if the records had come in one after the other.
    """
    results: list[dict[str, Any] | MemactorsError | None] = [None] * len(items)
    first_of: dict[tuple[str, str], int] = {}
    later: list[int] = []

    def prepare_and_look_up(db: Any) -> tuple[list[RunRecord | MemactorsError], dict[tuple[str, str], str | None]]:
        # Bounded, parsed and redacted off the trio loop (a big record never stalls other callers),
        # and the runs the store already holds looked up, in one worker-thread hop.
        prepared = _prepare_all([(data, source) for data, source, _ in items])
        for n, record in enumerate(prepared):
            if not isinstance(record, MemactorsError):
                key = (record.harness, record.run_id)
                if key in first_of:
                    later.append(n)
                else:
                    first_of[key] = n
        known = stored_runs(db, list(first_of))
        # An imported agent session a resident's hook recorded already, under the resident's harness: the
        # same session (the agent's own id), so the import adds nothing for it whatever harness it names.
        imported: dict[tuple[str, str], tuple[str, str]] = {}
        for key, n in first_of.items():
            record = prepared[n]
            if key not in known and isinstance(record, RunRecord) and _imported_session(record):
                imported[(record.adapter, record.run_id)] = key
        if imported:
            for session, episode_id in sessions_recorded(db, list(imported)).items():
                known[imported[session]] = episode_id
        return prepared, known

    prepared, known = await service.store.read(prepare_and_look_up)
    for n, record in enumerate(prepared):
        if isinstance(record, MemactorsError):
            results[n] = record
    todo: list[tuple[int, RunRecord]] = []
    for key, n in first_of.items():
        record = prepared[n]
        assert isinstance(record, RunRecord)
        if key in known:
            results[n] = _duplicate(record, known[key])
        else:
            todo.append((n, record))
    assembled: tuple[Assembled | MemactorsError, ...] = ()
    if todo:
        assembled = await service.assembler.address.ask(
            AssembleMany(tuple((record, items[n][2]) for n, record in todo)))
    writes = [(n, record, a) for (n, record), a in zip(todo, assembled, strict=True)
              if not isinstance(a, MemactorsError) and a.keep_run]
    stored: tuple[Stored | Exception, ...] = ()
    if writes:
        # The retry loop leaves these records to this call's own attempts (below) until they are over.
        grace = max(service.config.episodes.provider_timeout * 5, 5.0) * 2
        record_after = iso(service.wall_clock() + timedelta(seconds=grace))
        stored = await service.index.address.ask(RecordRuns(tuple(
            RecordRun(record=record, repo=a.repo, branch=a.branch, paths=a.paths, episode=a.episode,
                      text=a.text, provider=service.provider, clean=True, record_after=record_after)
            for _, record, a in writes)))
    new_of = {n: s for (n, _, _), s in zip(writes, stored, strict=True)}
    to_record: list[tuple[int, RunRecord, Assembled]] = []
    for (n, record), a in zip(todo, assembled, strict=True):
        if isinstance(a, MemactorsError):
            results[n] = a
            continue
        s = new_of.get(n)
        if isinstance(s, Exception):
            # A full disk is not this record's fault: the whole call is refused RESOURCE_EXHAUSTED
            # (path, bytes free), never INTERNAL and never "rejected" as if the record were bad.
            s = service.store.health.failed(s)
            if isinstance(s, StoreFull) or not isinstance(s, MemactorsError):
                raise s
            results[n] = s
            continue
        episode = a.episode
        if episode is None:
            service.metrics.episode_recorded(service.provider, "skipped")
            results[n] = {"harness": record.harness, "run_id": record.run_id, "outcome": "skipped",
                          "reason": a.skipped}
        elif s is not None and s.episode_new:
            to_record.append((n, record, a))
        else:
            results[n] = {"harness": record.harness, "run_id": record.run_id, "episode_id": episode.episode_id,
                          "outcome": "duplicate"}
    if to_record:
        limiter = trio.CapacityLimiter(RECORD_CONCURRENCY)
        # The built-in provider takes the episodes together, RECORD_CHUNK per attempt (`_record_episodes`),
        # except those whose spans are exported (one attempt and span each); another provider gets one
        # call per episode, RECORD_CONCURRENCY at a time.
        batched = service.provider == "builtin"
        spanned = [(n, record, a) for n, record, a in to_record if not batched or _telemetry(service, record)]
        together = [(n, record, a) for n, record, a in to_record if batched and not _telemetry(service, record)]

        async def record_one(n: int, record: RunRecord, a: Assembled) -> None:
            async with limiter:
                results[n] = await _record_episode(service, record, a)

        async def record_chunks() -> None:
            # One chunk after another, each attempt with its own provider_timeout: their writes share
            # the one store writer anyway, and chunks started together would each wait for the others.
            for start in range(0, len(together), RECORD_CHUNK):
                chunk = together[start:start + RECORD_CHUNK]
                for (n, _, _), result in zip(chunk, await _record_episodes(service, chunk), strict=True):
                    results[n] = result

        async with trio.open_nursery() as nursery:
            for n, record, a in spanned:
                nursery.start_soon(record_one, n, record, a)
            if together:
                nursery.start_soon(record_chunks)
    again: list[int] = []
    if later:
        # Later records of a run met earlier in this batch: "duplicate" of what the first stored; a
        # run whose first record stored nothing (refused, or a harness keeping no trace) is ingested
        # afresh from its next record, as if the first had never come.
        for n in later:
            record = prepared[n]
            assert isinstance(record, RunRecord)
            first = results[first_of[(record.harness, record.run_id)]]
            if isinstance(first, dict) and first.get("reason") != "record_trace_off":
                results[n] = _duplicate(record, first.get("episode_id"))
            else:
                again.append(n)
        if again:
            for n, result in zip(again, await ingest(service, [items[n] for n in again]), strict=True):
                results[n] = result
    single, logged_inside = len(items) == 1, set(again)
    for n, done in enumerate(results):
        if isinstance(done, dict) and n not in logged_inside:
            log = logger.bind(harness=done.get("harness"), run=done.get("run_id"),
                              episode=done.get("episode_id"), outcome=done["outcome"])
            if single:
                log.info("run ingested")
            else:
                log.debug("run ingested")
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _telemetry(service: Stages, record: RunRecord) -> bool:
    """Whether this record's spans are exported (the operator's consent, or its harness's)."""
    harness_cfg = service.config.harness.get(record.harness)
    return service.config.telemetry.export_all or bool(harness_cfg and harness_cfg.export_telemetry)


async def _record_episodes(service: Stages, chunk: list[tuple[int, RunRecord, Assembled]]) -> list[dict[str, Any]]:
    """One attempt to record just-stored episodes to the provider (`RecordMany`), bounded as they were
    one by one: provider_timeout for each RECORD_CONCURRENCY of them (a PostgreSQL store pays a round
    trip per statement). Past it, or failed, each stays queued (committed) and is released to the
    retry loop now."""
    episodes = []
    for _, _, a in chunk:
        assert a.episode is not None
        episodes.append((a.episode.episode_id,
                         (episode_to_dict(a.episode), a.text or "", a.episode.scope, a.episode.trust_class)))
    outcomes: tuple[str, ...] = ("queued",) * len(chunk)
    failed = False
    waves = -(-len(chunk) // RECORD_CONCURRENCY)
    with trio.move_on_after(service.config.episodes.provider_timeout * waves) as attempt:
        try:
            outcomes = await service.retention.address.ask(RecordMany(tuple(episodes)))
        except MemactorsError as exc:
            logger.bind(episodes=len(episodes), error=type(exc).__name__).warning(
                "first record attempt failed; queued for retry")
            failed = True
    if attempt.cancelled_caught or failed:
        try:
            await _release_record(service, *(episode_id for episode_id, _ in episodes))
        except MemactorsError as exc:  # (a full disk, the store down): the claim still runs out
            logger.bind(episodes=len(episodes), error=type(exc).__name__).warning(
                "records not released to the retry loop early")
    return [{"harness": record.harness, "run_id": record.run_id, "episode_id": episode_id, "outcome": outcome}
            for (_, record, _), (episode_id, _), outcome in zip(chunk, episodes, outcomes, strict=True)]


async def _record_episode(service: Stages, record: RunRecord, assembled: Assembled) -> dict[str, Any]:
    """One attempt to record a just-stored episode to the provider, bounded by provider_timeout."""
    episode = assembled.episode
    assert episode is not None
    text = assembled.text or ""
    harness_cfg = service.config.harness.get(record.harness)
    consent = service.config.telemetry.export_all or bool(harness_cfg and harness_cfg.export_telemetry)
    with memory_span("memory.episode.record", enabled=consent,
                     episode_id=episode.episode_id, provider=service.provider, harness=record.harness,
                     run_id=record.run_id, bytes=len(text.encode())) as span:
        outcome, failed = "queued", False
        with trio.move_on_after(service.config.episodes.provider_timeout) as attempt:
            stored_copy = (episode_to_dict(episode), text, episode.scope, episode.trust_class)
            try:
                outcome = await service.retention.address.ask(RecordNow(episode.episode_id, stored_copy))
            except MemactorsError as exc:
                # The episode and its pending record are committed: a failed first attempt (the
                # provider, a full disk, a PostgreSQL store gone since) is the retry loop's to finish,
                # never a reason to fail this call (or the rest of its batch).
                logger.bind(episode=episode.episode_id, error=type(exc).__name__).warning(
                    "first record attempt failed; queued for retry")
                failed = True
        if attempt.cancelled_caught or failed:
            try:
                await _release_record(service, episode.episode_id)
            except MemactorsError as exc:  # (a full disk, the store down): the claim still runs out
                logger.bind(episode=episode.episode_id, error=type(exc).__name__).warning(
                    "record not released to the retry loop early")
        span.set_attribute("memory.outcome", outcome)
    return {"harness": record.harness, "run_id": record.run_id, "episode_id": episode.episode_id,
            "outcome": outcome}


async def _release_record(service: Stages, *episode_ids: str) -> None:
    """This call's record attempt ran out of provider_timeout: the pending rows it held back from the
    retry loop (`record_after`) are due now, and the loop is told to look (an attempt still running in
    the retention actor is in its in-flight set: the loop does not start a second one)."""
    now = iso(service.wall_clock())
    me = service.store.daemon_id

    await service.store.write(lambda db: release_records(
        db, provider=service.provider, episode_ids=episode_ids, daemon_id=me, now=now))
    await service.retention.address.tell(Kick())
