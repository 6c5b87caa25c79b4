"""The built-in memory provider (SPEC-0030 REQ-11): the REQ-3 contract over the daemon's own store.

It is a real MCP server (the SDK's low-level `Server`), reached in-process through `mcp.Client(server)`
by the provider session, so conformance checks and scope enforcement exercise it exactly as they do an
upstream. `memactors provider serve-builtin --stdio [--db PATH]` serves the same server over stdio so it
can be configured as an `[mcp.<name>]` upstream. Its ids are episode ids.

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

Ranking (reciprocal rank fusion, k = 60, of up to three rankings):

* **BM25** over FTS5, restricted to the caller's scopes inside FTS5 — the scope's token
  (`scope_key : (...)`) and the scope's own doc-id range (`num << 32 | sequence`, `rowid BETWEEN`) — so
  the work follows the caller's repository, not the store. The plan: the AND of every query word first; only
  when that finds fewer than `limit` episodes, every word OR-ed (which includes the AND matches). Best
  200 candidates by `rank` (BM25 with BM25_WEIGHTS over the content and metadata columns; the scope
  column weighs 0).
* **Cosine** (hybrid only): the query's embedding against `builtin_vec`, best 200 in the caller's scopes.
* **Path boost**: when the request carries `paths`, the episodes whose `files_touched` contains one of
  them exactly (repository-relative), newest first, best 200, form a third ranking. An episode that
  touched a requested path therefore gains 1/(60 + rank) — as much as a top BM25 hit at the same rank —
  and an episode that matches the query *and* touched the path outranks one that only matches the query.
  A path match alone is enough to be returned.

The query's words are searched less STOPWORDS (function words and question phrasing). A query whose
words only select the scope's episodes — REQ-14's briefing query of repository, branch and harness
name, which every episode's `meta` column matches alike — is not ranked by BM25 but by what helps the
next run (`metadata_only`, `briefing_order`: recency, this branch, failed-then-fixed; issue 17).

The fused score is Σ 1/(60 + rank) over the rankings an episode appears in; ties break by recency
(started_at, newest first), then by episode id. Without an embedding model the ranking is BM25 (plus
the path boost) alone.

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

import contextlib
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
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
from .gist import cut_words, gist
from .store import _WORD, Store, scope_doc_id, scope_key, scope_range

CONTRACT_VERSION = 1
RRF_K = 60
#: Bound on one item's text (its gist, `gist.gist`): the run's own words first, so a briefing that
#: cuts it further at a word boundary keeps the best of it.
MAX_ITEM_TEXT = 320
CANDIDATES = 200
#: `builtin_fts`'s columns (migration 0009), in order: the scope token, then what the run said and
#: touched (the content columns), then its metadata (harness, adapter, model, repository, branch,
#: outcome, reason, run id, pull request), which every episode of a scope shares in part.
FTS_COLUMNS = ("scope_key", "title", "excerpt", "files", "failures", "meta")
CONTENT_COLUMNS = ("title", "excerpt", "files", "failures")
#: BM25 weight of each FTS column (the scope token weighs nothing): the run's first words (its summary,
#: else the start of its excerpt) count most, then the paths it touched (docs/benchmarks.md, "Recall
#: quality", says what each weight did).
BM25_WEIGHTS = (0.0, 3.0, 1.0, 1.5, 1.0, 0.25)
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


@attrs.frozen
class Hit:
    episode_id: str
    doc_id: int
    started_at: str


def query_words(query: str) -> list[str]:
    """The distinct words of a query, lower-cased, in order."""
    return list(dict.fromkeys(_WORD.findall(query.lower())))


#: Words that say how a question is asked, not what it is about: English function words and the
#: phrasing of a question a developer asks before starting work ("has anyone already changed how ...").
#: Dropped from a query unless nothing else is left (issue 17: with them, the AND of a natural
#: question matched nothing and the OR ranked the episodes that happened to say "anyone" or "did").
STOPWORDS = frozenset("""
a about above after again against all already also am an and any anyone anything are around as at be
because been before being below between both but by can could did do does doing done down during each
ever few for from further get got had has have having he her here hers him his how i if in into is it
its itself just last lately me more most my myself no nor not now of off on once only or other our ours
out over own please previously recent recently same she should so some someone something still such
than that the their theirs them then there these they this those through to too under until up us very
was we were what when where which while who whom why will with would yet you your yours
""".split())


def search_words(query: str) -> list[str]:
    """The words a recall searches for: the query's words less STOPWORDS (all of them when that would
    leave none)."""
    words = query_words(query)
    kept = [w for w in words if w not in STOPWORDS]
    return kept or words


def rank_function(weights: Sequence[float] = ()) -> str:
    """The BM25 rank expression with each FTS column's weight (BM25_WEIGHTS unless given)."""
    return "bm25(" + ", ".join(repr(float(w)) for w in (weights or BM25_WEIGHTS)) + ")"


