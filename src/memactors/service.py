"""The memory service: the supervised actors wired together, and MemoryService's handlers (REQ-19).

`open_memory_service(holder)` is how the daemon embeds memactors:

    async with open_memory_service(ConfigHolder(load_config)) as memory:
        await memory.ingest_run(record_json)

Inside, a one-for-one supervisor runs the actors (provider session, index, summary, assembler,
retention); they talk only through their addresses. The handlers below are the single path every
surface (RPC, CLI, gateway, TUI) takes: none has a private one.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import mcp
import trio
from loguru import logger
from mcp.client.streamable_http import streamable_http_client

from . import contract
from ._kernel import ChildSpec, Supervisor, open_supervisor
from ._wire import parse_run_record, parse_time
from .actors.assembler import Assemble, Assembled, Assembler
from .actors.index import FilterItems, GetEpisode, Index, ListEpisodes, RecordRun, episode_view
from .actors.provider_session import GetStatus, ProviderSession, ProviderStatus, provider_call
from .actors.retention import PendingCounts, RecordNow, Retention
from .actors.summary import Summarize, SummaryActor, model_api_settings
from .builtin import BuiltinProvider
from .config import Config, ConfigHolder, McpServerConfig, parse_duration
from .errors import ConfigError, InvalidArgument, ProviderUnavailable, UnknownEpisode
from .metrics import Metrics
from .modelapi import SummaryResult, UtilityBudget
from .repo import resolve_repo, scope_for
from .rpc import Method
from .store import Store, WallClock, iso, utc_now

SERVICE = "harness.v1.MemoryService"
DB_NAME = "memactors.db"


def provider_target(config: Config, store: Store) -> Callable[[], Any]:
    """How to reach the configured provider: the built-in server in-process, or the [mcp.<name>] upstream."""
    upstream = config.provider_upstream
    if upstream is None:
        server = BuiltinProvider(store).server()
        return lambda: server
    return lambda: upstream_target(upstream)


def upstream_target(upstream: McpServerConfig) -> Any:
    if upstream.command is not None:
        env = {**os.environ, **dict(upstream.env)}
        return mcp.StdioServerParameters(command=upstream.command, args=list(upstream.args), env=env)
    # A fresh httpx2 client per connection carries the configured headers (auth); the SDK closes it.
    http = httpx2.AsyncClient(headers=dict(upstream.headers), timeout=None)
    return streamable_http_client(str(upstream.url), http_client=http)


class MemoryService:
    """Handlers shared by every surface. Operator calls see every scope."""

    def __init__(self, *, holder: ConfigHolder, store: Store, metrics: Metrics, supervisor: Supervisor,
                 wall_clock: WallClock) -> None:
        self.holder = holder
        self.store = store
        self.metrics = metrics
        self.supervisor = supervisor
        self.wall_clock = wall_clock
        self.provider = holder.current.memory.provider
        self.session: ProviderSession
        self.index: Index
        self.assembler: Assembler
        self.retention: Retention
        self.summary: SummaryActor

    @property
    def config(self) -> Config:
        return self.holder.current

    # -- daemon API ----------------------------------------------------------------------------------
    async def ingest_run(self, data: Any, *, source: str = "record") -> dict[str, Any]:
        """Take a closed run record: store it, assemble its episode, record it (or queue the record).

        Returns once the run (and its episode with a pending record) is committed — from then on
        nothing is lost — and after one record attempt bounded by provider_timeout.
        """
        record = parse_run_record(data, source=source)
        log = logger.bind(harness=record.harness, run=record.run_id)
        assembled: Assembled = await self.assembler.address.ask(Assemble(record))
        episode = assembled.episode
        new = await self.index.address.ask(RecordRun(
            record=record, repo=assembled.repo, branch=assembled.branch, paths=assembled.paths,
            episode=episode, text=assembled.text, provider=self.provider))
        if episode is None:
            self.metrics.episode_recorded(self.provider, "skipped")
            log.bind(reason=assembled.skipped).info("no episode for run")
            return {"harness": record.harness, "run_id": record.run_id, "outcome": "skipped",
                    "reason": assembled.skipped}
        outcome = "recorded"
        if new:
            outcome = "queued"
            with trio.move_on_after(self.config.episodes.provider_timeout):
                outcome = await self.retention.address.ask(RecordNow(episode.episode_id))
        else:
            outcome = "duplicate"
        log.bind(episode=episode.episode_id, outcome=outcome, bytes=len(assembled.text or "")).info("run ingested")
        return {"harness": record.harness, "run_id": record.run_id, "episode_id": episode.episode_id,
                "outcome": outcome}

    async def summarize(self, text: str) -> SummaryResult:
        return await self.summary.address.ask(Summarize(text))

    async def pull_request_for(self, repo: str, branch: str) -> str | None:
        """The pull request the graph links to (repo, branch), if any (filled by the graph module)."""
        return None

    # -- MemoryService handlers ----------------------------------------------------------------------
    async def status(self) -> dict[str, Any]:
        st: ProviderStatus = await self.session.address.ask(GetStatus())
        pending = await self.retention.address.ask(PendingCounts())

        def counts(db: Any) -> dict[str, int]:
            row = db.execute("SELECT count(*), sum(forgotten_at IS NULL) FROM episodes").fetchone()
            idx = db.execute("SELECT count(*) FROM memory_index WHERE provider = ? AND forgotten_at IS NULL",
                             [self.provider]).fetchone()
            return {"episodes": row[0] or 0, "live_episodes": row[1] or 0, "indexed_ids": idx[0] or 0}

        cfg = self.config
        upstream = cfg.provider_upstream
        return {
            "provider": self.provider,
            "transport": "in-process" if upstream is None else upstream.transport,
            "state": st.state,
            "contract": st.contract,
            "provider_info": {"name": st.provider_name, "version": st.provider_version} if st.provider_name else None,
            "breaker": st.breaker,
            "last_error": st.last_error,
            "state_for_seconds": round(trio.current_time() - st.since, 3),
            "counts": await self.store.read(counts),
            "pending": {
                "records": pending.get("record_pending", 0), "forgets": pending.get("forget_pending", 0),
                "record_failed": pending.get("record_failed", 0), "forget_failed": pending.get("forget_failed", 0),
            },
            "episodes_config": {
                "retention": cfg.episodes.retention_text, "summary": cfg.episodes.summary,
                "provider_timeout": cfg.episodes.provider_timeout_text, "excerpt_chars": cfg.episodes.excerpt_chars,
            },
        }

    async def list_episodes(self, *, harness: str | None = None, repo: str | None = None,
                            since: str | None = None, limit: int = 100) -> dict[str, Any]:
        since_iso = parse_since(since, self.wall_clock()) if since else None
        rows = await self.index.address.ask(ListEpisodes(harness=harness, repo=repo, since=since_iso, limit=limit))
        return {"episodes": [_summary_line(r) for r in rows]}

    async def get_episode(self, episode_id: str) -> dict[str, Any]:
        row = await self.index.address.ask(GetEpisode(episode_id))
        if row is None:
            raise UnknownEpisode(f"no episode {episode_id}", episode=episode_id)
        return episode_view(row)

    async def recall_episodes(self, *, query: str, scopes: list[str], limit: int = 8,
                              paths: tuple[str, ...] = ()) -> dict[str, Any]:
        """The episodes section of a recall: provider items through REQ-9's filter, or degraded."""
        arguments: dict[str, Any] = {"query": query, "scope": scopes, "limit": limit}
        if paths:
            arguments["paths"] = list(paths)
        contract.check_request("memory_recall", arguments)
        degraded: str | None = None
        items: list[dict[str, Any]] = []
        try:
            with trio.fail_after(self.config.episodes.provider_timeout):
                payload = await provider_call(self.session.address, "memory_recall", arguments)
            valid, invalid = contract.split_items(payload)
            if isinstance(payload.get("degraded"), str):
                degraded = payload["degraded"]
            filtered = await self.index.address.ask(FilterItems(
                provider=self.provider, items=tuple(valid), invalid=invalid,
                visible_scopes=frozenset(scopes), limit=limit))
            for reason, count in filtered.dropped:
                self.metrics.dropped(self.provider, reason, count)
            for kept in filtered.kept:
                p = kept.provenance
                items.append({
                    "label": "episode", "provider": self.provider, "episode_id": p.episode_id, "run_id": p.run_id,
                    "harness": p.harness, "adapter": p.adapter, "model": p.model, "repo": p.repo,
                    "branch": p.branch, "outcome": p.outcome, "at": p.started_at, "score": kept.score,
                    "text": kept.text, "untrusted": True,
                })
            outcome = "degraded" if degraded else "ok"
        except (ProviderUnavailable, trio.TooSlowError) as exc:
            degraded, outcome = "provider_unavailable", "degraded"
            logger.bind(provider=self.provider, error=type(exc).__name__).warning("recall degraded")
        self.metrics.recall(self.provider, outcome)
        return {"degraded": degraded, "episodes": items}

    async def recall(self, *, query: str, repo: str | None = None, as_harness: str | None = None,
                     paths: tuple[str, ...] = (), limit: int = 8) -> dict[str, Any]:
        """Operator recall (REQ-19): `repo` or `as_harness` selects whose view."""
        if not query or len(query) > contract.MAX_QUERY_CHARS:
            raise InvalidArgument("query must be 1 to 512 characters", field="query")
        if not 1 <= limit <= 20:
            raise InvalidArgument("limit must be 1 to 20", field="limit")
        if repo is None and as_harness is None:
            raise InvalidArgument("recall needs --repo or --as", field="repo")
        if repo is None:
            harness = self.config.harness.get(str(as_harness))
            if harness is None:
                raise InvalidArgument(f"unknown harness {as_harness}", field="as")
            repo = await self.harness_repo(harness.name)
            if repo is None:
                return {"query_scope": None, "degraded": None, "episodes": []}
        scope = scope_for(repo)
        result = await self.recall_episodes(query=query, scopes=[scope], limit=limit, paths=paths)
        return {"query_scope": scope, **result}

    async def harness_repo(self, harness: str) -> str | None:
        """The repository a harness works in now: its latest run's repo (SPEC-0027's record), else its workdir's."""
        row = await self.store.read(lambda db: db.execute(
            "SELECT repo FROM runs WHERE harness = ? AND repo IS NOT NULL ORDER BY ended_at DESC LIMIT 1",
            [harness]).fetchone())
        if row:
            return row[0]
        cfg = self.config.harness.get(harness)
        if cfg and cfg.workdir:
            workdir = str(Path(cfg.workdir).expanduser())  # noqa: ASYNC240 -- reads $HOME, no I/O
            info = await resolve_repo(workdir)
            return info.key if info else None
        return None

    # -- RPC --------------------------------------------------------------------------------------------
    def rpc_methods(self) -> list[Method]:
        def m(name: str, tier: str, handler: Callable[[dict[str, Any]], Any]) -> Method:
            return Method(f"{SERVICE}/{name}", tier, handler)  # type: ignore[arg-type]

        async def ingest(p: dict[str, Any]) -> Any:
            return await self.ingest_run(_param(p, "record", dict), source=str(p.get("source", "record")))

        return [
            m("Status", "read", lambda p: self.status()),
            m("ListEpisodes", "read", lambda p: self.list_episodes(
                harness=_opt(p, "harness"), repo=_opt(p, "repo"), since=_opt(p, "since"),
                limit=int(p.get("limit", 100)))),
            m("GetEpisode", "read", lambda p: self.get_episode(_param(p, "episode_id", str))),
            m("Recall", "read", lambda p: self.recall(
                query=_param(p, "query", str), repo=_opt(p, "repo"), as_harness=_opt(p, "as"),
                paths=tuple(p.get("paths") or ()), limit=int(p.get("limit", 8)))),
            m("IngestRun", "control", ingest),
        ]


