"""The built-in memory provider (SPEC-0030 REQ-11): the REQ-3 contract over the daemon's own store.

It is a real MCP server (the SDK's low-level `Server`), reached in-process through `mcp.Client(server)`
by the provider session, so conformance checks and scope enforcement exercise it exactly as they do an
upstream. `memactors provider serve-builtin --stdio [--db PATH]` serves the same server over stdio
(`builtin_stdio.py`) so it can be configured as an `[mcp.<name>]` upstream. Its ids are episode ids.

The flow (record, embed, recall, forget) is `BuiltinProvider`'s, once for both store engines; what
differs between them is a `DocIndex`: `_builtin_sqlite.SqliteIndex` (with `ranking.py`'s FTS5
statements) or `_builtin_pg.PgIndex` (tsvector and pgvector, docs/fleet.md).

Storage on SQLite: `builtin_docs` (one row per episode: scope, its FTS5 scope
token `scope_key`, the episode as fields — `title` (its summary, else the start of its excerpt),
`excerpt`, `summary`, `files`, `failures`, `meta` (harness, adapter, model, repository, branch, outcome,
reason, run id, pull request) and plain `harness`, `branch`, `outcome` —, started_at, content hash),
`builtin_fts` (FTS5, `porter unicode61`, external-content over builtin_docs — the text is stored once —
with the columns scope_key, title, excerpt, files, failures and meta, kept in step by triggers;
migrations `0006_builtin_scope_in_fts` and `0009_flat_text_and_builtin_fields`), and — only when an
embedding model is configured — `builtin_vec`, a sqlite-vec `vec0` table of
one float32 embedding per episode, partitioned by scope, cosine distance. It is created lazily once the
model's dimension is known, and rebuilt (emptied) when the model or dimension changes. Embeddings are
cached in `builtin_embed_cache` by content hash (SHA-256 of text and summary) plus model id, so
re-recording or re-embedding the same content never calls the model API again.

Ranking (`ranking.py`): reciprocal rank fusion (k = 60) of up to three rankings — BM25 over FTS5 in
the caller's scopes, cosine (hybrid only: the query's embedding against `builtin_vec`, best 200 in the
caller's scopes) and the path boost for a request carrying `paths` (the episodes whose `files_touched`
contains one of them exactly, repository-relative) — ties by recency, then id. Without an embedding
model the ranking is BM25 (plus the path boost) alone. A metadata-only query (REQ-14's briefing query)
is ordered by what helps the next run instead (`ranking.briefing_order`).

Embedding happens at record time, after the text is committed, under its own deadline: a failure
(model API down, budget spent, deadline) leaves the episode without a vector and is only logged
(`memactors doctor` counts such episodes). The query is embedded under the recall's embedding deadline,
concurrently with the BM25 search; a query that cannot be embedded is answered from FTS5 with
`degraded: "embeddings_unavailable"` — never an error.

Item text is the episode's gist (`gist.gist`, issue 17): the run's own words first (its summary, else
the start of its excerpt), then the words around the query's when they come later, then what it touched
and which verify failures it had — no field names, nothing the provenance line says, only the episode's
own words. At most MAX_ITEM_TEXT characters; the whole episode is one `memactors memory episodes <id>` away.

Scope is enforced here too: recall only ever reads rows in the requested scopes. `memory_forget` of an
unknown id answers `{forgotten: false}`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import mcp.types as t
import sqlite_utils
import trio
from loguru import logger
from mcp.server import Server

from . import __version__, contract
from ._builtin_sqlite import SQLITE_INDEX, put_doc
from ._builtin_sqlite import cached_vector as cached_vector
from ._builtin_sqlite import ensure_vec_table as ensure_vec_table
from ._builtin_sqlite import insert_doc as insert_doc
from ._builtin_sqlite import write_vector as write_vector
from .contract import load_schemas
from .episode import flatten
from .errors import InvalidArgument, MemactorsError
from .gist import gist
from .ranking import BM25_WEIGHTS as BM25_WEIGHTS
from .ranking import BRIEFING_CANDIDATES as BRIEFING_CANDIDATES
from .ranking import CANDIDATES as CANDIDATES
from .ranking import CONTENT_COLUMNS as CONTENT_COLUMNS
from .ranking import FTS_COLUMNS as FTS_COLUMNS
from .ranking import RRF_K as RRF_K
from .ranking import STOPWORDS as STOPWORDS
from .ranking import Hit as Hit
from .ranking import bm25_candidates as bm25_candidates
from .ranking import briefing_order as briefing_order
from .ranking import briefing_rank as briefing_rank
from .ranking import metadata_only as metadata_only
from .ranking import path_candidates as path_candidates
from .ranking import path_ranking as path_ranking
from .ranking import query_words as query_words
from .ranking import rank as rank
from .ranking import rrf as rrf
from .ranking import scoped_match as scoped_match
from .ranking import search_words as search_words
from .store import Store
from .wrapper import ELLIPSIS, cut_at_word

CONTRACT_VERSION = 1
#: Bound on one item's text (its gist, `gist.gist`): the run's own words first, so a briefing that
#: composes a shorter one of its whole parts (`gist.compose`) keeps the best of it.
MAX_ITEM_TEXT = 320
#: The `title` column: the summary, else the first TITLE_CHARS characters of the excerpt (cut between words).
TITLE_CHARS = 100
#: Characters of an episode's text sent to the embedding model (the model truncates anyway).
EMBED_INPUT_CHARS = 8000
#: Default deadline for embedding one episode at record time.
RECORD_EMBED_DEADLINE = 10.0
#: Default deadline for embedding a query; the service passes half of provider_timeout.
QUERY_EMBED_DEADLINE = 1.0

Embedder = Callable[[Sequence[str]], Awaitable[list[list[float]]]]

_log = logger.bind(component="builtin_provider")


def _tools() -> list[t.Tool]:
    schemas = load_schemas()
    descriptions = {
        "memory_contract": "Contract version and provider identity.",
        "memory_record_episode": "Store one episode; returns the ids it is stored under.",
        "memory_recall": "Search episodes in the given scopes.",
        "memory_forget": "Forget one stored id.",
    }
    return [t.Tool(name=name, description=text, input_schema=schemas[f"{name}.input"])
            for name, text in descriptions.items()]


def content_hash(text: str, summary: str) -> str:
    """The embedding cache key's content part: SHA-256 over text NUL summary."""
    return hashlib.sha256(f"{text}\0{summary}".encode()).hexdigest()


