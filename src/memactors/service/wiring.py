"""The memory service wired together: MemoryService, and `open_memory_service`, which starts its actors.

One store, one supervisor (one-for-one) running the actors (call log, provider session, index, summary,
assembler, retention, briefing, runs; the built-in provider's embedder when embeddings are on), and the
MemoryService over them, whose handlers live in the modules named for who calls them.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from loguru import logger

from ..actors.assembler import Assembler
from ..actors.briefing import Briefing
from ..actors.call_log import CallLog
from ..actors.index import Index
from ..actors.kernel import ChildSpec, open_supervisor
from ..actors.provider_session import ProviderSession
from ..actors.retention import Retention, RetryNow
from ..actors.runs import Runs, RunsPort
from ..actors.summary import SummaryActor, model_api_settings
from ..builtin import BuiltinProvider
from ..config import Config, ConfigHolder
from ..embedding import BUILTIN_MODEL, LocalEmbedder, model_dir
from ..errors import StoreUnavailable
from ..metrics import Metrics
from ..modelapi import ModelApiClient, UtilityBudget
from ..redact import shared as shared_redactor
from ..store import Store, WallClock, ensure_daemon_id, utc_now
from ..store.engines import open_store
from .agent_calls import AgentHandlers
from .control_tier import ControlHandlers
from .daemon_runs import RunHandlers
from .providers import provider_endpoint, provider_target
from .read_tier import ReadHandlers

DB_NAME = "memactors.db"


class MemoryService(AgentHandlers, ReadHandlers, ControlHandlers, RunHandlers):
    """Handlers shared by every surface. Operator calls see every scope.

    The agents' (``agent_calls``), the operator RPC's read and control tiers (``read_tier``,
    ``control_tier``) and the daemon's runs and run records (``daemon_runs``), over the parts every
    handler works with (``parts``)."""


async def _close_quietly(client: ModelApiClient) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        await client.aclose()


if TYPE_CHECKING:
    def _memory_service_serves_the_runs_actor(service: MemoryService) -> RunsPort:
        return service  # the checker proves MemoryService has every member the runs actor's port names


async def _repair_excerpts(store: Store, config: Config) -> None:
    """The start-up repair: episodes stored with the excerpt `[prompt]` get their answer back from
    their run's log, or a mark saying it is gone (`excerpt_repair`). A store that does not answer now
    (PostgreSQL down) is repaired at a later start."""
    from ..agents.excerpt_repair import repair_prompt_excerpts

    chars = config.memory.episodes.excerpt_chars
    try:
        restored, marked = await store.write(lambda db: repair_prompt_excerpts(db, excerpt_chars=chars))
    except StoreUnavailable:
        return
    if restored or marked:
        logger.bind(restored=restored, marked=marked).info("episodes whose answer was taken for the prompt repaired")


@asynccontextmanager
async def open_memory_service(
    holder: ConfigHolder,
    *,
    wall_clock: WallClock = utc_now,
    metrics: Metrics | None = None,
    store_path: Path | None = None,
) -> AsyncIterator[MemoryService]:
    """Open the store and start every actor under one supervisor; stop them all on exit."""
    config = holder.current
    metrics = metrics or Metrics()
    daemon_id = await trio.to_thread.run_sync(ensure_daemon_id, config.store.path)
    target: Path | str = store_path or config.store.url or config.store.path / DB_NAME
    store = await open_store(target, daemon_id=daemon_id)
    # The redaction rules (~230 patterns) compile on first use; do it here, off the trio thread, so the
    # first redaction on the loop (a provider error, an ingest) does not stall every other caller.
    await trio.to_thread.run_sync(shared_redactor)
    try:
        await _repair_excerpts(store, config)
        async with AsyncExitStack() as stack, open_supervisor(
                "memory", max_restarts=5, window=60.0, backoff=0.1, max_backoff=5.0, max_burst=6) as sup:
            service = MemoryService(holder=holder, store=store, metrics=metrics, supervisor=sup,
                                    wall_clock=wall_clock)
            service.builtin.relevance_floor = config.memory.relevance_floor
            settings = model_api_settings(config.model_api)
            budget = UtilityBudget(requests_per_minute=settings.requests_per_minute,
                                   daily_requests=settings.daily_requests) if settings else None
            if config.memory.embeddings and settings is not None and settings.embedding_model:
                # REQ-11 hybrid ranking: the built-in provider embeds through the shared utility budget.
                embed_client = ModelApiClient(settings, budget=budget)
                stack.push_async_callback(_close_quietly, embed_client)
                service.builtin = BuiltinProvider(
                    store, embedder=embed_client.embed, embedding_model=settings.embedding_model,
                    query_embed_deadline=config.episodes.provider_timeout / 2,
                    relevance_floor=config.memory.relevance_floor)
            elif config.memory.embeddings and model_dir() is not None:
                # The embedded model (embedding.py): loaded on the first episode or query to embed.
                service.builtin = BuiltinProvider(
                    store, embedder=LocalEmbedder().embed, query_embedder=LocalEmbedder(query=True).embed,
                    embedding_model=BUILTIN_MODEL, query_embed_deadline=config.episodes.provider_timeout / 2,
                    relevance_floor=config.memory.relevance_floor,
                    # a local batch has no deadline: abandoning it would only throw its work away (on
                    # a loaded machine a batch can take minutes; it then ends and the next one starts)
                    record_embed_deadline=math.inf)
            if config.memory.is_builtin and service.builtin.hybrid:
                builtin = service.builtin
                metrics.watch_embeddings(lambda: (builtin.pending_vectors, builtin.pending_since))
                if await service.builtin.check_vectors():  # PostgreSQL without pgvector: one WARN
                    await sup.start(ChildSpec("embedder", service.builtin.embed_worker))

            async def session_ready() -> None:
                retention: Retention | None = getattr(service, "retention", None)
                if retention is not None:
                    await retention.address.tell(RetryNow())

            # Started first, so it stops last and writes the rows of everything stopped before it.
            service.call_log = CallLog(store)
            await sup.start(ChildSpec("call_log", service.call_log.run))
            service.session = ProviderSession(
                provider=service.provider, target=provider_target(config, store, service.builtin), store=store,
                metrics=metrics, provider_timeout=config.episodes.provider_timeout, wall_clock=wall_clock,
                on_ready=session_ready, call_log=service.call_log,
                endpoint=provider_endpoint(config.provider_upstream),
                spare_process=lambda: (holder.current.provider_upstream is None
                                       or holder.current.provider_upstream.spare_process),
                export_spans=lambda: holder.current.telemetry.export_all)
            await sup.start(ChildSpec("provider_session", service.session.run))
            service.index = Index(store, wall_clock=wall_clock)
            await sup.start(ChildSpec("index", service.index.run))
            service.summary = SummaryActor(settings=settings if config.episodes.summary else None,
                                           budget=budget, metrics=metrics)
            await sup.start(ChildSpec("summary", service.summary.run))
            service.assembler = Assembler(config=lambda: holder.current, summarize=service.summarize,
                                          pull_request_for=service.pull_request_for, metrics=metrics,
                                          read=store.read)
            await sup.start(ChildSpec("assembler", service.assembler.run))
            service.retention = Retention(
                store=store, provider=service.provider, provider_address=service.session.address,
                index_address=service.index.address, metrics=metrics, wall_clock=wall_clock,
                provider_timeout=config.episodes.provider_timeout,
                retention=lambda: holder.current.episodes.retention)
            await sup.start(ChildSpec("retention", service.retention.run))
            service.briefing = Briefing(
                store=store, metrics=metrics, provider=service.provider, session_address=service.session.address,
                index_address=service.index.address, config=lambda: holder.current, wall_clock=wall_clock)
            await sup.start(ChildSpec("briefing", service.briefing.run))
            # Started last so it is stopped first: running runs are stopped and recorded while the
            # actors the record goes through are still up.
            service.runs = Runs(service, gateway_url=lambda: service.gateway_url)
            await sup.start(ChildSpec("runs", service.runs.run, shutdown_grace=service.runs.shutdown_grace))
            metrics.watch_mailboxes(lambda: (service.session.address, service.index.address,
                                             service.summary.address, service.assembler.address,
                                             service.retention.address, service.briefing.address))
            yield service
    finally:
        store.close()