def scoped_match(words: Sequence[str], scopes: Sequence[str], op: str) -> str:
    """The FTS5 expression: one of the scopes' tokens AND the words (joined by `op`) in the content and
    metadata columns.

    Every word is double-quoted, so FTS5 operators in user text stay inert.
    """
    keys = " OR ".join(f'"{scope_key(s)}"' for s in scopes)
    terms = f" {op} ".join(f'"{w}"' for w in words)
    return f"scope_key : ({keys}) AND {{{' '.join(FTS_COLUMNS[1:])}}} : ({terms})"



def bm25_candidates(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str],
                    limit: int, candidates: int = CANDIDATES) -> list[Hit]:
    """BM25 candidates in `scopes`, AND of the words first, OR when AND finds fewer than `limit`.

    Each scope is searched within its own doc-id range (`rowid BETWEEN`, which FTS5 seeks to) and with
    its scope token, and the joined row's scope is checked once more. Returns the hits, best first:
    rank (BM25 with BM25_WEIGHTS, configured as the table's rank), then recency, then id.

    At most `candidates` hits: the best `candidates` of the order above (a prefix of it, whatever the
    number), so a recall ranked by BM25 alone asks for `limit` and skips the other 200 - `limit`.
    """
    ranges = scope_ranges(db, scopes)
    any_word = scoped_match(words, scopes, "OR")
    plans = [scoped_match(words, scopes, "AND"), any_word] if len(words) > 1 else [any_word]
    rows: list[Any] = []
    for match in plans:
        rows = []
        for scope, low, high in ranges:
            rows += db.execute(
                f"SELECT builtin_fts.rank, d.started_at, d.episode_id, d.doc_id"
                # CROSS JOIN: FTS5 drives (one match walk), never one MATCH per document of the scope.
                f" FROM builtin_fts CROSS JOIN builtin_docs d ON d.doc_id = builtin_fts.rowid"
                f" WHERE builtin_fts MATCH ? AND builtin_fts.rank MATCH ? AND builtin_fts.rowid BETWEEN ? AND ?"
                f" AND d.scope = ? ORDER BY builtin_fts.rank, d.started_at DESC, d.episode_id LIMIT {int(candidates)}",
                [match, rank_function(), low, high, scope],
            ).fetchall()
        if len(ranges) > 1:
            rows.sort(key=lambda r: (r[0], _desc(r[1]), r[2]))
            rows = rows[:candidates]
        if len(rows) >= limit:
            break
    return [Hit(r[2], int(r[3]), r[1]) for r in rows]


def scope_ranges(db: sqlite_utils.Database, scopes: Sequence[str]) -> list[tuple[str, int, int]]:
    """(scope, first doc id, last doc id) of each requested scope that has documents."""
    wanted = list(dict.fromkeys(scopes))
    nums = dict(db.execute(f"SELECT scope, num FROM builtin_scopes WHERE scope IN ({','.join('?' * len(wanted))})",
                           wanted).fetchall())
    return [(scope, *scope_range(int(nums[scope]))) for scope in wanted if scope in nums]


def _occurs(db: sqlite_utils.Database, match: str, ranges: Sequence[tuple[str, int, int]]) -> bool:
    return any(db.execute("SELECT 1 FROM builtin_fts WHERE builtin_fts MATCH ? AND rowid BETWEEN ? AND ? LIMIT 1",
                          [match, low, high]).fetchone() is not None for _, low, high in ranges)


