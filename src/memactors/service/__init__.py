"""The memory service: the supervised actors wired together, and MemoryService's handlers (REQ-19).

`open_memory_service(holder)` is how the daemon embeds memactors:

    async with open_memory_service(ConfigHolder(load_config)) as memory:
        await memory.ingest_run(record_json)

Inside, a one-for-one supervisor runs the actors (provider session, index, summary, assembler,
retention); they talk only through their addresses. The handlers below are the single path every
surface (RPC, CLI, gateway, TUI) takes: none has a private one.

The package: this module (MemoryService and `open_memory_service`); ``ingest``, the ingest pipeline, a
stage below the handlers that reaches the actors through the `Stages` it is handed; ``providers``, how
the daemon reaches its provider and checks one (REQ-4). May import: the actors, the built-in provider,
the agent side, the store and the pure modules; never a surface (the RPC method table, the gateway and
the daemon import this package, not the reverse).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio
from loguru import logger

from .._toml_tables import is_duration
from .._wire import parse_time
from ..actors.assembler import Assembler
from ..actors.briefing import (
    UNATTRIBUTED,
    Briefing,
    BriefingAnswer,
    BriefingRequest,
    RecallAnswer,
    RecallRequest,
    View,
    latest_run_place,
    resolve_view,
    run_place,
)
from ..actors.call_log import CallLog
from ..actors.index import GetEpisode, Index, ListEpisodes, episode_view
from ..actors.kernel import ChildSpec, Supervisor, open_supervisor
from ..actors.provider_session import GetStatus, ProviderSession, ProviderStatus
from ..actors.retention import (
    ForgetEpisode,
    PendingCounts,
    Retention,
    RetryNow,
)
from ..actors.runs import CancelRun, FindRun, ListRuns, Runs, RunsPort, StartRun
from ..actors.summary import SummaryActor, model_api_settings
from ..builtin import BuiltinProvider, missing_vectors
from ..config import Config, ConfigHolder, HarnessConfig, parse_duration
from ..doctor import doctor_rows
from ..embedding import BUILTIN_MODEL, LocalEmbedder, model_dir, model_info
from ..errors import (
    ConfigError,
    InvalidArgument,
    NoRepository,
    StoreUnavailable,
    UnknownEpisode,
)
from ..gist import lead
from ..metrics import INGEST_OUTCOMES, Metrics
from ..modelapi import ModelApiClient, SummaryResult, UtilityBudget
from ..redact import redact
from ..redact import shared as shared_redactor
from ..repo import match_repo, repo_key, resolve_repo, scope_for
from ..store import (
    Db,
    Store,
    WallClock,
    agent_runs,
    briefing_cache,
    ensure_daemon_id,
    facts,
    iso,
    presence,
    pull_requests,
    run_tokens,
    utc_now,
    votes,
)
from ..store.engines import open_store
from ..store.episodes import EpisodePage, episode_counts, is_known_repo, known_repos
from ..store.pending import ForgetOutcome, first_pending_at
from ..store.run_history import latest_repo
from ..telemetry import guard_sdk_spans
from ..wrapper import cut_at_word
from .ingest import ingest, ingest_batch
from .installs import InstallActivity, install_rows, read_installs
from .providers import check_target, provider_endpoint, provider_target, upstream_target

DB_NAME = "memactors.db"
#: Most episodes one ListEpisodes page returns.
MAX_PAGE = 1000
#: "A run of degraded recalls" (issue 20): this many in a row, the last within DEGRADED_RECENT_SECONDS,
#: make Status say the memory is degraded even while the breaker is closed (a provider that times out
#: now and then never opens it, yet every recall may come back without episodes).
DEGRADED_RUN = 3
DEGRADED_RECENT_SECONDS = 900.0


def degraded_reason(st: ProviderStatus, recalls: dict[str, Any]) -> str | None:
    """Why recall is degraded now, for Status (`memory status` exits 15) and doctor; None when it is not.

    An open (or half-open) breaker on a provider that is otherwise up: every recall is answered without
    episodes and records are queued until it closes. A run of degraded recalls: the last DEGRADED_RUN or
    more came back without episodes, the latest recently."""
    if st.state == "ready" and st.breaker != "closed":
        return f"breaker {st.breaker}: recalls are answered without episodes and records are queued"
    ago = recalls.get("last_degraded_seconds_ago")
    if recalls.get("degraded_in_a_row", 0) >= DEGRADED_RUN and ago is not None and ago <= DEGRADED_RECENT_SECONDS:
        return (f"the last {recalls['degraded_in_a_row']} recalls were degraded (provider_unavailable), the latest "
                f"{int(ago)} s ago")
    return None


def _lasted(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def provider_condition(*, state: str, breaker: str | None, since: str | None, seconds: float,
                       last_error: str | None) -> str:
    """The provider's real state in one line, for every surface that used to show only the breaker
    (`memory status`, doctor, the TUI's header; issue 33).

    The breaker only ever sees calls that reach a ready provider: one that is down, connecting or
    incompatible is refused before the breaker, which therefore stays closed however long the outage.
    So the breaker is named only for a ready provider; otherwise the state says since when (``since``,
    an ISO time, and how long: ``seconds``) and the last error: ``unreachable since
    2026-12-02T03:00:00.000Z (6 min); last error: cannot start /nonexistent/memory-provider: ...``."""
    if state == "ready":
        return f"ready, breaker {breaker or 'closed'}"
    word = {"down": "unreachable", "connecting": "connecting", "incompatible": "incompatible"}.get(state, state)
    text = f"{word} since {since} ({_lasted(seconds)})" if since else word
    return f"{text}; last error: {last_error}" if last_error else text


#: The longest a minted run token may live (`token mint --ttl`); a resident's token is re-minted.
MAX_TOKEN_TTL_SECONDS = 366 * 86400


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
        self.call_log: CallLog
        self.index: Index
        self.assembler: Assembler
        self.retention: Retention
        self.summary: SummaryActor
        self.briefing: Briefing
        self.runs: Runs
        #: The gateway's URL once the daemon serves it (``gateway.start_gateway``; runs get it in their
        #: MCP config), else None.
        self.gateway_url: str | None = None
        self.builtin: BuiltinProvider = BuiltinProvider(store)
        #: What this daemon saw of each resident install (gateway requests, briefings); issue 40.
        self.installs = InstallActivity(started=wall_clock())

    @property
    def config(self) -> Config:
        return self.holder.current

    # -- daemon API ----------------------------------------------------------------------------------
    async def ingest_run(self, data: Any, *, source: str = "record",
                         harness_config: HarnessConfig | None = None) -> dict[str, Any]:
        """Take a closed run record: store it, assemble its episode, record it (or queue the record).

        Returns once the run (and its episode with a pending record) is committed — from then on
        nothing is lost — and after one record attempt bounded by provider_timeout. ``harness_config``
        is the harness as the run saw it (a run started by the daemon, with its project file merged),
        for REQ-8's eligibility; by default the global configuration's.
        """
        (result,) = await ingest(self, [(data, source, harness_config)])
        if isinstance(result, BaseException):
            self._count_ingested(data, "rejected")
            raise result
        self._count_ingested(data, str(result.get("outcome")))
        return result

    async def ingest_runs(self, entries: list[Any]) -> dict[str, Any]:
        """IngestRuns: many closed run records in one call, a result per record in the same order.

        Each result is IngestRun's, or `{"source", "outcome": "rejected", "error": {code, message}}` for a
        record that was refused; one bad record never stops the rest of the batch. The batch is prepared,
        assembled and stored together — a thread hop per stage and one write transaction for all its
        runs and episodes (each record in its own savepoint), committed before any is answered — then
        its episodes are recorded to the provider concurrently.
        """
        answer = await ingest_batch(self, entries)
        for entry, result in zip(entries, answer.get("results") or (), strict=False):
            self._count_ingested(entry.get("record") if isinstance(entry, dict) else None, str(result.get("outcome")))
        return answer

    def _count_ingested(self, data: Any, outcome: str) -> None:
        """Issue 40's metrics: a resident's session record (its trigger ``session-end``), or an imported one
        (``import <source>``), by what became of it. Other records (runs, `runs ingest`) are not counted here."""
        if not isinstance(data, dict) or outcome not in INGEST_OUTCOMES:
            return
        trigger = data.get("trigger")
        name = str(trigger.get("name") or "") if isinstance(trigger, dict) else ""
        if name == "session-end" or name.startswith("session-end"):
            self.metrics.resident_session(str(data.get("adapter") or ""), outcome)
        elif name.startswith("import "):
            self.metrics.imported(name.removeprefix("import ").strip(), outcome)

    async def summarize(self, text: str, episode_id: str | None = None) -> SummaryResult:
        return await self.summary.summarize(text, episode_id)

    async def pull_request_for(self, repo: str, branch: str | None) -> str | None:
        """The pull request SPEC-0027's graph links to (repo, branch) now, if any (REQ-5 pull_request)."""
        return await self.store.read(lambda db: pull_requests.pull_request_for(db, repo, branch))

    # -- MemoryService handlers ----------------------------------------------------------------------
    async def store_status(self) -> dict[str, Any]:
        """Which store this daemon uses and whether it answers now (`status` and `doctor` show it): the
        engine, where it is (``user@host:port/db`` for PostgreSQL: never the password), this daemon's id
        (daemons sharing a store tell each other apart by it), whether it answers (`reachable`) and can
        write (`writable`, the store's health: a full disk), and the error while it cannot."""
        # The ping first: it clears (or sets) the engine's last error, which the snapshot then reports,
        # so a store that came back is not reported with the error of the outage (issue 30).
        error = await self.store.ping()
        snapshot = await trio.to_thread.run_sync(self.store.health.snapshot)
        out = {**snapshot, "engine": self.store.engine, "where": self.store.where,
               "daemon_id": self.store.daemon_id, "reachable": error is None}
        if error is not None and self.store.engine == "sqlite":  # the file is there but damaged (issue 34)
            out.update(reachable=True, writable=False, damaged=True, error=error)
        elif error is not None:
            out.update(writable=False, error=error)
        return out

    async def status(self) -> dict[str, Any]:
        st: ProviderStatus = await self.session.address.ask(GetStatus())
        store = await self.store_status()

        def counts(db: Db) -> dict[str, int]:
            return episode_counts(db, self.provider)

        # A store that does not answer (PostgreSQL down) leaves counts and pending unknown (None): the
        # status itself is still answered, saying so.
        pending: dict[str, int] | None = None
        counted: dict[str, int] | None = None
        if store["reachable"] and not store.get("damaged"):
            try:
                pending = await self.retention.address.ask(PendingCounts())
                counted = await self.store.read(counts)
            except StoreUnavailable as exc:
                store.update(reachable=False, writable=False, error=exc.message)
            except Exception as exc:  # ok: re-raised unless it is a damaged page, reported as such
                self._damaged(store, exc)

        cfg = self.config
        upstream = cfg.provider_upstream
        now = self.wall_clock()
        recalls = self.metrics.recall_health(now)
        lasted = max(trio.current_time() - st.since, 0.0)
        since = (now - timedelta(seconds=lasted)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "provider": self.provider,
            "transport": "in-process" if upstream is None else upstream.transport,
            "state": st.state,
            "contract": st.contract,
            "provider_info": {"name": st.provider_name, "version": st.provider_version} if st.provider_name else None,
            "breaker": st.breaker,
            "last_error": st.last_error,
            "state_for_seconds": round(lasted, 3),
            "state_since": since,
            "condition": provider_condition(state=st.state, breaker=st.breaker, since=since, seconds=lasted,
                                            last_error=st.last_error),
            "counts": counted,
            "pending": None if pending is None else {
                "records": pending.get("record_pending", 0), "forgets": pending.get("forget_pending", 0),
                "record_failed": pending.get("record_failed", 0), "forget_failed": pending.get("forget_failed", 0),
                "record_quarantined": pending.get("record_quarantined", 0),
            },
            "store": store,
            "recalls": recalls,
            "degraded": degraded_reason(st, recalls),
            "episodes_config": {
                "retention": cfg.episodes.retention_text, "summary": cfg.episodes.summary,
                "provider_timeout": cfg.episodes.provider_timeout_text, "excerpt_chars": cfg.episodes.excerpt_chars,
            },
            "embeddings": await self.embeddings_status() if store["reachable"] and not store.get("damaged") else None,
            "installs": await self.install_status() if store["reachable"] and not store.get("damaged") else None,
        }

    def _damaged(self, store: dict[str, Any], exc: Exception) -> None:
        """Mark the status's ``store`` damaged when ``exc`` is a damaged page (Status and Doctor answer,
        naming the file, instead of INTERNAL: issue 45); re-raise anything else."""
        said = self.store.damage(exc)
        if said is None:
            raise exc
        store.update(reachable=True, writable=False, damaged=True, error=said)

    async def install_status(self) -> list[dict[str, Any]] | None:
        """Each resident install (agent, scope, harness) with when the agent last reached the gateway,
        its last briefing and its last recorded session, and whether it looks silent (issue 40); None when
        the store does not answer."""
        try:
            stored = await self.store.read(read_installs)
        except StoreUnavailable:
            return None
        return install_rows(stored, self.installs, self.wall_clock())

    async def embeddings_status(self) -> dict[str, Any] | None:
        """The built-in provider's embeddings (REQ-11): which model, where it runs, how many episodes
        have a vector and how many wait for one; the embedded model's memory once loaded. None when
        embeddings are off (``[memory] embeddings = false``) or episodes go to another provider."""
        builtin = self.builtin
        if not self.config.memory.is_builtin or not builtin.hybrid:
            model_api = self.config.model_api
            if (self.config.memory.is_builtin and self.config.memory.embeddings
                    and (model_api is None or not model_api.embedding_model)):
                return {"model": BUILTIN_MODEL, "source": "embedded", "runtime": model_info(), "episodes": 0,
                        "with_vector": 0, "pending": 0, "off": "the embedded model is not installed"}
            return None
        try:
            out = await builtin.vector_status()
        except StoreUnavailable:
            return None
        model_api = self.config.model_api
        if model_api is None or not model_api.embedding_model:
            out["source"] = "embedded"
            out["runtime"] = model_info()
        else:
            out["source"] = "model_api"
        return out

    async def list_episodes(self, *, harness: str | None = None, repo: str | None = None,
                            since: str | None = None, limit: int = 100, after: str | None = None,
                            outcome: str | None = None, paths: tuple[str, ...] = (),
                            run_id: str | None = None) -> dict[str, Any]:
        """One page of episodes, newest first by when their run started: ``{episodes, total,
        next_cursor}`` (and ``repo_match`` when a repository was given: what it was read as). Each row
        carries the episode's ``gist`` (the run's own first words) and ``files``. Pass ``next_cursor``
        back as ``after`` for the next page; it is None on the last one. ``outcome`` keeps one run
        outcome, ``paths`` the episodes whose run touched any of them, ``run_id`` one run's."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidArgument(f"limit must be 1..{MAX_PAGE}, got {limit}", field="limit")
        if outcome is not None and outcome not in RUN_OUTCOMES:
            raise InvalidArgument(f"outcome must be one of {', '.join(RUN_OUTCOMES)}", field="outcome")
        since_iso = parse_since(since, self.wall_clock()) if since else None
        repo_match = await self.match_repo(repo) if repo else None
        if repo_match is not None:
            repo = repo_match["key"]
        page: EpisodePage = await self.index.address.ask(ListEpisodes(
            harness=harness, repo=repo, since=since_iso, limit=limit, after=after, outcome=outcome,
            paths=tuple(paths), run_id=run_id))
        result: dict[str, Any] = {"episodes": [_summary_line(r) for r in page.rows], "total": page.total,
                                  "next_cursor": page.next_cursor}
        if repo_match is not None:
            result["repo_match"] = repo_match
        return result

    async def match_repo(self, given: str) -> dict[str, Any]:
        """Read what an operator typed for a repository (key, remote URL, owner/name) as the repository
        key episodes are stored under; see ``repo.match_repo``."""
        def read(db: Any) -> dict[str, Any]:
            # The usual case, a key that is stored, is one index seek; only a URL, a suffix or a typo
            # needs the list of every repository (a scan of the episodes).
            key = repo_key(given)
            if is_known_repo(db, key):
                return {"given": given, "key": key, "status": "known"}
            return match_repo(given, known_repos(db))

        return await self.store.read(read)

    async def get_episode(self, episode_id: str) -> dict[str, Any]:
        row = await self.index.address.ask(GetEpisode(episode_id))
        if row is None:
            shown = redact(episode_id)[:64]  # a client's id: never echoed raw (issue 9)
            raise UnknownEpisode(f"no episode {shown}", episode=shown)
        return episode_view(row)

    async def recall(self, *, query: str, repo: str | None = None, as_harness: str | None = None,
                     paths: tuple[str, ...] = (), limit: int = 8) -> dict[str, Any]:
        """Operator recall (REQ-19): REQ-12's document as `repo` or harness `as_harness` would see it.

        The operator sees every scope, so either selects whose view; no exposure is written (no run saw
        it). Returns the wrapped text (`document`), its JSON form (`structured`) and flat lists per
        section for scripts.
        """
        if repo is None and as_harness is None:
            raise InvalidArgument("recall needs --repo or --as", field="repo")
        repo_match = None
        if repo is not None:
            repo_match = await self.match_repo(repo)
            repo = repo_match["key"]
        else:
            harness = self.config.harness.get(str(as_harness))
            if harness is None:
                raise InvalidArgument(f"params.as {NO_HARNESS_TABLE}", field="params.as")
            repo = await self.harness_repo(harness.name)
            if repo is None:
                raise NoRepository(f"harness {harness.name} has no repository (no run in one, no workdir in "
                                   "a git repository), so it has no episode scope", harness=harness.name)
        view = View("operator", harness=as_harness, repo=repo)  # an operator's recall is for no branch
        answer = await self.briefing.address.ask(RecallRequest(
            view=view, query=query, paths=tuple(paths), limit=limit, deadline=trio.current_effective_deadline()))
        result = {"query_scope": scope_for(repo) if repo else None, "degraded": answer.document.degraded,
                  "truncated": answer.document.truncated, "document": answer.text, "structured": answer.json,
                  **_flat_sections(answer.json)}
        if repo_match is not None:
            result["repo_match"] = repo_match
        return result

    async def get_briefing(self, harness: str) -> dict[str, Any]:
        """Operator preview (REQ-19 GetBriefing): the document the harness would receive now, computed
        fresh; it is neither cached nor counted as exposure (REQ-17)."""
        cfg = self.config.harness.get(harness)
        if cfg is None:
            raise InvalidArgument(f"params.harness {NO_HARNESS_TABLE}", field="params.harness")
        view = await resolve_view(self.store, self.config, harness=harness, run_id=None)
        if view.repo is None:
            place = await self.store.read(lambda db: latest_run_place(db, harness))
            if place is not None:
                view = attrs.evolve(view, repo=place[0], branch=place[1])
        answer = await self.briefing.address.ask(BriefingRequest(
            view=attrs.evolve(view, kind="operator"), delivery="preview",
            deadline=trio.current_effective_deadline()))
        return {"harness": harness, "document": answer.text, "structured": answer.json,
                "bytes": answer.nbytes, "chars": len(answer.text), "items": dict(answer.items),
                "degraded": answer.document.degraded, "briefing_max_chars": cfg.briefing_max_chars,
                "memory_briefing": cfg.memory_briefing, "provider": self.provider}

    async def describe_harness(self, harness: str) -> dict[str, Any]:
        """DescribeHarness (REQ-20, SPEC-0006 "Prompt Source"): a configured harness with its prompt source
        exactly as configured. Never a briefing: the one a `memory_briefing` one-shot gets is prepended
        at spawn and never stored, so the prompt shown is the operator's, byte for byte."""
        cfg = self.config.harness.get(harness)
        if cfg is None:
            raise InvalidArgument(f"params.harness {NO_HARNESS_TABLE}", field="params.harness")
        prompts = {"prompt": cfg.prompt, "prompt_file": cfg.prompt_file, "prompt_template": cfg.prompt_template,
                   "prompt_template_file": cfg.prompt_template_file}
        return {"harness": cfg.name, "adapter": cfg.harness, "workdir": cfg.workdir,
                "memory_briefing": cfg.memory_briefing, "memory_record": cfg.memory_record,
                "untrusted_inline": cfg.untrusted_inline,
                "prompt_source": next((key for key, value in prompts.items() if value is not None), None),
                **prompts}

    # -- the agent side (gateway, spawn) ------------------------------------------------------------
    async def caller_view(self, token: str | None) -> View:
        """Resolve a gateway bearer token to the run's view (SPEC-0005); unattributed without a live one.

        One read hop: the token and its run's place are read together (the gateway's bearer gate calls
        this once per HTTP request and hands the view to the tool handlers)."""
        now = self.wall_clock()

        def read(db: Any) -> tuple[Any, tuple[str, str | None] | None]:
            found = run_tokens.resolve_run_token(db, token or "", now)
            return found, None if found is None else run_place(db, found.harness, found.run_id)

        caller, place = await self.store.read(read)
        if caller is None:
            return UNATTRIBUTED
        self.installs.saw(caller.harness, caller.run_id, now)
        return await resolve_view(self.store, self.config, harness=caller.harness, run_id=caller.run_id,
                                  workdir=caller.workdir or None, place=place)

    async def agent_recall(self, view: View, *, query: str, paths: tuple[str, ...] = (), limit: int = 8,
                           call_id: str | None = None) -> RecallAnswer:
        """REQ-12 recall for a harness's view, exposure written for the facts served (REQ-17)."""
        return await self.briefing.address.ask(RecallRequest(
            view=view, query=query, paths=paths, limit=limit, deadline=trio.current_effective_deadline(),
            call_id=call_id))

    async def agent_briefing(self, view: View, *, delivery: str, refresh: bool = False,
                             call_id: str | None = None, episodes_deadline: float | None = None) -> BriefingAnswer:
        """REQ-15 briefing for a run (tool, resource, prompt or spawn delivery); NotAttributed without one.

        The provider part ends by `episodes_deadline` (trio time) if given, else by the caller's deadline.
        """
        deadline = trio.current_effective_deadline() if episodes_deadline is None else episodes_deadline
        answer = await self.briefing.address.ask(BriefingRequest(
            view=view, delivery=delivery, refresh=refresh,  # type: ignore[arg-type]
            deadline=deadline, call_id=call_id))
        if view.exposed_run is not None:
            self.installs.briefed_at(*view.exposed_run, self.wall_clock())
        return answer

    # -- runs (memactors run) ---------------------------------------------------------------------------
    async def start_run(self, *, harness: str, prompt: str | None = None, run_id: str | None = None
                        ) -> dict[str, Any]:
        """StartRun: run the harness's one-shot now (docs/runs.md); answers once the agent is spawned."""
        state = await self.runs.address.ask(StartRun(harness, prompt, run_id))
        return state.view()

    async def wait_run(self, *, run_id: str, harness: str | None = None, wait_seconds: float = 30.0
                       ) -> dict[str, Any]:
        """WaitRun: the run's state, after waiting up to ``wait_seconds`` (at most 300) for it to end and
        be recorded. Call again while ``state`` is ``running``."""
        if not (0 <= wait_seconds <= 300):
            raise InvalidArgument("params.wait_seconds must be from 0 to 300", field="wait_seconds")
        state = await self.runs.address.ask(FindRun(run_id, harness))
        with trio.move_on_after(wait_seconds):
            await state.done.wait()
        return state.view()

    async def get_run(self, *, run_id: str, harness: str | None = None) -> dict[str, Any]:
        """GetRun: one run this daemon started, running or ended (ended runs are in the store, so they
        outlive a restart): state, pid, times, outcome, reason, cap, episode, the redacted stderr tail."""
        state = await self.runs.address.ask(FindRun(run_id, harness))
        return state.view()

    async def list_runs(self, *, harness: str | None = None, state: str | None = None, limit: int = 50,
                        after: str | None = None) -> dict[str, Any]:
        """ListRuns: runs this daemon started, newest first: ``{runs, total, next_cursor}``."""
        if state not in (None, "running", "ended"):
            raise InvalidArgument("params.state must be running or ended", field="params.state")
        return await self.runs.address.ask(ListRuns(harness, state, limit, after))  # type: ignore[arg-type]

    async def cancel_run(self, *, run_id: str, harness: str | None = None) -> dict[str, Any]:
        """CancelRun (control): stop a running run (SIGTERM, grace, SIGKILL); it is recorded as
        cancelled / operator_cancel. Answers at once with its state; WaitRun follows it to its end. An
        ended run is answered as it is (nothing to stop)."""
        state = await self.runs.address.ask(CancelRun(run_id, harness))
        return state.view()

    async def run_logs(self, *, run_id: str, harness: str | None = None, after: int = 0,
                       wait_seconds: float = 0.0) -> dict[str, Any]:
        """RunLogs: the run's events after sequence number ``after`` (its parsed stream, redacted; see
        docs/runs.md for what is kept), waiting up to ``wait_seconds`` (at most 300) for one while the
        run runs. ``{run_id, harness, state, events, next, dropped, kept}``: call again with ``after =
        next`` to follow; ``kept`` is false once an ended run's log was pruned or its episode forgotten."""
        if not (0 <= wait_seconds <= 300):
            raise InvalidArgument("params.wait_seconds must be from 0 to 300", field="wait_seconds")
        state = await self.runs.address.ask(FindRun(run_id, harness))
        watch = state.watch
        if watch is not None:
            with trio.move_on_after(wait_seconds):
                await watch.wait_after(after)
            events, kept = watch.since(after), True
            dropped = watch.dropped
        else:
            stored = await self.store.read(lambda db: agent_runs.log_of(db, state.harness, state.run_id))
            kept = stored is not None
            events, dropped = [e for e in stored or () if e.get("seq", 0) > after], state.log_dropped
        last = events[-1]["seq"] if events else after
        return {"run_id": state.run_id, "harness": state.harness, "state": state.state, "events": events,
                "next": last, "dropped": dropped, "kept": kept}

    # -- control-tier feeds (facts, pull requests, presence, votes, run tokens) ---------------------
    async def add_fact(self, *, scope: str, text: str, confidence: float, status: str = "live",
                       fact_id: str | None = None) -> dict[str, Any]:
        now = self.wall_clock()
        fact = await self.store.write(lambda db: facts.add_fact(
            db, scope=scope, text=text, confidence=confidence, status=status,  # type: ignore[arg-type]
            now=now, fact_id=fact_id))
        return attrs.asdict(fact)

    async def link_pull_request(self, *, repo: str, branch: str, url: str) -> dict[str, Any]:
        now = self.wall_clock()
        await self.store.write(lambda db: pull_requests.link_pull_request(db, repo=repo, branch=branch, url=url, now=now))
        return {"repo": repo, "branch": branch, "url": url}

    async def report_presence(self, *, harness: str, run_id: str, session_id: str, repo: str,
                              branch: str | None, paths: tuple[str, ...] = (), ttl_seconds: int = 300
                              ) -> dict[str, Any]:
        now = self.wall_clock()
        reported = await self.store.write(lambda db: presence.report_presence(
            db, harness=harness, run_id=run_id, session_id=session_id, repo=repo, branch=branch, paths=paths,
            now=now, ttl_seconds=ttl_seconds))
        return attrs.asdict(reported)

    async def cast_vote(self, *, fact_id: str, run_id: str, harness: str, stance: str) -> dict[str, Any]:
        """Store a vote; it is counted only when the run was never shown the fact (REQ-17)."""
        now = self.wall_clock()
        vote = await self.store.write(lambda db: votes.cast_vote(
            db, fact_id=fact_id, run_id=run_id, harness=harness, stance=stance, now=now))  # type: ignore[arg-type]
        return attrs.asdict(vote)

    async def mint_run_token(self, *, harness: str, run_id: str, workdir: str = "",
                             ttl_seconds: float | None = None, replace: bool = False) -> dict[str, Any]:
        """Mint the bearer token a run presents to the gateway (SPEC-0005); with ``ttl_seconds`` it
        expires that long from now (`memactors token mint --ttl`), at most a year.

        ``replace`` rotates: the run's earlier tokens are revoked and its cached briefing dropped in the
        same transaction, so the new token is the only one that works (`memactors install` run again)."""
        if ttl_seconds is not None and (isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float)
                                        or not 0 < ttl_seconds <= MAX_TOKEN_TTL_SECONDS):
            raise InvalidArgument(f"ttl_seconds must be a number of seconds from 1 to {MAX_TOKEN_TTL_SECONDS}",
                                  field="ttl_seconds")
        now = self.wall_clock()
        expires = None if ttl_seconds is None else now + timedelta(seconds=ttl_seconds)

        def mint(db: Any) -> tuple[str, int]:
            revoked = 0
            if replace:
                revoked = run_tokens.revoke_run_tokens(db, harness=harness, run_id=run_id)
                briefing_cache.drop_cached_briefing(db, harness, run_id)
            return run_tokens.mint_run_token(db, harness=harness, run_id=run_id, workdir=workdir, now=now,
                                        expires_at=expires), revoked

        token, revoked = await self.store.write(mint)
        return {"harness": harness, "run_id": run_id, "token": token, "revoked": revoked,
                "expires_at": None if expires is None else iso(expires)}

    async def revoke_run_tokens(self, *, harness: str, run_id: str) -> dict[str, Any]:
        """RevokeRunTokens: every token of the run stops working now (`memactors uninstall`); its cached
        briefing is dropped with them."""

        def revoke(db: Any) -> int:
            briefing_cache.drop_cached_briefing(db, harness, run_id)
            return run_tokens.revoke_run_tokens(db, harness=harness, run_id=run_id)

        return {"harness": harness, "run_id": run_id, "revoked": await self.store.write(revoke)}

    async def forget(self, episode_id: str) -> dict[str, Any]:
        """MemoryService.Forget (REQ-10): tombstone now, then memory_forget for each provider id.

        Answers once the tombstone is committed (recall drops the episode from then on) and one round of
        forgets bounded by provider_timeout has run; what is still pending is retried for 24 hours.
        """
        outcome: ForgetOutcome = await self.retention.address.ask(ForgetEpisode(episode_id, "operator"))
        return attrs.asdict(outcome)

    async def check_provider(self, provider: str | None = None) -> dict[str, Any]:
        """MemoryService.CheckProvider (REQ-4): the seven checks against the configured provider or a global upstream.

        The check has its own MCP connection; for the built-in provider an in-process one over this
        store, whose synthetic episodes land only in the built-in provider's own tables (never in
        episodes or memory_index) and are forgotten before the check returns.
        """
        cfg = self.config
        name = provider or self.provider
        # REQ-18: the check's MCP spans (client and server side) follow the same consent as the session's.
        guard_sdk_spans(lambda: self.config.telemetry.export_all)
        upstream = None
        if name == "builtin":
            target: Any = self.builtin.server()
        else:
            upstream = cfg.mcp.get(name)
            if upstream is None or upstream.origin == "project":
                raise InvalidArgument(f"--provider {name}: no [mcp.{name}] in the global file or a drop-in",
                                      field="provider")
            target = upstream_target(upstream)
        report = await check_target(target, provider=name, provider_timeout=cfg.episodes.provider_timeout,
                                    endpoint=provider_endpoint(upstream))
        return {**attrs.asdict(report), "ok": report.ok}

    async def harness_repo(self, harness: str) -> str | None:
        """The repository a harness works in now: its latest run's repo (SPEC-0027's record), else its workdir's."""
        repo = await self.store.read(lambda db: latest_repo(db, harness))
        if repo:
            return repo
        cfg = self.config.harness.get(harness)
        if cfg and cfg.workdir:
            workdir = str(Path(cfg.workdir).expanduser())  # noqa: ASYNC240 -- reads $HOME, no I/O
            info = await resolve_repo(workdir)
            return info.key if info else None
        return None

    async def doctor(self) -> dict[str, Any]:
        """REQ-19's doctor rows for memory, and REQ-18's note on where episodes go."""
        status = await self.status()
        now = self.wall_clock()

        def oldest(db: Db) -> dict[str, float]:
            firsts = first_pending_at(db, self.provider)
            return {kind: (now - parse_time(first)).total_seconds() for kind, first in firsts.items() if first}

        oldest_pending: dict[str, float] = {}
        missing = 0
        if status["store"]["reachable"] and not status["store"].get("damaged"):
            try:
                oldest_pending = await self.store.read(oldest)
                missing = await self.episodes_missing_vectors()
            except StoreUnavailable as exc:
                status["store"].update(reachable=False, writable=False, error=exc.message)
            except Exception as exc:  # ok: re-raised unless it is a damaged page, reported as such
                self._damaged(status["store"], exc)
        from ..agents.session_start import recent_failures

        started = await trio.to_thread.run_sync(recent_failures, self.config.store.path, now)
        rows = doctor_rows(
            self.config, status, oldest_pending_seconds=oldest_pending,
            degraded_recalls_24h=self.metrics.degraded_recalls_since(now - timedelta(hours=24)),
            episodes_missing_vectors=missing, embedding_model=self.builtin.embedding_model,
            missing_vectors_since=self.builtin.pending_since if missing else None,
            exhausted=self.supervisor.exhausted(), exhaustion_alarm=self.supervisor.exhaustion_alarm,
            exhaustion_limit=self.supervisor.exhaustion_limit,
            config_state=self.holder.state(), session_start=started)
        return {"rows": [attrs.asdict(r) for r in rows], "ok": all(r.status != "fail" for r in rows)}

    async def reindex(self, *, everything: bool = False) -> dict[str, Any]:
        """`memactors memory reindex`: wake the background embedder to give every episode without a
        vector its vector (`everything`: retire all vectors first, so every episode is embedded again;
        unchanged texts come back from the cache). Answers the embeddings' status at once; the CLI
        follows it to the end. INVALID_ARGUMENT when embeddings are off."""
        builtin = self.builtin
        if not self.config.memory.is_builtin or not builtin.hybrid:
            raise InvalidArgument("embeddings are off ([memory] embeddings = false, or another provider)",
                                  field="all")
        if everything:
            model = builtin.vector_model
            await self.store.write(lambda db: builtin.index.retire_vectors(db, model, everything=True))
        builtin.wake()
        return await self.embeddings_status() or {}

    async def episodes_missing_vectors(self) -> int:
        """Built-in episodes without an embedding for the model in use (0 with embeddings off)."""
        if not self.config.memory.is_builtin or not self.builtin.hybrid:
            return 0
        return await self.store.read(missing_vectors)