def embed_input(text: str, summary: str) -> str:
    return (f"{summary}\n{text}" if summary else text)[:EMBED_INPUT_CHARS]


def item_texts(db: sqlite_utils.Database, hits: Sequence[Hit], words: Sequence[str]) -> dict[str, str]:
    """Each hit's item text, its gist (`gist.gist`) for the query's `words`, from its stored fields in
    one statement for all the hits."""
    if not hits:
        return {}
    ids = list(dict.fromkeys(hit.doc_id for hit in hits))
    rows: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(ids):
        for r in db.execute(
                f"SELECT doc_id, summary, excerpt, files, failures FROM builtin_docs"
                f" WHERE doc_id IN ({','.join('?' * len(chunk))})", chunk).fetchall():
            rows[int(r[0])] = {"summary": r[1], "result_excerpt": r[2], "files_touched": json.loads(r[3]),
                               "verify_failures": json.loads(r[4])}
    return {hit.episode_id: gist(rows[hit.doc_id], words, MAX_ITEM_TEXT) for hit in hits if hit.doc_id in rows}


@attrs.frozen
class DocFields:
    """What the built-in provider indexes of one episode (builtin_docs' columns, migration 0009)."""

    title: str
    excerpt: str
    summary: str
    files: tuple[str, ...]
    failures: tuple[tuple[str, int], ...]
    meta: str
    harness: str
    branch: str
    outcome: str


#: REQ-5 fields whose words go into the `meta` column.
META_FIELDS = ("harness", "adapter", "model", "repo", "branch", "outcome", "reason", "run_id", "pull_request")
_OLD_ESCAPES = re.compile(r"\\(?:u2028|u2029|[nr\\])")
_FAILURE = re.compile(r"(.+?): (\d+)(?:, |$)")


