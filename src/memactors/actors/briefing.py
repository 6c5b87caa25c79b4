"""The briefing actor: what agents read — recall (REQ-12, REQ-13) and briefings (REQ-14 to REQ-17).

Every read path goes through this actor, and every episode it serves goes through one function,
:meth:`Briefing.episodes`, the REQ-9 choke point: it passes the caller's visible scopes to the provider
under ``provider_timeout``, sends what comes back through the index's ``filter_items`` — one query, in the
same read transaction and worker-thread hop as the request's own reads (facts, runs) — (unknown ids,
forgotten episodes, foreign scopes and invalid items dropped and counted), and degrades to an empty
episodes section with ``provider_unavailable`` when the provider times out, errors, is incompatible or
its breaker is open. Recall, briefings (tool, resource, prompt, operator preview) and operator recall
all call it; none has a private way to the provider.

Who is reading is a :class:`View`: a harness run seen through its run token (its repository is the
one its run works in now, else its workdir's), an operator looking as a repository or a harness, or
an unattributed caller (no episodes at all). Provenance in every document comes from the daemon's own
rows; provider text only ever appears fenced and flagged untrusted, and is never written as a fact or
a vote.

Briefings are deterministic except for their episodes: the same store and the same ``now`` give the
same bytes. The wrapper's nonce is then derived, not drawn: an HMAC (under a key drawn once per actor)
over the document's content and ``now``, re-derived with a counter until it occurs in no content, so it
stays unpredictable to whoever wrote the content and still identical for identical inputs.

A run's briefing is computed once and cached in the store (``graph`` briefings table), then served
unchanged until ``refresh``; each serve to a run writes exposure rows for the facts it shows (REQ-17),
and withholds the facts from that answer if the write fails. Operator previews write none.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import attrs
import sqlite_utils
import trio
from loguru import logger

from .. import contract, graph
from .._kernel import open_mailbox, serve
from ..builtin import search_words
from ..config import Config, HarnessConfig
from ..errors import InvalidArgument, MemactorsError, NotAttributed
from ..logs import LogThrottle
from ..metrics import Metrics
from ..repo import resolve_repo, scope_for
from ..store import Store, WallClock, iso
from ..wrapper import (
    BRIEFING_MAX_BYTES,
    Document,
    Item,
    Provenance,
    Section,
    fit_briefing,
    fit_recall,
    render_json,
    render_text,
)
from .index import Filtered, KeptItem, filter_items
from .provider_session import provider_call

__all__ = [
    "BRIEFING_LAYOUT",
    "Briefing",
    "BriefingAnswer",
    "BriefingRequest",
    "Episodes",
    "EpisodesRequest",
    "ExposePrompt",
    "RecallAnswer",
    "RecallRequest",
    "View",
    "document_from_json",
    "latest_run_place",
    "resolve_view",
    "run_place",
    "withhold_facts",
]

#: REQ-14: (section, max items, share of briefing_max_chars), in order.
BRIEFING_LAYOUT: tuple[tuple[str, int, float], ...] = (
    ("collisions", 10, 0.25),
    ("recent_runs", 5, 0.25),
    ("facts", 8, 0.35),
    ("episodes", 3, 0.25),
)
RECALL_RUNS = 5
BRIEFING_EPISODES = 3
PROVIDER_UNAVAILABLE = "provider_unavailable"
RECALL_POINTER = "use the recall tool for more"

T = TypeVar("T")


def _nothing(db: sqlite_utils.Database) -> None:
    return None


Delivery = Literal["tool", "resource", "prompt", "preview", "spawn"]
_SURFACE: Mapping[str, graph.Surface] = {
    "tool": "briefing_tool", "resource": "briefing_resource", "prompt": "briefing_prompt",
}


# ------------------------------------------------------------------------------------------ the view


@attrs.frozen
class View:
    """Whose eyes a read is for, and so which scopes it may see (REQ-9).

    ``repo`` is the caller's repository key (None outside any repository or when unattributed);
    ``run_id`` is set for a harness run (exposure is written to it), None for operator views.
    """

    kind: Literal["run", "operator", "unattributed"]
    harness: str | None = None
    run_id: str | None = None
    repo: str | None = None
    branch: str | None = None

    @property
    def episode_scopes(self) -> tuple[str, ...]:
        """The scopes memory_recall may search: the repository's project scope, or none at all."""
        if self.kind == "unattributed" or not self.repo:
            return ()
        return (scope_for(self.repo),)

    @property
    def fact_scopes(self) -> tuple[str, ...]:
        """Fleet facts everyone may see, plus the repository's own."""
        return ("fleet", *self.episode_scopes)

    @property
    def exposed_run(self) -> tuple[str, str] | None:
        """(harness, run) that exposure rows are written for; None for operators and unattributed callers."""
        if self.kind == "run" and self.harness and self.run_id:
            return self.harness, self.run_id
        return None


