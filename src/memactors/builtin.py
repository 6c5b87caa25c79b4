"""The built-in memory provider (SPEC-0030 REQ-11): the REQ-3 contract over the daemon's own store.

It is a real MCP server (the SDK's low-level `Server`), reached in-process through `mcp.Client(server)`
by the provider session, so conformance checks and scope enforcement exercise it exactly as they do an
upstream. `memactors provider serve-builtin --stdio [--db PATH]` serves the same server over stdio
(`builtin_stdio.py`) so it can be configured as an `[mcp.<name>]` upstream. Its ids are episode ids.

Storage (all in the store's SQLite file): `builtin_docs` (one row per episode: scope, its FTS5 scope
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
from typing import Any

import attrs
import mcp.types as t
import sqlite_utils
import sqlite_vec
import trio
from loguru import logger
from mcp.server import Server

from . import __version__, contract
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
from .ranking import _desc
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
from .store import Store, scope_doc_id, scope_key
from .wrapper import ELLIPSIS, cut_at_word

CONTRACT_VERSION = 1
#: Bound on one item's text (its gist, `gist.gist`): the run's own words first, so a briefing that
#: cuts it further at a word boundary keeps the best of it.
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


# -- synchronous store helpers (used by the provider and by bench/) --------------------------------

def write_doc(db: sqlite_utils.Database, *, episode_id: str, scope: str, text: str, summary: str,
              files: Sequence[str], started_at: str,
              episode: Mapping[str, Any] | None = None) -> tuple[int, str, bool]:
    """Insert or replace one episode's document; returns (doc_id, content hash, changed).

    `episode` is the REQ-5 object memory_record_episode carries; what it lacks is read from `text`.
    """
    digest = content_hash(text, summary)
    row = db.execute("SELECT doc_id, content_hash, scope FROM builtin_docs WHERE episode_id = ?",
                     [episode_id]).fetchone()
    if row is not None and row[1] == digest and row[2] == scope:
        return int(row[0]), digest, False  # recording the same episode twice changes nothing
    if row is not None:
        _delete_doc(db, int(row[0]))
    doc_id = scope_doc_id(db, scope)  # in the scope's own rowid range
    given: dict[str, Any] = {"summary": summary or None, **({"files_touched": list(files)} if files else {})}
    fields = doc_fields(text, {**given, **(episode or {})})
    insert_doc(db, doc_id=doc_id, episode_id=episode_id, scope=scope, fields=fields, started_at=started_at,
               digest=digest)
    return doc_id, digest, True


def insert_doc(db: sqlite_utils.Database, *, doc_id: int, episode_id: str, scope: str, fields: DocFields,
               started_at: str, digest: str) -> None:
    """One builtin_docs row; builtin_fts follows by trigger (external content: the text is stored once)."""
    db.execute(
        "INSERT INTO builtin_docs (doc_id, episode_id, scope, scope_key, title, excerpt, summary, files, failures,"
        " meta, harness, branch, outcome, started_at, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [doc_id, episode_id, scope, scope_key(scope), fields.title, fields.excerpt, fields.summary,
         json.dumps(list(fields.files), ensure_ascii=False), json.dumps([list(f) for f in fields.failures],
                                                                        ensure_ascii=False),
         fields.meta, fields.harness, fields.branch, fields.outcome, started_at, digest],
    )


def _delete_doc(db: sqlite_utils.Database, doc_id: int) -> None:
    db.execute("DELETE FROM builtin_docs WHERE doc_id = ?", [doc_id])  # builtin_fts follows by trigger
    if _vec_exists(db):
        db.execute("DELETE FROM builtin_vec WHERE doc_id = ?", [doc_id])


def _vec_exists(db: sqlite_utils.Database) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'builtin_vec'").fetchone() is not None


def ensure_vec_table(db: sqlite_utils.Database, model: str, dim: int) -> None:
    """Create `builtin_vec` for (model, dim), or rebuild it empty when either changed."""
    meta = dict(db.execute("SELECT key, value FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')").fetchall())
    exists = _vec_exists(db)
    if exists and meta.get("vec_model") == model and meta.get("vec_dim") == str(dim):
        return
    if exists:
        db.execute("DROP TABLE builtin_vec")
    db.execute(f"CREATE VIRTUAL TABLE builtin_vec USING vec0(doc_id INTEGER PRIMARY KEY,"
               f" scope TEXT PARTITION KEY, embedding float[{int(dim)}] distance_metric=cosine)")
    db.execute("INSERT OR REPLACE INTO builtin_meta (key, value) VALUES ('vec_model', ?), ('vec_dim', ?)",
               [model, str(dim)])


def write_vector(db: sqlite_utils.Database, *, doc_id: int, scope: str, model: str, digest: str,
                 vector: Sequence[float]) -> None:
    """Store one episode's embedding in `builtin_vec` and in the cache."""
    blob = sqlite_vec.serialize_float32(list(vector))
    ensure_vec_table(db, model, len(vector))
    db.execute("INSERT OR REPLACE INTO builtin_embed_cache (content_hash, model, dim, vector) VALUES (?,?,?,?)",
               [digest, model, len(vector), blob])
    db.execute("DELETE FROM builtin_vec WHERE doc_id = ?", [doc_id])
    db.execute("INSERT INTO builtin_vec (doc_id, scope, embedding) VALUES (?, ?, ?)", [doc_id, scope, blob])