def rendering_fields(text: str, *, escaped: bool = False) -> dict[str, str]:
    """The `name: value` lines of a REQ-5 rendering. `escaped`: a rendering from before migration 0009,
    whose line breaks were written `\\n` (read as a space) and backslashes `\\\\`."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        name, sep, value = line.partition(": ")
        if sep and name.isidentifier():
            if escaped:
                value = _OLD_ESCAPES.sub(lambda m: "\\" if m.group() == "\\\\" else " ", value)
            out.setdefault(name, value)
    return out


def doc_fields(text: str, episode: Mapping[str, Any] | None = None, *, escaped: bool = False) -> DocFields:
    """The fields to index for an episode: from its REQ-5 object where it has them, else from the lines
    of its rendering `text`; a text that is no rendering (no `result_excerpt` line) is the excerpt."""
    ep = dict(episode or {})
    lines = rendering_fields(text, escaped=escaped)

    def value(name: str) -> str:
        v = ep.get(name)
        if v is None:
            v = lines.get(name, "")
        return flatten(str(v)).strip()

    excerpt = value("result_excerpt") if "result_excerpt" in ep or "result_excerpt" in lines else flatten(text).strip()
    summary = value("summary")
    if isinstance(ep.get("files_touched"), (list, tuple)):
        files = tuple(flatten(str(f)) for f in ep["files_touched"])
    else:
        files = tuple(f for f in lines.get("files_touched", "").split(", ") if f)
    failures: tuple[tuple[str, int], ...]
    if isinstance(ep.get("verify_failures"), (list, tuple)):
        failures = tuple((flatten(str(f.get("error_class", ""))), int(f.get("count", 0)))
                         for f in ep["verify_failures"] if isinstance(f, Mapping))
    else:
        failures = tuple((m.group(1), int(m.group(2))) for m in _FAILURE.finditer(lines.get("verify_failures", "")))
    title = summary or cut_at_word(excerpt, TITLE_CHARS).removesuffix(ELLIPSIS)
    return DocFields(
        title=title, excerpt=excerpt, summary=summary, files=files, failures=failures,
        meta=" ".join(v for v in (value(name) for name in META_FIELDS) if v),
        harness=value("harness"), branch=value("branch"), outcome=value("outcome"),
    )


def _chunks(ids: Sequence[int], size: int = 500) -> list[Sequence[int]]:
    """`ids` in slices small enough for one statement's bound parameters."""
    return [ids[i:i + size] for i in range(0, len(ids), size)]


# -- the engines' part -----------------------------------------------------------------------------

def record_fields(text: str, summary: str, files: Sequence[str],
                  episode: Mapping[str, Any] | None = None) -> DocFields:
    """The fields of a memory_record_episode call's episode: its REQ-5 object (`episode`) where it has
    them, the call's summary and files, else the lines of its rendering `text` (every engine's rule)."""
    given: dict[str, Any] = {"summary": summary or None, **({"files_touched": list(files)} if files else {})}
    return doc_fields(text, {**given, **(episode or {})})


def write_doc(db: sqlite_utils.Database, *, episode_id: str, scope: str, text: str, summary: str,
              files: Sequence[str], started_at: str,
              episode: Mapping[str, Any] | None = None) -> tuple[int, str, bool]:
    """Insert or replace one episode's document (SQLite); returns (doc_id, content hash, changed).

    `episode` is the REQ-5 object memory_record_episode carries; what it lacks is read from `text`.
    """
    digest = content_hash(text, summary)
    fields = record_fields(text, summary, files, episode)
    doc_id, changed = put_doc(db, episode_id=episode_id, scope=scope, fields=fields, started_at=started_at,
                              digest=digest)
    return doc_id, digest, changed


def missing_vectors(db: Any) -> int:
    """Episodes the built-in provider holds without an embedding (doctor warns when non-zero), on the
    engine `db` is of."""
    return index_of(db.dialect.name).missing_vectors(db)


