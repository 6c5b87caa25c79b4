"""The briefing actor: what agents read — recall (REQ-12, REQ-13) and briefings (REQ-14 to REQ-17).

Every read path goes through this actor, and every episode it serves goes through one function,
:meth:`Briefing.episodes`, the REQ-9 choke point: it passes the caller's visible scopes to the provider
under ``provider_timeout``, sends what comes back through the index's ``filter_items`` — one query, in the
same read transaction and worker-thread hop as the request's own reads (facts, runs) — (unknown ids,
forgotten episodes, foreign scopes and invalid items dropped and counted), and degrades to an empty
episodes section with ``provider_unavailable`` when the provider times out, errors, is incompatible or
its breaker is open. Recall, briefings (tool, resource, prompt, operator preview) and operator recall
all call it; none has a private way to the provider.

Who is reading is a :class:`~memactors.view.View`: a harness run seen through its run token (its repository is the
one its run works in now, else its workdir's), an operator looking as a repository or a harness, or
an unattributed caller (no episodes at all). Provenance in every document comes from the daemon's own
rows; provider text only ever appears fenced and flagged untrusted, and is never written as a fact or
a vote.

Briefings are deterministic except for their episodes: the same store and the same ``now`` give the
same bytes. The wrapper's nonce is then derived, not drawn: an HMAC (under a key drawn once per actor)
over the document's content (not the instant: two previews a few milliseconds apart that say the same
are the same bytes), re-derived with a counter until it occurs in no content, so it stays unpredictable
to whoever wrote the content and still identical for identical inputs.

A run's briefing is computed once and cached in the store (``store.briefing_cache``, the briefings table), then served
unchanged until ``refresh``; each serve to a run writes exposure rows for the facts it shows (REQ-17),
and withholds the facts from that answer if the write fails. Operator previews write none.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import attrs
import trio
from loguru import logger

from .. import contract
from ..builtin import search_words
from ..config import Config, HarnessConfig
from ..documents import (
    BRIEFING_CANDIDATES,
    BRIEFING_EPISODES,
    BRIEFING_LAYOUT,
    FACT_POOL,
    PROVIDER_UNAVAILABLE,
    RECALL_POINTER,
    RECENT_RUNS,
    RECENT_RUNS_POOL,
    Document,
    Section,
    briefing_episode_item,
    briefing_run_item,
    collapse_episodes,
    collapse_facts,
    collision_item,
    counts,
    derived_nonce,
    document_from_json,
    episode_item,
    fact_ids,
    fact_item,
    fit_briefing,
    fit_recall,
    is_empty_run,
    is_trivial_run,
    item_chars,
    render_json,
    render_text,
    run_item,
    withhold_facts,
)
from ..errors import InvalidArgument, MemactorsError, NotAttributed, ProviderTimeout, StoreUnavailable
from ..logs import LogThrottle
from ..metrics import Metrics
from ..store import Db, Store, WallClock, briefing_cache, presence, run_history, votes
from ..store.facts import Fact, count_facts, search_facts, top_facts
from ..view import View
from .index import Filtered, KeptItem, filter_items
from .kernel import Ask, open_mailbox, serve
from .provider_session import provider_call

__all__ = [
    "Briefing",
    "BriefingAnswer",
    "BriefingRequest",
    "Episodes",
    "ExposePrompt",
    "RecallAnswer",
    "RecallRequest",
]

RECALL_RUNS = 5

T = TypeVar("T")
#: What a briefing reads from the store beside the provider's episodes: collisions, the recent runs (each
#: with its episode), the top facts (each with how many it folded) and the count of facts in scope.
_BriefingReads = tuple[list[presence.Collision], list[tuple[run_history.RunRow, dict[str, Any] | None]],
                       list[tuple[Fact, int]], int]

#: A document's `degraded` when the store itself could not be read (PostgreSQL down or unreachable).
STORE_UNAVAILABLE = "store_unavailable"


def _nothing(db: Db) -> None:
    return None


Delivery = Literal["tool", "resource", "prompt", "preview", "spawn"]
_SURFACE: Mapping[str, votes.Surface] = {
    "tool": "briefing_tool", "resource": "briefing_resource", "prompt": "briefing_prompt",
}


# ------------------------------------------------------------------------------------------ messages


@attrs.frozen
class Episodes:
    """What the choke point hands a document: kept items (provenance from the index), and whether
    the provider was unavailable (``degraded``) or itself reported a degradation."""

    items: tuple[KeptItem, ...]
    degraded: str | None
    provider_failed: bool
    #: Empty runs left out (``exclude_empty``): candidates that never take a briefing's slot.
    empty: int = 0


@attrs.frozen
class RecallRequest(Ask["RecallAnswer"]):
    """REQ-12's recall for a view. ``deadline`` is the caller's (trio time); ``call_id`` names the
    MCP request for exposure rows."""

    view: View
    query: str
    paths: tuple[str, ...] = ()
    limit: int = 8
    deadline: float = float("inf")
    call_id: str | None = None


@attrs.frozen
class RecallAnswer:
    document: Document
    text: str
    json: dict[str, Any]
    outcome: Literal["ok", "degraded"]
    exposed: int
    withheld: bool


@attrs.frozen
class BriefingRequest(Ask["BriefingAnswer"]):
    """A briefing for a view. ``delivery`` says who reads it: ``tool``/``resource`` (a run through the
    gateway: cached, exposure written), ``prompt`` (prepared for a one-shot: cached, exposure written
    by :func:`memactors.actors.spawn.prepare_spawn` once it knows the briefing is prepended), ``spawn`` (a
    resident's briefing computed at spawn: cached, no exposure), ``preview`` (operator: computed now,
    neither cached nor exposed)."""

    view: View
    delivery: Delivery
    refresh: bool = False
    deadline: float = float("inf")
    call_id: str | None = None


@attrs.frozen
class ExposePrompt(Ask["BriefingAnswer"]):
    """Write a prepended briefing's exposure rows (REQ-17) before spawn; answers the briefing as sent."""

    answer: BriefingAnswer
    view: View