def _param(params: dict[str, Any], name: str, kind: type) -> Any:
    value = params.get(name)
    if not isinstance(value, kind):
        raise InvalidArgument(f"params.{name} must be a {kind.__name__}", field=name)
    return value


def _opt(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"params.{name} must be a string", field=name)
    return value


def parse_since(text: str, now: datetime) -> str:
    """`--since`: a duration back from now ("7d", "12h") or an RFC 3339 time."""
    try:
        return iso(now - timedelta(seconds=parse_duration(text)))
    except ConfigError:
        pass
    try:
        return iso(parse_time(text))
    except ValueError:
        raise InvalidArgument(f"--since {text!r} is neither a duration (7d, 12h) nor an RFC 3339 time",
                              field="since") from None


def _summary_line(row: Any) -> dict[str, Any]:
    return {"episode_id": row.episode_id, "harness": row.harness, "run_id": row.run_id, "repo": row.repo,
            "branch": row.branch, "outcome": row.outcome, "started_at": row.started_at,
            "recorded_at": row.recorded_at}


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
    store = await Store.open(store_path or config.store.path / DB_NAME)
    try:
        async with open_supervisor("memory", max_restarts=5, window=60.0) as sup:
            service = MemoryService(holder=holder, store=store, metrics=metrics, supervisor=sup,
                                    wall_clock=wall_clock)
            service.session = ProviderSession(
                provider=service.provider, target=provider_target(config, store), store=store, metrics=metrics,
                provider_timeout=config.episodes.provider_timeout, wall_clock=wall_clock)
            await sup.start(ChildSpec("provider_session", service.session.run))
            service.index = Index(store, wall_clock=wall_clock)
            await sup.start(ChildSpec("index", service.index.run))
            settings = model_api_settings(config.model_api)
            budget = UtilityBudget(requests_per_minute=settings.requests_per_minute,
                                   daily_requests=settings.daily_requests) if settings else None
            service.summary = SummaryActor(settings=settings if config.episodes.summary else None,
                                           budget=budget, metrics=metrics)
            await sup.start(ChildSpec("summary", service.summary.run))
            service.assembler = Assembler(config=lambda: holder.current, summarize=service.summarize,
                                          pull_request_for=service.pull_request_for)
            await sup.start(ChildSpec("assembler", service.assembler.run))
            service.retention = Retention(
                store=store, provider=service.provider, provider_address=service.session.address,
                index_address=service.index.address, metrics=metrics, wall_clock=wall_clock,
                provider_timeout=config.episodes.provider_timeout)
            await sup.start(ChildSpec("retention", service.retention.run))
            yield service
    finally:
        store.close()