class DocIndex(Protocol):
    """What the built-in provider's flow asks of a store engine: where the documents, ranking inputs and
    vectors are, and the queries over them. Everything else — the contract, the fields and item text of
    an episode, the embedding calls and their deadlines, and REQ-11's ranking (which rankings, RRF with
    k = 60, the path boost, the tie-breaks, the metadata-only query) — is `BuiltinProvider`'s, written
    once for both engines. SQLite's (FTS5 with BM25, sqlite-vec) is `_builtin_sqlite.SqliteIndex`, with
    `ranking.py`'s FTS5 statements; PostgreSQL's (tsvector with `ts_rank_cd`, pgvector) is
    `_builtin_pg.PgIndex`.

    Every method takes the `Db` of a `Store.write` (the writes) or `Store.read` (the queries) call. Hits
    come best first; a ranking's tie-breaks are recency, then episode id, on both engines.
    """

    def write_doc(self, db: Any, *, episode_id: str, scope: str, fields: DocFields, started_at: str,
                  digest: str) -> tuple[int, bool]:
        """Insert or replace one episode's document: (doc_id, changed). The same content again changes
        nothing (a retried record, two daemons recording one episode)."""
        ...

    def forget(self, db: Any, episode_id: str) -> bool:
        """Delete the episode's document and its vector; whether there was one."""
        ...

    def text_candidates(self, db: Any, words: Sequence[str], scopes: Sequence[str], limit: int,
                        candidates: int) -> list[Hit]:
        """The best text matches in `scopes` by the engine's ranking (AND of the words first, every
        word OR-ed when that finds fewer than `limit`), at most `candidates`."""
        ...

    def metadata_only(self, db: Any, words: Sequence[str], scopes: Sequence[str]) -> bool:
        """Whether the words only select the scope's episodes (REQ-14's briefing query):
        `ranking.metadata_only`."""
        ...

    def briefing_order(self, db: Any, words: Sequence[str], scopes: Sequence[str]) -> list[Hit]:
        """A metadata-only query's answer: `ranking.briefing_rank` over the scope's newest episodes."""
        ...

    def path_candidates(self, db: Any, paths: Sequence[str], scopes: Sequence[str], among: Sequence[int]) -> list[Hit]:
        """The episodes of `scopes` that touched one of `paths`: `ranking.path_candidates`."""
        ...

    def knn(self, db: Any, vector: Sequence[float], scopes: Sequence[str]) -> list[Hit]:
        """The best CANDIDATES episodes of `scopes` by cosine distance to `vector`; none without vectors."""
        ...

    def vector_from_cache(self, db: Any, *, doc_id: int, scope: str, model: str, digest: str) -> bool:
        """Give the document its vector from the embedding cache; False when the cache has none."""
        ...

    def write_vector(self, db: Any, *, doc_id: int, scope: str, model: str, digest: str,
                     vector: Sequence[float]) -> None:
        """Store one episode's embedding (and cache it by content)."""
        ...

    def check_vectors(self, db: Any, model: str) -> bool:
        """At start, with an embedding model: whether vectors can be stored (saying once when not)."""
        ...

    def missing_vectors(self, db: Any) -> int:
        """Episodes without an embedding."""
        ...


def index_of(engine: str) -> DocIndex:
    """The built-in provider's `DocIndex` on store engine `engine` ("sqlite" or "postgresql")."""
    if engine == "postgresql":
        from ._builtin_pg import PG_INDEX

        return PG_INDEX
    return SQLITE_INDEX