UNATTRIBUTED = View("unattributed")


def _git_branch_sync(workdir: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", workdir, "symbolic-ref", "--short", "-q", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    branch = out.stdout.strip()
    return branch if out.returncode == 0 and branch else None  # detached HEAD: no branch


def run_place(db: sqlite_utils.Database, harness: str, run_id: str | None) -> tuple[str, str | None] | None:
    """(repo, branch) a run works in as the graph records it: live presence, else the ingested run."""
    if run_id:
        row = db.execute(
            "SELECT repo, branch FROM presence WHERE harness = ? AND run_id = ?"
            " ORDER BY reported_at DESC, session_id LIMIT 1", [harness, run_id]).fetchone()
        if row is None:
            row = db.execute(
                "SELECT repo, branch FROM runs WHERE harness = ? AND run_id = ? AND repo IS NOT NULL",
                [harness, run_id]).fetchone()
        if row is not None:
            return str(row[0]), None if row[1] is None else str(row[1])
    return None


_UNREAD: Any = object()


async def resolve_view(store: Store, config: Config, *, harness: str, run_id: str | None,
                       workdir: str | None = None, place: tuple[str, str | None] | None = _UNREAD) -> View:
    """A harness run's view (REQ-9): the repository its run works in now, as the graph records it
    (live presence, else the ingested run), else its workdir's (the token's, else the configured one)
    before the run's first session. A run outside any repository sees no episodes.

    ``place`` is :func:`run_place`'s answer when the caller already read it (in its own hop)."""
    found = await store.read(lambda db: run_place(db, harness, run_id)) if place is _UNREAD else place
    if found is not None:
        return View("run", harness, run_id, found[0], found[1])
    cfg = config.harness.get(harness)
    directory = workdir or (cfg.workdir if cfg else None)
    if not directory:
        return View("run", harness, run_id)
    directory = str(Path(directory).expanduser())  # noqa: ASYNC240 -- reads $HOME, no I/O
    info = await resolve_repo(directory)
    if info is None:
        return View("run", harness, run_id)
    branch = await trio.to_thread.run_sync(_git_branch_sync, directory)
    if branch is None:
        branch = await store.read(lambda db: _latest_branch(db, harness, info.key))
    return View("run", harness, run_id, info.key, branch)


def latest_run_place(db: sqlite_utils.Database, harness: str) -> tuple[str, str | None] | None:
    """(repo, branch) of the harness's latest ingested run in a repository, or None."""
    row = db.execute(
        "SELECT repo, branch FROM runs WHERE harness = ? AND repo IS NOT NULL ORDER BY ended_at DESC, run_id LIMIT 1",
        [harness]).fetchone()
    return None if row is None else (str(row[0]), None if row[1] is None else str(row[1]))


def _latest_branch(db: sqlite_utils.Database, harness: str, repo: str) -> str | None:
    row = db.execute(
        "SELECT branch FROM runs WHERE harness = ? AND repo = ? ORDER BY ended_at DESC, run_id LIMIT 1",
        [harness, repo]).fetchone()
    return None if row is None or row[0] is None else str(row[0])


# ------------------------------------------------------------------------------------------ messages


@attrs.frozen
class Episodes:
    """What the choke point hands a document: kept items (provenance from the index), and whether
    the provider was unavailable (``degraded``) or itself reported a degradation."""

    items: tuple[KeptItem, ...]
    degraded: str | None
    provider_failed: bool


@attrs.frozen
class EpisodesRequest:
    """Just the episodes of a view, through the choke point (what :meth:`Briefing.episodes` returns)."""

    view: View
    query: str
    limit: int = 8
    paths: tuple[str, ...] = ()
    deadline: float = float("inf")


@attrs.frozen
class RecallRequest:
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
class BriefingRequest:
    """A briefing for a view. ``delivery`` says who reads it: ``tool``/``resource`` (a run through the
    gateway: cached, exposure written), ``prompt`` (prepared for a one-shot: cached, exposure written
    by :func:`memactors.spawn.prepare_spawn` once it knows the briefing is prepended), ``spawn`` (a
    resident's briefing computed at spawn: cached, no exposure), ``preview`` (operator: computed now,
    neither cached nor exposed)."""

    view: View
    delivery: Delivery
    refresh: bool = False
    deadline: float = float("inf")
    call_id: str | None = None


@attrs.frozen
class ExposePrompt:
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
        return _fact_ids(self.document)


# ---------------------------------------------------------------------------- document helpers


def _fact_ids(doc: Document) -> tuple[str, ...]:
    return tuple(
        dict(it.provenance.fields)["fact"]
        for s in doc.sections if s.name == "facts"
        for it in s.items
    )


def _counts(doc: Document) -> dict[str, int]:
    return {s.name: len(s.items) for s in doc.sections}


def document_from_json(data: Mapping[str, Any]) -> Document:
    """Rebuild a :class:`Document` from :func:`render_json` output (the cached form of a briefing)."""
    sections = tuple(
        Section(
            name=s["name"],
            items=tuple(
                Item(Provenance(it["label"], tuple(it["provenance"].items())), it["text"], bool(it["untrusted"]))
                for it in s["items"]
            ),
            dropped=int(s["dropped"]),
            note=s["note"],
        )
        for s in data["sections"]
    )
    return Document(data["kind"], sections, data["nonce"], data["degraded"], int(data["truncated"]),
                    data["pointer"])


def withhold_facts(doc: Document, *, max_chars: int | None = None) -> Document:
    """The same document with its facts section emptied (counted as not shown), refitted to its cap.

    Used when writing exposure fails: SPEC-0028 withholds the facts rather than serve them unrecorded.
    """
    sections = tuple(
        attrs.evolve(s, items=(), dropped=s.dropped + len(s.items)) if s.name == "facts" else s
        for s in doc.sections
    )
    if doc.kind == "recall":
        return fit_recall(sections, degraded=doc.degraded, nonce=doc.nonce, wire=True)
    layout = {name: (n, share) for name, n, share in BRIEFING_LAYOUT}
    return fit_briefing(
        [(s, layout[s.name][0], layout[s.name][1]) for s in sections],
        max_chars=max_chars or BRIEFING_MAX_BYTES, degraded=doc.degraded, nonce=doc.nonce,
        recall_pointer=doc.pointer or RECALL_POINTER,
    )


def _fact_item(f: graph.Fact) -> Item:
    return Item(Provenance("fact", (
        ("fact", f.id), ("scope", f.scope), ("confidence", f"{f.confidence:.2f}"), ("status", f.status),
        ("updated", f.updated_at),
    )), f.text, untrusted=False)


def _run_item(r: graph.RunRow) -> Item:
    return Item(Provenance("run", (
        ("run", r.run_id), ("harness", r.harness), ("adapter", r.adapter), ("outcome", r.outcome),
        ("branch", r.branch), ("ended", r.ended_at), ("duration_ms", r.duration_ms),
        ("pull_request", r.pull_request),
    )), "", untrusted=False)


def _episode_item(provider: str, kept: KeptItem) -> Item:
    p = kept.provenance
    score = None if kept.score is None else f"{kept.score:.4g}"
    return Item(Provenance("episode", (
        ("provider", provider), ("episode", p.episode_id), ("run", p.run_id), ("harness", p.harness),
        ("adapter", p.adapter), ("model", p.model), ("repo", p.repo), ("branch", p.branch),
        ("outcome", p.outcome), ("at", p.started_at), ("score", score),
    )), kept.text, untrusted=True)


def _collision_item(c: graph.Collision) -> Item:
    other = c.second
    return Item(Provenance("collision", (
        ("harness", other.harness), ("run", other.run_id), ("branch", other.branch),
        ("paths", ", ".join(c.shared_paths or other.paths)),
        ("same_branch", "yes" if c.same_branch else "no"), ("reported", other.reported_at),
    )), "", untrusted=False)


def _derived_nonce(key: bytes, sections: Sequence[Section], now: datetime) -> str:
    """A nonce that is the same for the same content and now, and unpredictable without ``key``."""
    material = json.dumps(
        [[s.name, s.note, s.dropped, [[it.provenance.label, list(it.provenance.fields), it.text, it.untrusted]
                                      for it in s.items]] for s in sections] + [iso(now)],
        ensure_ascii=False,
    ).encode("utf-8", "surrogatepass")
    strings = [it.text for s in sections for it in s.items] + [
        v for s in sections for it in s.items for _, v in it.provenance.fields]
    for counter in range(64):
        nonce = hmac.new(key, material + counter.to_bytes(2, "big"), hashlib.sha256).hexdigest()[:16]
        if not any(nonce in t for t in strings) and nonce not in RECALL_POINTER:
            return nonce
    raise MemactorsError("no usable derived nonce after repeated attempts")


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
            case EpisodesRequest(view=view, query=query, limit=limit, paths=paths, deadline=deadline):
                return await self.episodes(view, query=query, limit=limit, paths=paths, deadline=deadline)
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
                                          local=_nothing)
        return eps

    async def episodes_with(self, view: View, *, query: str, limit: int, paths: Sequence[str] = (),
                            deadline: float = float("inf"), local: Callable[[sqlite_utils.Database], T],
                            words: Sequence[str] = ()) -> tuple[Episodes, T]:
        """:meth:`episodes`, plus ``local(db)`` run in the same read transaction as the REQ-9 re-check.

        One worker-thread hop for a request's own reads: the provider is asked first, then the re-check
        of its items (one query) and the caller's local reads (facts, runs, ...) share one snapshot.
        """
        scopes = list(view.episode_scopes)
        if not scopes:
            return Episodes((), None, False), await self._local_only(local)
        arguments: dict[str, Any] = {"query": query[: contract.MAX_QUERY_CHARS] or "*", "scope": scopes,
                                     "limit": limit}
        if paths:
            arguments["paths"] = list(paths)
        contract.check_request("memory_recall", arguments)
        timeout = self._config().episodes.provider_timeout
        caller = "daemon"  # REQ-18: the daemon's calls to the provider are its own rows, whoever it serves
        visible = frozenset(scopes)
        check_text = self._check_text()

        def recheck(db: sqlite_utils.Database, valid: list[Any], invalid: int) -> tuple[Filtered, T]:
            filtered = filter_items(db, provider=self.provider, items=valid, invalid=invalid,
                                    visible_scopes=visible, limit=limit, check_text=check_text, words=words)
            return filtered, local(db)

        try:
            with trio.CancelScope(deadline=min(deadline, trio.current_time() + timeout)) as scope:
                payload = await provider_call(self._session, "memory_recall", arguments, caller=caller)
                valid, invalid = contract.split_items(payload)
                filtered, mine = await self._store.read(lambda db: recheck(db, valid, invalid))
            if scope.cancelled_caught:
                raise trio.TooSlowError
        except (MemactorsError, trio.TooSlowError) as exc:
            # Every recall degrades while the provider is down: one line per 10 s with the count folded in.
            suppressed = self._degraded_lines.allow(type(exc).__name__)
            if suppressed is not None:
                self._log.bind(error=type(exc).__name__, suppressed=suppressed).warning(
                    "episodes degraded: provider unavailable")
            return Episodes((), PROVIDER_UNAVAILABLE, True), await self._local_only(local)
        for reason, count in filtered.dropped:
            self._metrics.dropped(self.provider, reason, count)
        reported = payload.get("degraded")
        return Episodes(filtered.kept, reported if isinstance(reported, str) else None, False), mine

    async def _local_only(self, local: Callable[[sqlite_utils.Database], T]) -> T:
        if local is _nothing:
            return None  # type: ignore[return-value] -- _nothing's result; no hop for nothing
        return await self._store.read(local)

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

        def local(db: sqlite_utils.Database) -> tuple[list[graph.Fact], list[graph.RunRow]]:
            facts = graph.search_facts(db, query=query, scopes=view.fact_scopes, limit=limit)
            runs = graph.runs_editing(db, repo=repo, paths=req.paths, limit=RECALL_RUNS) if (
                repo and req.paths) else []
            return facts, runs

        eps, (facts, runs) = await self.episodes_with(view, query=query, limit=limit, paths=req.paths,
                                                      deadline=req.deadline, local=local,
                                                      words=search_words(query))
        degraded = PROVIDER_UNAVAILABLE if eps.provider_failed else eps.degraded
        sections = (
            Section("facts", tuple(_fact_item(f) for f in facts)),
            Section("episodes", tuple(_episode_item(self.provider, k) for k in eps.items),
                    note=PROVIDER_UNAVAILABLE if eps.provider_failed else None),
            Section("recent_runs", tuple(_run_item(r) for r in runs)),
        )
        doc = fit_recall(sections, degraded=degraded, wire=True)  # REQ-12 bounds the tool response
        doc, exposed, withheld = await self._expose(doc, view, "recall", req.call_id, now)
        outcome: Literal["ok", "degraded"] = "degraded" if degraded else "ok"
        self._metrics.recall(self.provider, outcome)
        self._log.bind(outcome=outcome, facts=len(facts), episodes=len(eps.items), runs=len(runs),
                       truncated=doc.truncated, exposed=exposed).info("recall served")
        return RecallAnswer(doc, render_text(doc), render_json(doc), outcome, exposed, withheld)

    async def _expose(self, doc: Document, view: View, surface: graph.Surface, call_id: str | None,
                      now: datetime, *, max_chars: int | None = None) -> tuple[Document, int, bool]:
        """Write exposure rows for the facts ``doc`` serves to a run; withhold them if that fails."""
        run = view.exposed_run
        ids = _fact_ids(doc)
        if run is None or not ids:
            return doc, 0, False
        try:
            n = await self._store.write(lambda db: graph.record_exposure(
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
                                max_chars=max_chars, nonce=_derived_nonce(self._key, (), now),
                                recall_pointer=RECALL_POINTER)
        repo, branch, harness = view.repo, view.branch, view.harness or ""
        scopes = view.fact_scopes

        def local(db: sqlite_utils.Database) -> tuple[list[graph.Collision], list[graph.RunRow],
                                                      list[graph.Fact], int]:
            clashes = graph.collisions(db, repo=repo, now=now, for_run=(harness, view.run_id or ""),
                                       branch=branch)
            runs = graph.recent_runs(db, repo=repo, branch=branch, limit=5)
            facts = graph.top_facts(db, scopes=scopes, limit=8)
            total = graph.count_facts(db, scopes=scopes)
            return clashes, runs, facts, total

        query = " ".join(p for p in (repo, branch, harness) if p)
        eps, (clashes, runs, facts, total) = await self.episodes_with(
            view, query=query, limit=BRIEFING_EPISODES, deadline=deadline, local=local)
        degraded = PROVIDER_UNAVAILABLE if eps.provider_failed else eps.degraded
        sections = (
            Section("collisions", tuple(_collision_item(c) for c in clashes)),
            Section("recent_runs", tuple(_run_item(r) for r in runs)),
            Section("facts", tuple(_fact_item(f) for f in facts), dropped=max(total - len(facts), 0)),
            Section("episodes", tuple(_episode_item(self.provider, k) for k in eps.items),
                    note=PROVIDER_UNAVAILABLE if eps.provider_failed else None),
        )
        layout = {name: (n, share) for name, n, share in BRIEFING_LAYOUT}
        return fit_briefing(
            [(s, *layout[s.name]) for s in sections], max_chars=max_chars, degraded=degraded,
            nonce=_derived_nonce(self._key, sections, now), recall_pointer=RECALL_POINTER,
        )

    async def briefing(self, req: BriefingRequest) -> BriefingAnswer:
        """The view's briefing for ``req.delivery`` (see :class:`BriefingRequest`)."""
        view = req.view
        if view.kind == "unattributed":
            raise NotAttributed("briefing needs a run token (not_attributed)")
        now = self._clock()
        run = view.exposed_run
        cacheable = req.delivery != "preview" and run is not None
        cached = None
        if cacheable and not req.refresh:
            cached = await self._store.read(lambda db: graph.get_cached_briefing(db, run[0], run[1]))
        if cached is not None:
            doc = document_from_json(json.loads(cached.doc_json))
        else:
            doc = await self.compose_briefing(view, deadline=req.deadline)
            if cacheable:
                text, data = render_text(doc), json.dumps(render_json(doc), ensure_ascii=False)
                await self._store.write(lambda db: graph.put_cached_briefing(
                    db, run[0], run[1], text, data, _counts(doc), now))
        exposed, withheld = 0, False
        surface = _SURFACE.get(req.delivery)
        if surface is not None and req.delivery != "prompt":
            doc, exposed, withheld = await self._expose(doc, view, surface, req.call_id, now,
                                                        max_chars=self._max_chars(view.harness))
        text = render_text(doc)
        if req.delivery in ("tool", "resource"):
            outcome = "empty" if text == "" else "ok"
            self._metrics.briefing(view.harness or "", req.delivery, outcome, len(text.encode("utf-8")))
        self._log.bind(harness=view.harness, run=view.run_id, delivery=req.delivery, cached=cached is not None,
                       bytes=len(text.encode("utf-8")), exposed=exposed, **_counts(doc)).info("briefing served")
        return BriefingAnswer(doc, text, render_json(doc), _counts(doc), cached is not None, exposed, withheld)

    async def expose_prompt(self, answer: BriefingAnswer, view: View) -> BriefingAnswer:
        """REQ-17 for a prepended briefing: exposure rows before spawn, no call id; facts withheld
        from the prompt if the write fails."""
        doc, exposed, withheld = await self._expose(answer.document, view, "briefing_prompt", None,
                                                    self._clock(), max_chars=self._max_chars(view.harness))
        if not withheld:
            return attrs.evolve(answer, exposed=exposed)
        return BriefingAnswer(doc, render_text(doc), render_json(doc), _counts(doc), answer.cached, 0, True)