@attrs.frozen
class BriefingAnswer:
    document: Document
    text: str
    json: dict[str, Any]
    items: Mapping[str, int]
    cached: bool
    exposed: int
    withheld: bool

    @property
    def nbytes(self) -> int:
        return len(self.text.encode("utf-8"))

    @property
    def fact_ids(self) -> tuple[str, ...]:
        return fact_ids(self.document)


def fitting_episodes(candidates: Sequence[KeptItem], now: datetime, max_chars: int) -> tuple[list[KeptItem], int]:
    """The episodes a briefing places, in the provider's order: of its first EPISODE_LOOKAHEAD
    candidates, the first BRIEFING_EPISODES whose items fit whole in what the ones before them leave of
    the section's share (REQ-14: an item is placed whole or not at all; one long text
    once left a single episode where two shorter ones after it fit); and how many of those it looked
    at and left out (counted as not shown). When none fits, the first BRIEFING_EPISODES, which the
    wrapper then drops and counts."""
    share = int(dict((name, s) for name, _, s in BRIEFING_LAYOUT)["episodes"] * max_chars)
    looked = list(candidates[:EPISODE_LOOKAHEAD])
    picked: list[KeptItem] = []
    used = 0
    for k in looked:
        size = item_chars(briefing_episode_item(k, now))
        if used + size <= share:
            picked.append(k)
            used += size
            if len(picked) == BRIEFING_EPISODES:
                break
    if not picked:
        return looked[:BRIEFING_EPISODES], 0
    examined = looked.index(picked[-1]) + 1 if len(picked) == BRIEFING_EPISODES else len(looked)
    return picked, examined - len(picked)


#: How many of the provider's candidates a briefing looks through for episodes that fit its share.
EPISODE_LOOKAHEAD = 2 * BRIEFING_EPISODES


# -------------------------------------------------------------------------------------------- actor