class BuiltinProvider:
    """The contract's four operations over the store's builtin_* tables, on either store engine (the
    engine's part is `self.index`, a `DocIndex`; the flow below is the same on both).

    `embedder` (texts → vectors, e.g. `ModelApiClient.embed`) and `embedding_model` switch on hybrid
    ranking; both or neither. `query_embed_deadline` bounds the query embedding inside a recall and
    `record_embed_deadline` the episode embedding inside a record.
    """

    name = "builtin"

    def __init__(self, store: Store, *, embedder: Embedder | None = None, embedding_model: str | None = None,
                 query_embed_deadline: float = QUERY_EMBED_DEADLINE,
                 record_embed_deadline: float = RECORD_EMBED_DEADLINE) -> None:
        if (embedder is None) != (not embedding_model):
            raise ValueError("embedder and embedding_model go together")
        self.store = store
        self.index = index_of(store.engine)
        self.embedder = embedder
        self.embedding_model = embedding_model or ""
        self.query_embed_deadline = query_embed_deadline
        self.record_embed_deadline = record_embed_deadline

    @property
    def hybrid(self) -> bool:
        return self.embedder is not None

    async def check_vectors(self) -> bool:
        """At start, with an embedding model: whether vectors can be stored (sqlite-vec ships with the
        SQLite engine; PostgreSQL needs pgvector, and says once when it is missing)."""
        model = self.embedding_model
        return bool(await self.store.write(lambda db: self.index.check_vectors(db, model)))

    # -- record ---------------------------------------------------------------------------------
    async def record(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["episode_id"])
        scope = str(args["scope"])
        episode = args.get("episode") or {}
        text = str(args["text"])
        summary = str(episode.get("summary") or "")
        files = [str(f) for f in episode.get("files_touched") or []]
        started_at = str(episode.get("started_at") or "")
        digest = content_hash(text, summary)
        fields = record_fields(text, summary, files, episode if isinstance(episode, dict) else None)

        doc_id, _ = await self.store.write(lambda db: self.index.write_doc(
            db, episode_id=episode_id, scope=scope, fields=fields, started_at=started_at, digest=digest))
        if self.embedder is not None:
            await self._embed_doc(doc_id, scope, digest, embed_input(text, summary), episode_id)
        return {"ids": [episode_id]}

    async def _embed_doc(self, doc_id: int, scope: str, digest: str, text: str, episode_id: str) -> None:
        """Give the document its vector: from the cache, else from the model API under its own deadline."""
        assert self.embedder is not None
        model = self.embedding_model
        if await self.store.write(lambda db: self.index.vector_from_cache(
                db, doc_id=doc_id, scope=scope, model=model, digest=digest)):
            return
        vector: list[float] | None = None
        with trio.move_on_after(self.record_embed_deadline):
            try:
                vector = (await self.embedder([text]))[0]
            except MemactorsError as exc:
                _log.bind(episode=episode_id, error=type(exc).__name__).warning("episode left without embedding")
                return
        if vector is None:
            _log.bind(episode=episode_id, error="deadline").warning("episode left without embedding")
            return
        await self.store.write(lambda db: self.index.write_vector(db, doc_id=doc_id, scope=scope, model=model,
                                                                  digest=digest, vector=vector))

    # -- recall ---------------------------------------------------------------------------------
    async def recall(self, args: dict[str, Any]) -> dict[str, Any]:
        scopes = [str(s) for s in args["scope"]][:2]
        limit = max(1, min(20, int(args.get("limit", 8))))
        paths = [str(p) for p in args.get("paths") or []][:20]
        query = str(args.get("query", ""))
        words = search_words(query)
        hybrid = self.embedder is not None and bool(query.strip())
        index = self.index
        # A query whose words only select the scope's episodes (metadata_only) is answered by
        # briefing_order, with no snippet words and no cosine ranking.
        meta_mode = False

        def text_rankings(db: Any) -> tuple[list[str], dict[str, Hit]]:
            nonlocal meta_mode
            hits: dict[str, Hit] = {}
            text_rank: list[str] = []
            meta_mode = bool(words) and index.metadata_only(db, words, scopes)
            if meta_mode:
                found = index.briefing_order(db, words, scopes)
            elif words:
                # The text ranking alone (no path boost, no cosine): the answer is its first `limit`, so
                # ask for those.
                found = index.text_candidates(db, words, scopes, limit, CANDIDATES if paths or hybrid else limit)
            else:
                found = []
            for hit in found:
                hits[hit.episode_id] = hit
                text_rank.append(hit.episode_id)
            return text_rank, hits

        def fuse(db: Any, text_rank: list[str], cosine_rank: list[str],
                 hits: dict[str, Hit]) -> list[tuple[str, str, float]]:
            if meta_mode:
                cosine_rank = []
            started = {eid: h.started_at for eid, h in hits.items()}
            path_rank: dict[str, int] = {}
            if paths:
                # The path boost: the episodes that touched a requested path, best text match first.
                text_order = rank(rrf([r for r in (text_rank, cosine_rank) if r]), started, len(hits))
                touched = index.path_candidates(db, paths, scopes, [hits[eid].doc_id for eid in text_order])
                for hit in touched:
                    hits.setdefault(hit.episode_id, hit)
                    started.setdefault(hit.episode_id, hit.started_at)
                path_rank = path_ranking(touched, text_order)
            fused = rrf([r for r in (text_rank, cosine_rank, path_rank) if r])
            order = rank(fused, started, limit)
            texts = item_texts(db, [hits[eid] for eid in order], () if meta_mode else words)
            return [(eid, texts[eid], fused[eid]) for eid in order if eid in texts]

        def text_only(db: Any) -> list[tuple[str, str, float]]:
            text_rank, hits = text_rankings(db)
            return fuse(db, text_rank, [], hits)

        degraded: str | None = None
        if not hybrid:  # one read transaction, one worker-thread hop
            ranked = await self.store.read(text_only)
        else:
            cosine: list[Hit] = []
            results: dict[str, Any] = {}

            async def text_side() -> None:
                results["text"] = await self.store.read(text_rankings)

            async def vector_side() -> None:
                nonlocal degraded, cosine
                vector = await self._embed_query(query)
                if vector is None:
                    degraded = "embeddings_unavailable"
                    return
                cosine = await self.store.read(lambda db: index.knn(db, vector, scopes))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(text_side)
                nursery.start_soon(vector_side)
            text_rank, hits = results["text"]
            for hit in cosine:
                hits.setdefault(hit.episode_id, hit)
            cosine_rank = [hit.episode_id for hit in cosine]
            ranked = await self.store.read(lambda db: fuse(db, text_rank, cosine_rank, hits))
        out: dict[str, Any] = {"items": [{"id": eid, "text": text, "score": round(score, 9)}
                                         for eid, text, score in ranked]}
        if degraded:
            out["degraded"] = degraded
        return out

    async def _embed_query(self, query: str) -> list[float] | None:
        """The query's vector, or None when it cannot be had within the query deadline."""
        assert self.embedder is not None
        with trio.move_on_after(self.query_embed_deadline):
            try:
                return (await self.embedder([query[:EMBED_INPUT_CHARS]]))[0]
            except MemactorsError as exc:
                _log.bind(error=type(exc).__name__).warning("query not embedded; answering from the text index")
                return None
        _log.bind(error="deadline").warning("query not embedded; answering from the text index")
        return None

    # -- forget ---------------------------------------------------------------------------------
    async def forget(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["id"])
        return {"forgotten": await self.store.write(lambda db: self.index.forget(db, episode_id))}

    def contract(self) -> dict[str, Any]:
        return {"contract": CONTRACT_VERSION, "provider": {"name": self.name, "version": __version__}}

    # -- MCP ------------------------------------------------------------------------------------
    def server(self, *, validate_requests: bool = False) -> Server[Any]:
        """The MCP server exposing the four contract tools.

        With `validate_requests` every call is checked against the shipped input schema (and REQ-3's
        bounds) first and refused as a tool error naming the field: what `serve-builtin --stdio` does,
        since any MCP client may call it. In-process the daemon has already checked the same schema.
        """
        tools = _tools()

        async def list_tools(ctx: Any, params: Any) -> t.ListToolsResult:
            return t.ListToolsResult(tools=tools)

        async def call_tool(ctx: Any, params: t.CallToolRequestParams) -> t.CallToolResult:
            args = dict(params.arguments or {})
            if validate_requests and params.name in contract.TOOLS:
                try:
                    contract.check_request(params.name, args)
                except InvalidArgument as exc:
                    return _error(f"{params.name}: INVALID_ARGUMENT: {exc}")
            try:
                match params.name:
                    case "memory_contract":
                        out = self.contract()
                    case "memory_record_episode":
                        out = await self.record(args)
                    case "memory_recall":
                        out = await self.recall(args)
                    case "memory_forget":
                        out = await self.forget(args)
                    case other:
                        return _error(f"unknown tool {other}")
            except (KeyError, TypeError, ValueError) as exc:
                return _error(f"{params.name}: bad arguments ({type(exc).__name__})")
            except MemactorsError as exc:  # the store down (PostgreSQL): a provider error, not a crash
                return _error(f"{params.name}: {exc.code}: {exc}")
            return t.CallToolResult(content=[t.TextContent(type="text", text=json.dumps(out))], structured_content=out)

        return Server("memactors-builtin", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


def _error(message: str) -> t.CallToolResult:
    return t.CallToolResult(content=[t.TextContent(type="text", text=message)], is_error=True)
