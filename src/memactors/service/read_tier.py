"""MemoryService's operator RPC read tier: what `memactors memory ...`, doctor and the TUI read.

Status and Doctor, the episode list and one episode, operator recall (every scope, no exposure written),
the briefing preview and a harness's description; each is a `read` method in `rpc/methods.py`. The runs'
read methods (WaitRun, GetRun, ListRuns, RunLogs) are with the runs, in `daemon_runs`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import trio

from .._toml_tables import is_duration
from .._wire import parse_time
from ..actors.briefing import BriefingRequest, RecallRequest
from ..actors.index import GetEpisode, ListEpisodes, episode_view
from ..actors.provider_session import GetStatus, ProviderStatus
from ..actors.retention import PendingCounts
from ..builtin import missing_vectors
from ..config import parse_duration
from ..doctor import doctor_rows
from ..documents import cut_at_word, lead
from ..errors import ConfigError, InvalidArgument, NoRepository, StoreUnavailable, UnknownEpisode
from ..redact import redact
from ..repo import match_repo, repo_key, resolve_repo, scope_for
from ..store import Db, iso
from ..store.episodes import EpisodePage, episode_counts, is_known_repo, known_repos
from ..store.pending import first_pending_at
from ..store.run_history import latest_repo
from ..view import View, latest_run_place, resolve_view
from .installs import install_rows, read_installs
from .parts import ServiceParts

#: Most episodes one ListEpisodes page returns.
MAX_PAGE = 1000
#: "A run of degraded recalls": this many in a row, the last within DEGRADED_RECENT_SECONDS,
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
    (`memory status`, doctor, the TUI's header).

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


class ReadHandlers(ServiceParts):
    """The operator's reads. Operator calls see every scope."""

    async def store_status(self) -> dict[str, Any]:
        """Which store this daemon uses and whether it answers now (`status` and `doctor` show it): the
        engine, where it is (``user@host:port/db`` for PostgreSQL: never the password), this daemon's id
        (daemons sharing a store tell each other apart by it), whether it answers (`reachable`) and can
        write (`writable`, the store's health: a full disk), and the error while it cannot."""
        # The ping first: it clears (or sets) the engine's last error, which the snapshot then reports,
        # so a store that came back is not reported with the error of the outage.
        error = await self.store.ping()
        snapshot = await trio.to_thread.run_sync(self.store.health.snapshot)
        out = {**snapshot, "engine": self.store.engine, "where": self.store.where,
               "daemon_id": self.store.daemon_id, "reachable": error is None}
        if error is not None and self.store.engine == "sqlite":  # the file is there but damaged
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
        naming the file, instead of INTERNAL); re-raise anything else."""
        said = self.store.damage(exc)
        if said is None:
            raise exc
        store.update(reachable=True, writable=False, damaged=True, error=said)

    async def install_status(self) -> list[dict[str, Any]] | None:
        """Each resident install (agent, scope, harness) with when the agent last reached the gateway,
        its last briefing and its last recorded session, and whether it looks silent; None when
        the store does not answer."""
        try:
            stored = await self.store.read(read_installs)
        except StoreUnavailable:
            return None
        return install_rows(stored, self.installs, self.wall_clock())

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
            shown = redact(episode_id)[:64]  # a client's id: never echoed raw
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
        """DescribeHarness (REQ-20's prompt source amendment): a configured harness with its prompt source
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

    async def harness_repo(self, harness: str) -> str | None:
        """The repository a harness works in now: its latest run's repo (the run graph's), else its workdir's."""
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

    async def episodes_missing_vectors(self) -> int:
        """Built-in episodes without an embedding for the model in use (0 with embeddings off)."""
        if not self.config.memory.is_builtin or not self.builtin.hybrid:
            return 0
        return await self.store.read(missing_vectors)


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