class Briefing:
    """Composes recall answers and briefings; owns the per-run briefing cache."""

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        provider: str,
        session_address: Any,
        index_address: Any,
        config: Callable[[], Config],
        wall_clock: WallClock,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self.provider = provider
        self._session = session_address
        self._index = index_address
        self._config = config
        self._clock = wall_clock
        self._key = secrets.token_bytes(32)
        self.address, self._mailbox = open_mailbox("briefing", 64)
        self._log = logger.bind(actor="briefing", provider=provider)
        self._degraded_lines = LogThrottle(interval=10.0)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.address)
        await serve(self._mailbox, self._handle, concurrency=32)

    async def _handle(self, message: object) -> object:
        match message:
            case RecallRequest():
                return await self.recall(message)
            case BriefingRequest():
                return await self.briefing(message)
            case ExposePrompt(answer=answer, view=view):
                return await self.expose_prompt(answer, view)
            case _:
                raise TypeError(f"briefing cannot handle {type(message).__name__}")

    # -- the REQ-9 choke point ---------------------------------------------------------------------

    async def episodes(self, view: View, *, query: str, limit: int, paths: Sequence[str] = (),
                       deadline: float = float("inf")) -> Episodes:
        """Provider items for ``view``, filtered by REQ-9; the only place a read path calls the provider.

        Bounded by ``provider_timeout`` and by ``deadline`` (the caller's). Never raises for a provider
        failure: it degrades with ``provider_unavailable``. An unattributed or repository-less view
        gets no episodes and the provider is not asked.
        """
        eps, _ = await self.episodes_with(view, query=query, limit=limit, paths=paths, deadline=deadline,
                                          local=_nothing, fallback=None)
        return eps

    async def episodes_with(self, view: View, *, query: str, limit: int, paths: Sequence[str] = (),
                            deadline: float = float("inf"), local: Callable[[Db], T], fallback: T,
                            exclude_empty: bool = False, words: Sequence[str] = ()) -> tuple[Episodes, T]:
        """:meth:`episodes`, plus ``local(db)`` run in the same read transaction as the REQ-9 re-check.

        One worker-thread hop for a request's own reads: the provider is asked first, then the re-check
        of its items (one query) and the caller's local reads (facts, runs, ...) share one snapshot.
        With ``exclude_empty`` the kept items that are empty runs, judged from the daemon's stored
        episodes (`documents.is_empty_run`), are left out too (a briefing's slots are for runs that did
        something); they are not REQ-9 drops and are only counted in ``Episodes.empty``. ``words`` (a
        recall's query words) pick the snippet of an item served with the daemon's own text (REQ-9).

        A store that cannot be read (PostgreSQL down or unreachable) degrades the answer the same way,
        within the same budget: no episodes (REQ-9 cannot check them), ``fallback`` for the local part,
        and ``store_unavailable``.
        """
        timeout = self._config().episodes.provider_timeout
        started = trio.current_time()
        budget_end = min(deadline, started + timeout)
        scopes = list(view.episode_scopes)
        if not scopes:
            mine, ok = await self._local_only(local, fallback, budget_end, timeout / 4)
            return Episodes((), None if ok else STORE_UNAVAILABLE, False), mine
        arguments: dict[str, Any] = {"query": query[: contract.MAX_QUERY_CHARS] or "*", "scope": scopes,
                                     "limit": limit}
        if paths:
            arguments["paths"] = list(paths)
        contract.check_request("memory_recall", arguments)
        caller = "daemon"  # REQ-18: the daemon's calls to the provider are its own rows, whoever it serves
        visible = frozenset(scopes)
        check_text = self._check_text()

        def recheck(db: Db, valid: list[Any], invalid: int) -> tuple[Filtered, int, T]:
            filtered = filter_items(db, provider=self.provider, items=valid, invalid=invalid,
                                    visible_scopes=visible, limit=limit, check_text=check_text, words=words)
            empty = ({k.provenance.episode_id for k in filtered.kept if is_empty_run(k.episode)}
                     if exclude_empty else set())
            if empty:
                filtered = attrs.evolve(filtered, kept=tuple(
                    k for k in filtered.kept if k.provenance.episode_id not in empty))
            return filtered, len(empty), local(db)

        try:
            with trio.CancelScope(deadline=budget_end) as scope:
                payload = await provider_call(self._session, "memory_recall", arguments, caller=caller)
                valid, invalid = contract.split_items(payload)
                filtered, empty, mine = await self._store.read(lambda db: recheck(db, valid, invalid))
            if scope.cancelled_caught:
                raise ProviderTimeout("memory_recall", budget_end - started, provider=self.provider)
        except StoreUnavailable as exc:
            self._log.bind(error=exc.message).warning("episodes degraded: store unavailable")
            return Episodes((), STORE_UNAVAILABLE, False), fallback
        except (MemactorsError, trio.TooSlowError) as exc:
            # Every recall degrades while the provider is down: one line per 10 s with the count folded in.
            suppressed = self._degraded_lines.allow(type(exc).__name__)
            if suppressed is not None:
                self._log.bind(op="memory_recall", error=type(exc).__name__, detail=str(exc)[:300],
                               suppressed=suppressed).warning("episodes degraded: provider unavailable")
            mine, ok = await self._local_only(local, fallback, budget_end, timeout / 4)
            return Episodes((), PROVIDER_UNAVAILABLE if ok else STORE_UNAVAILABLE, ok), mine
        for reason, count in filtered.dropped:
            self._metrics.dropped(self.provider, reason, count)
        if filtered.replaced:
            self._metrics.text_replaced(self.provider, filtered.replaced)
        reported = payload.get("degraded")
        return Episodes(filtered.kept, reported if isinstance(reported, str) else None, False, empty), mine

    async def _local_only(self, local: Callable[[Db], T], fallback: T, budget_end: float,
                          slack: float) -> tuple[T, bool]:
        """``local(db)`` alone, and whether the store answered (else ``fallback``). It may run past the
        provider's share of the budget (a slow provider must not cost the facts), but never by more than
        ``slack`` (a quarter of provider_timeout) when the store itself does not answer."""
        if local is _nothing:
            return fallback, True  # no hop for nothing
        with trio.move_on_after(max(budget_end - trio.current_time(), slack)):
            try:
                return await self._store.read(local), True
            except StoreUnavailable as exc:
                # Every recall during a store outage: one line per 10 s, the count folded in.
                suppressed = self._degraded_lines.allow("local store unavailable")
                if suppressed is not None:
                    self._log.bind(error=exc.message, suppressed=suppressed).warning(
                        "local reads degraded: store unavailable")
                return fallback, False
        suppressed = self._degraded_lines.allow("local store slow")
        if suppressed is not None:
            self._log.bind(suppressed=suppressed).warning("local reads degraded: store did not answer in time")
        return fallback, False

    # -- recall (REQ-12, REQ-13, REQ-17) -----------------------------------------------------------

    async def recall(self, req: RecallRequest) -> RecallAnswer:
        """REQ-12's document for ``req.view``; writes exposure for a run's facts as they are served."""
        query, limit = req.query, req.limit
        if not isinstance(query, str) or not query.strip() or len(query) > contract.MAX_QUERY_CHARS:
            raise InvalidArgument("query must be 1 to 512 characters", field="query")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= contract.MAX_LIMIT:
            raise InvalidArgument("limit must be 1 to 20", field="limit")
        if len(req.paths) > contract.MAX_PATHS:
            raise InvalidArgument("paths holds more than 20 entries", field="paths")
        for i, p in enumerate(req.paths):
            contract._check_path(i, p)  # same bounds the provider request gets
        view = req.view
        now = self._clock()
        repo = view.repo if view.episode_scopes else None

        def local(db: Db) -> tuple[list[tuple[Fact, int]], list[run_history.RunRow]]:
            pool = search_facts(db, query=query, scopes=view.fact_scopes, limit=limit * FACT_POOL)
            facts = collapse_facts(pool, limit)
            runs = run_history.runs_editing(db, repo=repo, paths=req.paths, limit=RECALL_RUNS) if (
                repo and req.paths) else []
            return facts, runs

        # Room for near-duplicates: the provider fills up to twice the slots, and `limit` distinct items
        # are kept after collapsing them (retries of one task had left an answer short).
        none_read: tuple[list[tuple[Fact, int]], list[run_history.RunRow]] = ([], [])
        eps, (facts, runs) = await self.episodes_with(view, query=query, limit=min(contract.MAX_LIMIT, 2 * limit),
                                                      paths=req.paths, deadline=req.deadline, local=local,
                                                      fallback=none_read, words=search_words(query))
        degraded = PROVIDER_UNAVAILABLE if eps.provider_failed else eps.degraded
        sections = (
            Section("facts", tuple(fact_item(f, similar) for f, similar in facts),
                    dropped=sum(similar for _, similar in facts)),
            Section("episodes", tuple(episode_item(self.provider, k, runs)
                                      for k, runs in collapse_episodes(eps.items)[:limit]),
                    note=PROVIDER_UNAVAILABLE if eps.provider_failed else None),
            Section("recent_runs", tuple(run_item(r) for r in runs)),
        )
        doc = fit_recall(sections, degraded=degraded, wire=True)  # REQ-12 bounds the tool response
        doc, exposed, withheld = await self._expose(doc, view, "recall", req.call_id, now)
        outcome: Literal["ok", "degraded"] = "degraded" if degraded else "ok"
        self._metrics.recall(self.provider, outcome)
        self._log.bind(outcome=outcome, facts=len(facts), episodes=len(eps.items), runs=len(runs),
                       truncated=doc.truncated, exposed=exposed).info("recall served")
        return RecallAnswer(doc, render_text(doc), render_json(doc), outcome, exposed, withheld)

    async def _expose(self, doc: Document, view: View, surface: votes.Surface, call_id: str | None,
                      now: datetime, *, max_chars: int | None = None) -> tuple[Document, int, bool]:
        """Write exposure rows for the facts ``doc`` serves to a run; withhold them if that fails."""
        run = view.exposed_run
        ids = fact_ids(doc)
        if run is None or not ids:
            return doc, 0, False
        try:
            n = await self._store.write(lambda db: votes.record_exposure(
                db, run_id=run[1], harness=run[0], fact_ids=ids, surface=surface, call_id=call_id, now=now))
        except Exception as exc:  # any store failure: serve without the facts, never unrecorded ones
            self._log.bind(harness=run[0], run=run[1], surface=surface, facts=len(ids),
                           error=type(exc).__name__).warning("exposure write failed; facts withheld")
            return withhold_facts(doc, max_chars=max_chars), 0, True
        return doc, n, False

    # -- briefings (REQ-14, REQ-15, REQ-17) --------------------------------------------------------

    def _check_text(self) -> bool:
        """REQ-9's text check applies unless the provider is an upstream configured ``own_text = true``."""
        server = self._config().mcp.get(self.provider)
        return not (server is not None and server.own_text)

    def _harness_config(self, harness: str | None) -> HarnessConfig | None:
        return self._config().harness.get(harness) if harness else None

    def _max_chars(self, harness: str | None) -> int:
        cfg = self._harness_config(harness)
        return cfg.briefing_max_chars if cfg else 2000

    async def compose_briefing(self, view: View, *, deadline: float = float("inf")) -> Document:
        """REQ-14's document for ``view`` at the wall clock's now (neither cached nor exposed)."""
        now = self._clock()
        max_chars = self._max_chars(view.harness)
        if not view.repo:
            return fit_briefing([(Section(name, ()), n, share) for name, n, share in BRIEFING_LAYOUT],
                                max_chars=max_chars, nonce=derived_nonce(self._key, ()),
                                recall_pointer=RECALL_POINTER, degraded=view.degraded)
        repo, branch, harness = view.repo, view.branch, view.harness or ""
        scopes = view.fact_scopes

        def local(db: Db) -> _BriefingReads:
            clashes = presence.collisions(db, repo=repo, now=now, for_run=(harness, view.run_id or ""),
                                       branch=branch)
            # The newest runs that did something (trivial runs had taken the slots), each with
            # its episode (its gist is the line's text).
            pool = run_history.recent_runs(db, repo=repo, branch=branch, limit=RECENT_RUNS_POOL)
            bodies = run_history.run_episodes(db, pool)
            runs = [(r, bodies.get((r.harness, r.run_id))) for r in pool]
            runs = [(r, ep) for r, ep in runs if ep is None or not is_trivial_run(ep)]
            facts = collapse_facts(top_facts(db, scopes=scopes, limit=8 * FACT_POOL), 8)
            total = count_facts(db, scopes=scopes)
            return clashes, runs, facts, total

        query = " ".join(p for p in (repo, branch, harness) if p)
        none_read: _BriefingReads = ([], [], [], 0)
        eps, (clashes, runs, facts, total) = await self.episodes_with(
            view, query=query, limit=BRIEFING_CANDIDATES, deadline=deadline, local=local, fallback=none_read,
            exclude_empty=True)
        # The episodes section: informative episodes, one item per fact (near-duplicates collapsed),
        # in the provider's order; recent_runs the newest runs that did something and that section
        # does not show already (it had shown the same runs twice, trivial runs taking the slots).
        episodes, skipped = fitting_episodes(
            [k for k, _ in collapse_episodes(eps.items) if not is_trivial_run(k.episode)], now, max_chars)
        shown = {(k.provenance.harness, k.provenance.run_id) for k in episodes}
        runs = [(r, ep) for r, ep in runs if (r.harness, r.run_id) not in shown][:RECENT_RUNS]
        degraded = PROVIDER_UNAVAILABLE if eps.provider_failed else eps.degraded
        self._log.bind(harness=harness, run=view.run_id, candidates=len(eps.items) + eps.empty, empty=eps.empty,
                       facts_folded=sum(similar for _, similar in facts)).debug("briefing composed")
        sections = (
            Section("collisions", tuple(collision_item(c) for c in clashes)),
            Section("recent_runs", tuple(briefing_run_item(r, ep, now) for r, ep in runs)),
            Section("facts", tuple(fact_item(f, similar) for f, similar in facts),
                    dropped=max(total - len(facts), 0)),
            Section("episodes", tuple(briefing_episode_item(k, now) for k in episodes), dropped=skipped,
                    note=PROVIDER_UNAVAILABLE if eps.provider_failed else None),
        )
        layout = {name: (n, share) for name, n, share in BRIEFING_LAYOUT}
        return fit_briefing(
            [(s, *layout[s.name]) for s in sections], max_chars=max_chars, degraded=degraded,
            nonce=derived_nonce(self._key, sections), recall_pointer=RECALL_POINTER,
        )

    async def briefing(self, req: BriefingRequest) -> BriefingAnswer:
        """The view's briefing for ``req.delivery`` (see :class:`BriefingRequest`)."""
        view = req.view
        if view.kind == "unattributed":
            raise NotAttributed("briefing needs a run token (not_attributed)")
        now = self._clock()
        run = view.exposed_run if req.delivery != "preview" else None  # a preview is never cached
        cached = None
        if run is not None and not req.refresh:
            with contextlib.suppress(StoreUnavailable):  # the store down: composed afresh (degraded)
                cached = await self._store.read(lambda db: briefing_cache.get_cached_briefing(db, run[0], run[1]))
        if cached is not None:
            doc = document_from_json(json.loads(cached.doc_json))
        else:
            doc = await self.compose_briefing(view, deadline=req.deadline)
            if run is not None and doc.degraded != STORE_UNAVAILABLE:
                text, data = render_text(doc), json.dumps(render_json(doc), ensure_ascii=False)
                try:
                    await self._store.write(lambda db: briefing_cache.put_cached_briefing(
                        db, run[0], run[1], text, data, counts(doc), now))
                except StoreUnavailable as exc:  # served, not cached: the next ask composes it again
                    self._log.bind(error=exc.message).warning("briefing not cached: store unavailable")
        exposed, withheld = 0, False
        surface = _SURFACE.get(req.delivery)
        if surface is not None and req.delivery != "prompt":
            doc, exposed, withheld = await self._expose(doc, view, surface, req.call_id, now,
                                                        max_chars=self._max_chars(view.harness))
        # Through the gateway, an empty briefing composed while the store was down says so (REQ-13).
        text = render_text(doc, show_degraded=req.delivery in ("tool", "resource")
                           and doc.degraded == STORE_UNAVAILABLE)
        if req.delivery in ("tool", "resource"):
            outcome = "empty" if text == "" else "ok"
            self._metrics.briefing(view.harness or "", req.delivery, outcome, len(text.encode("utf-8")))
        self._log.bind(harness=view.harness, run=view.run_id, delivery=req.delivery, cached=cached is not None,
                       bytes=len(text.encode("utf-8")), exposed=exposed, **counts(doc)).info("briefing served")
        return BriefingAnswer(doc, text, render_json(doc), counts(doc), cached is not None, exposed, withheld)

    async def expose_prompt(self, answer: BriefingAnswer, view: View) -> BriefingAnswer:
        """REQ-17 for a prepended briefing: exposure rows before spawn, no call id; facts withheld
        from the prompt if the write fails."""
        doc, exposed, withheld = await self._expose(answer.document, view, "briefing_prompt", None,
                                                    self._clock(), max_chars=self._max_chars(view.harness))
        if not withheld:
            return attrs.evolve(answer, exposed=exposed)
        return BriefingAnswer(doc, render_text(doc), render_json(doc), counts(doc), answer.cached, 0, True)