def metadata_only(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str]) -> bool:
    """Whether a query's words only select the scope's episodes (REQ-14's briefing query: repository,
    branch and harness name): each word occurs in the `meta` column of an episode of the scope or in
    none of its episodes at all, and one at least in `meta`. A word found in what a run said or touched
    and not in any metadata makes it a real query. At most two index probes per word."""
    ranges = scope_ranges(db, scopes)
    if not ranges or not words:
        return False
    content = "{" + " ".join(CONTENT_COLUMNS) + "}"
    in_meta = False
    for w in words:
        if _occurs(db, f'meta : "{w}"', ranges):
            in_meta = True
        elif _occurs(db, f'{content} : "{w}"', ranges):
            return False
    return in_meta


#: Episodes of the scope considered for a metadata-only query (newest first).
BRIEFING_CANDIDATES = 200


def briefing_order(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str]) -> list[Hit]:
    """A metadata-only query's answer (see `metadata_only`), ordered by what helps the next run instead
    of BM25 (which, every episode matching alike, preferred the shortest: "fix typo").

    The scope's newest BRIEFING_CANDIDATES episodes that have something to show (an excerpt or a file;
    a run that wrote nothing and touched nothing is left out), fused by reciprocal rank fusion (k = 60)
    of: all of them newest first; those on the query's branch (every word of their branch is a word
    of the query) newest first; and those that fixed what failed — a run that succeeded after a failed
    run of the scope touching one of the same files — newest first. Ties by recency, then id.
    """
    rows: list[tuple[int, str, str, str, str, str]] = []
    for scope, _low, _high in scope_ranges(db, scopes):
        rows += db.execute(
            "SELECT doc_id, episode_id, started_at, branch, outcome, files FROM builtin_docs"
            " WHERE scope = ? AND (excerpt != '' OR files != '[]')"
            f" ORDER BY started_at DESC, episode_id LIMIT {BRIEFING_CANDIDATES}", [scope]).fetchall()
    rows.sort(key=lambda r: (_desc(r[2]), r[1]))
    rows = rows[:BRIEFING_CANDIDATES]
    wanted = set(words)
    on_branch = [r[1] for r in rows if r[3] and set(_WORD.findall(r[3].lower())) <= wanted]
    failed_files: set[str] = set()
    fixed: list[str] = []
    for r in reversed(rows):  # oldest first
        files = set(json.loads(r[5]))
        if r[4] == "failed":
            failed_files |= files
        elif r[4] == "succeeded" and files & failed_files:
            fixed.append(r[1])
            failed_files -= files
    fixed.reverse()
    fused = rrf([r for r in ([row[1] for row in rows], on_branch, fixed) if r])
    started = {r[1]: r[2] for r in rows}
    hits = {r[1]: Hit(r[1], int(r[0]), r[2]) for r in rows}
    return [hits[eid] for eid in rank(fused, started, len(fused))]


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
    title = summary or cut_words(excerpt, TITLE_CHARS).rstrip("…")
    return DocFields(
        title=title, excerpt=excerpt, summary=summary, files=files, failures=failures,
        meta=" ".join(v for v in (value(name) for name in META_FIELDS) if v),
        harness=value("harness"), branch=value("branch"), outcome=value("outcome"),
    )


def _chunks(ids: Sequence[int], size: int = 500) -> list[Sequence[int]]:
    """`ids` in slices small enough for one statement's bound parameters."""
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal rank fusion: Σ 1 / (k + rank) over every ranking an id appears in (rank from 1)."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
    return fused