def cached_vector(db: sqlite_utils.Database, digest: str, model: str) -> bytes | None:
    row = db.execute("SELECT vector FROM builtin_embed_cache WHERE content_hash = ? AND model = ?",
                     [digest, model]).fetchone()
    return None if row is None else bytes(row[0])


def missing_vectors(db: sqlite_utils.Database) -> int:
    """Episodes the built-in provider holds without an embedding (doctor warns when non-zero)."""
    if db.dialect.name == "postgresql":
        from ._builtin_pg import missing_vectors as pg_missing

        return pg_missing(db)
    total = db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]
    if not _vec_exists(db):
        return int(total)
    have = db.execute("SELECT count(*) FROM builtin_vec").fetchone()[0]
    return int(total) - int(have)


class BuiltinProvider:
    """The contract's four operations over the store's builtin_* tables.

    `embedder` (texts → vectors, e.g. `ModelApiClient.embed`) and `embedding_model` switch on hybrid
    ranking; both or neither. `query_embed_deadline` bounds the query embedding inside a recall and
    `record_embed_deadline` the episode embedding inside a record.
    """

    name = "builtin"

    def __new__(cls, store: Store, **kwargs: Any) -> BuiltinProvider:
        """On a PostgreSQL store, the provider whose documents and ranking inputs are PostgreSQL's
        (`_builtin_pg`); everything else about it is this class's."""
        if cls is BuiltinProvider and store.engine == "postgresql":
            from ._builtin_pg import _provider_class

            return super().__new__(_provider_class())  # type: ignore[no-any-return]
        return super().__new__(cls)

    def __init__(self, store: Store, *, embedder: Embedder | None = None, embedding_model: str | None = None,
                 query_embed_deadline: float = QUERY_EMBED_DEADLINE,
                 record_embed_deadline: float = RECORD_EMBED_DEADLINE) -> None:
        if (embedder is None) != (not embedding_model):
            raise ValueError("embedder and embedding_model go together")
        self.store = store
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
        return True

    # -- record ---------------------------------------------------------------------------------
    async def record(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["episode_id"])
        scope = str(args["scope"])
        episode = args.get("episode") or {}
        text = str(args["text"])
        summary = str(episode.get("summary") or "")
        files = [str(f) for f in episode.get("files_touched") or []]
        started_at = str(episode.get("started_at") or "")

        doc_id, digest, _ = await self.store.write(lambda db: write_doc(
            db, episode_id=episode_id, scope=scope, text=text, summary=summary, files=files, started_at=started_at,
            episode=episode if isinstance(episode, dict) else None))
        if self.embedder is not None:
            await self._embed_doc(doc_id, scope, digest, embed_input(text, summary), episode_id)
        return {"ids": [episode_id]}

    async def _embed_doc(self, doc_id: int, scope: str, digest: str, text: str, episode_id: str) -> None:
        """Give the document its vector: from the cache, else from the model API under its own deadline."""
        assert self.embedder is not None
        model = self.embedding_model

        def from_cache(db: sqlite_utils.Database) -> bool:
            blob = cached_vector(db, digest, model)
            if blob is None:
                return False
            exists = _vec_exists(db) and db.execute(
                "SELECT 1 FROM builtin_vec WHERE doc_id = ?", [doc_id]).fetchone() is not None
            if not exists:
                dim = len(blob) // 4
                ensure_vec_table(db, model, dim)
                db.execute("INSERT INTO builtin_vec (doc_id, scope, embedding) VALUES (?, ?, ?)", [doc_id, scope, blob])
            return True

        if await self.store.write(from_cache):
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
        await self.store.write(lambda db: write_vector(db, doc_id=doc_id, scope=scope, model=model, digest=digest,
                                                       vector=vector))

    # -- recall ---------------------------------------------------------------------------------
    async def recall(self, args: dict[str, Any]) -> dict[str, Any]:
        scopes = [str(s) for s in args["scope"]][:2]
        limit = max(1, min(20, int(args.get("limit", 8))))
        paths = [str(p) for p in args.get("paths") or []][:20]
        query = str(args.get("query", ""))
        words = search_words(query)
        hybrid = self.embedder is not None and bool(query.strip())
        # A query whose words only select the scope's episodes (metadata_only) is answered by
        # briefing_order, with no snippet words and no cosine ranking.
        meta_mode = False

        def text_rankings(db: sqlite_utils.Database) -> tuple[list[str], dict[str, Hit]]:
            nonlocal meta_mode
            hits: dict[str, Hit] = {}
            bm25_rank: list[str] = []
            meta_mode = bool(words) and metadata_only(db, words, scopes)
            if meta_mode:
                for hit in briefing_order(db, words, scopes):
                    hits[hit.episode_id] = hit
                    bm25_rank.append(hit.episode_id)
            elif words:
                # BM25 alone (no path boost, no cosine): the answer is BM25's first `limit`, so ask for those.
                found = bm25_candidates(db, words, scopes, limit, CANDIDATES if paths or hybrid else limit)
                for hit in found:
                    hits[hit.episode_id] = hit
                    bm25_rank.append(hit.episode_id)
            return bm25_rank, hits

        def fuse(db: sqlite_utils.Database, bm25_rank: list[str], cosine_rank: list[str],
                 hits: dict[str, Hit]) -> list[tuple[str, str, float]]:
            if meta_mode:
                cosine_rank = []
            started = {eid: h.started_at for eid, h in hits.items()}
            path_rank: dict[str, int] = {}
            if paths:
                # The path boost: the episodes that touched a requested path, best text match first.
                text_order = rank(rrf([r for r in (bm25_rank, cosine_rank) if r]), started, len(hits))
                touched = path_candidates(db, paths, scopes, [hits[eid].doc_id for eid in text_order])
                for hit in touched:
                    hits.setdefault(hit.episode_id, hit)
                    started.setdefault(hit.episode_id, hit.started_at)
                path_rank = path_ranking(touched, text_order)
            fused = rrf([r for r in (bm25_rank, cosine_rank, path_rank) if r])
            order = rank(fused, started, limit)
            texts = item_texts(db, [hits[eid] for eid in order], () if meta_mode else words)
            return [(eid, texts[eid], fused[eid]) for eid in order if eid in texts]

        def text_only(db: sqlite_utils.Database) -> list[tuple[str, str, float]]:
            bm25_rank, hits = text_rankings(db)
            return fuse(db, bm25_rank, [], hits)

        degraded: str | None = None
        if not hybrid:  # one read transaction, one worker-thread hop
            ranked = await self.store.read(text_only)
        else:
            cosine_rank: list[str] = []
            cosine_hits: dict[str, Hit] = {}
            results: dict[str, Any] = {}

            async def text_side() -> None:
                results["text"] = await self.store.read(text_rankings)

            async def vector_side() -> None:
                nonlocal degraded, cosine_rank, cosine_hits
                vector = await self._embed_query(query)
                if vector is None:
                    degraded = "embeddings_unavailable"
                    return
                cosine_rank, cosine_hits = await self.store.read(lambda db: _knn(db, vector, scopes))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(text_side)
                nursery.start_soon(vector_side)
            bm25_rank, hits = results["text"]
            for eid, hit in cosine_hits.items():
                hits.setdefault(eid, hit)
            ranked = await self.store.read(lambda db: fuse(db, bm25_rank, cosine_rank, hits))
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
                _log.bind(error=type(exc).__name__).warning("query not embedded; answering from FTS5")
                return None
        _log.bind(error="deadline").warning("query not embedded; answering from FTS5")
        return None

    # -- forget ---------------------------------------------------------------------------------
    async def forget(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["id"])

        def write(db: sqlite_utils.Database) -> bool:
            row = db.execute("SELECT doc_id FROM builtin_docs WHERE episode_id = ?", [episode_id]).fetchone()
            if row is None:
                return False
            _delete_doc(db, int(row[0]))
            return True

        return {"forgotten": await self.store.write(write)}

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