async def _close_quietly(client: ModelApiClient) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        await client.aclose()


if TYPE_CHECKING:
    def _memory_service_serves_the_runs_actor(service: MemoryService) -> RunsPort:
        return service  # the checker proves MemoryService has every member the runs actor's port names


def _flat_sections(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """A recall document's sections as flat lists (provenance merged with text) for scripts."""
    names = {"episode": "episode_id", "run": "run_id", "fact": "fact_id"}
    out: dict[str, list[dict[str, Any]]] = {}
    for section in doc["sections"]:
        rows = []
        for item in section["items"]:
            row = {names.get(k, k): v for k, v in item["provenance"].items()}
            row.update(label=item["label"], text=item["text"], untrusted=item["untrusted"])
            rows.append(row)
        out[section["name"]] = rows
    return out


#: The refusal of `--as` / a briefing preview for a name with no `[harness.<name>]` table. The name is
#: not repeated (a rejected value is never echoed); the CLI, which knows what its user typed, shows the
#: table to add with the name filled in.
NO_HARNESS_TABLE = ("names no configured harness: it needs a [harness.<name>] table in the global "
                    "harness.toml (episodes may list a harness, but only a configured one has a view)")


def parse_since(text: str, now: datetime) -> str:
    """`--since`: a duration back from now ("7d", "12h") or an RFC 3339 time."""
    try:
        return iso(now - timedelta(seconds=parse_duration(text)))
    except ConfigError as exc:
        if is_duration(text):  # a duration past the longest one: say so, with the limit
            raise InvalidArgument(f"--since {exc.message}", field="since") from None
    try:
        return iso(parse_time(text))
    except (ValueError, OverflowError):
        raise InvalidArgument("--since is neither a duration (7d, 12h) nor an RFC 3339 time",
                              field="since") from None


#: The run outcomes an episode may have (REQ-5), in the order people read them.
RUN_OUTCOMES = ("succeeded", "failed", "cancelled", "timed_out", "crashed", "capped")
#: Widest an episode list row's gist is (the run's own first words, cut between words).
LIST_GIST_CHARS = 200
#: Most files one episode list row names (the episode itself names them all).
LIST_FILES = 20


def _summary_line(row: Any) -> dict[str, Any]:
    """One ListEpisodes row: where and when, and what the run said (``gist``: its summary, else the start
    of its result excerpt) and touched (``files``), so a list of episodes can be read, not only opened."""
    ep = row.episode
    said = cut_at_word(lead({"summary": ep.summary, "result_excerpt": ep.result_excerpt}), LIST_GIST_CHARS) \
        if ep is not None else ""
    return {"episode_id": row.episode_id, "harness": row.harness, "run_id": row.run_id, "repo": row.repo,
            "branch": row.branch, "outcome": row.outcome, "started_at": row.started_at,
            "recorded_at": row.recorded_at, "gist": said,
            "files": list(ep.files_touched[:LIST_FILES]) if ep is not None else [],
            "files_total": len(ep.files_touched) if ep is not None else 0,
            "duration_ms": ep.duration_ms if ep is not None else None,
            "cost_usd": ep.cost_usd if ep is not None else None}


async def _repair_excerpts(store: Store, config: Config) -> None:
    """Issue 30's start-up repair: episodes stored with the excerpt `[prompt]` get their answer back from
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