def rank(fused: dict[str, float], started: dict[str, str], limit: int) -> list[str]:
    """Ids by fused score, ties by recency (started_at newest first), then id."""
    by_id = sorted(fused)
    by_recency = sorted(by_id, key=lambda eid: started.get(eid, ""), reverse=True)  # stable: id order kept
    return sorted(by_recency, key=lambda eid: -fused[eid])[:limit]


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
        marks = ",".join("?" * len(scopes))
        hybrid = self.embedder is not None and bool(query.strip())
        # A query whose words only select the scope's episodes (metadata_only) is answered by
        # briefing_order, with no snippet words and no cosine ranking.
        meta_mode = False

        def text_rankings(db: sqlite_utils.Database) -> tuple[list[str], list[str], dict[str, Hit]]:
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
            path_rank: list[str] = []
            if paths:
                conds = " OR ".join("EXISTS (SELECT 1 FROM json_each(d.files) WHERE value = ?)" for _ in paths)
                rows = db.execute(
                    f"SELECT d.episode_id, d.doc_id, d.started_at FROM builtin_docs d"
                    f" WHERE d.scope IN ({marks}) AND ({conds})"
                    f" ORDER BY d.started_at DESC, d.episode_id LIMIT {CANDIDATES}",
                    [*scopes, *paths],
                ).fetchall()
                for eid, doc_id, started in rows:
                    hits.setdefault(eid, Hit(eid, int(doc_id), started))
                    path_rank.append(eid)
            return bm25_rank, path_rank, hits

        def fuse(db: sqlite_utils.Database, bm25_rank: list[str], cosine_rank: list[str], path_rank: list[str],
                 hits: dict[str, Hit]) -> list[tuple[str, str, float]]:
            if meta_mode:
                cosine_rank = []
            fused = rrf([r for r in (bm25_rank, cosine_rank, path_rank) if r])
            order = rank(fused, {eid: h.started_at for eid, h in hits.items()}, limit)
            texts = item_texts(db, [hits[eid] for eid in order], () if meta_mode else words)
            return [(eid, texts[eid], fused[eid]) for eid in order if eid in texts]

        def text_only(db: sqlite_utils.Database) -> list[tuple[str, str, float]]:
            bm25_rank, path_rank, hits = text_rankings(db)
            return fuse(db, bm25_rank, [], path_rank, hits)

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
            bm25_rank, path_rank, hits = results["text"]
            for eid, hit in cosine_hits.items():
                hits.setdefault(eid, hit)
            ranked = await self.store.read(lambda db: fuse(db, bm25_rank, cosine_rank, path_rank, hits))
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


def _desc(started_at: str) -> tuple[int, ...]:
    """Sort key for 'newest first' on ISO strings."""
    return tuple(-ord(c) for c in started_at)


def _error(message: str) -> t.CallToolResult:
    return t.CallToolResult(content=[t.TextContent(type="text", text=message)], is_error=True)


async def serve_builtin_stdio(db_path: Path, *, embedder: Embedder | None = None,
                              embedding_model: str | None = None) -> None:
    """Serve the built-in provider over stdio on the store at `db_path` until stdin closes.

    `memactors provider serve-builtin --stdio` runs this, so the built-in provider can be configured as
    an `[mcp.<name>]` upstream (and exercised exactly as a third-party one).

    The wire is read and written with non-blocking pipes on trio's own I/O loop (`_PipeLines` /
    `_PipeWriter`), not the SDK's default file wrappers, which run every line read and every write and
    flush in a worker thread: one request at a time went through stdin that way, and a queued backlog
    drained at ~150 records/s (docs/benchmarks.md, "drain"). As the SDK does, fd 0 and 1 are moved off
    the wire while serving (to the null device and to stderr), so nothing a handler prints can corrupt it.
    """
    from mcp.server.stdio import stdio_server

    store = await Store.open(db_path)
    try:
        server = BuiltinProvider(store, embedder=embedder, embedding_model=embedding_model).server(
            validate_requests=True)
        with _claimed_stdio() as (wire_in, wire_out):
            async with _PipeLines(wire_in) as stdin, _PipeWriter(wire_out) as stdout, \
                    stdio_server(stdin=stdin, stdout=stdout) as (read, write):  # type: ignore[arg-type]
                await server.run(read, write, server.create_initialization_options())
    finally:
        store.close()


@contextmanager
def _claimed_stdio() -> Iterator[tuple[int, int]]:
    """Private duplicates of fd 0 and 1 (the wire), with fd 0 pointed at the null device and fd 1 at
    stderr meanwhile; restored on exit."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.close(null)
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


class _PipeLines:
    """`async for line in …` over a pipe: the lines of newline-delimited JSON-RPC, read in chunks."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.lowlevel.FdStream(fd)  # owns and closes fd

    async def __aenter__(self) -> _PipeLines:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stream.aclose()

    async def __aiter__(self) -> AsyncIterator[str]:
        buffer = b""
        while True:
            chunk = await self._stream.receive_some(1 << 16)
            if not chunk:
                if buffer.strip():
                    yield buffer.decode("utf-8", "replace")
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield line.decode("utf-8", "replace")


class _PipeWriter:
    """`write` / `flush` as the SDK's stdout writer calls them, one `send_all` per message."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.lowlevel.FdStream(fd)

    async def __aenter__(self) -> _PipeWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._stream.aclose()

    async def write(self, text: str) -> None:
        await self._stream.send_all(text.encode("utf-8"))

    async def flush(self) -> None:
        return None