def _knn(db: sqlite_utils.Database, vector: Sequence[float], scopes: Sequence[str]) -> tuple[list[str], dict[str, Hit]]:
    """Best CANDIDATES episodes by cosine distance in the given scopes (one vec0 partition each)."""
    if not _vec_exists(db):
        return [], {}
    dim = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()
    if dim is None or int(dim[0]) != len(vector):
        return [], {}
    blob = sqlite_vec.serialize_float32(list(vector))
    found: list[tuple[float, str, int, str]] = []
    for scope in scopes:
        rows = db.execute(
            f"SELECT v.distance, d.episode_id, d.doc_id, d.started_at FROM"
            f" (SELECT doc_id, distance FROM builtin_vec WHERE embedding MATCH ? AND k = {CANDIDATES}"
            f"  AND scope = ?) v JOIN builtin_docs d ON d.doc_id = v.doc_id",
            [blob, scope],
        ).fetchall()
        found.extend((float(r[0]), r[1], int(r[2]), r[3]) for r in rows)
    found.sort(key=lambda r: (r[0], _desc(r[3]), r[1]))
    found = found[:CANDIDATES]
    return [r[1] for r in found], {r[1]: Hit(r[1], r[2], r[3]) for r in found}


def _error(message: str) -> t.CallToolResult:
    return t.CallToolResult(content=[t.TextContent(type="text", text=message)], is_error=True)
