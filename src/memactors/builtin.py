"""The built-in memory provider (SPEC-0030 REQ-11): the REQ-3 contract over the daemon's own store.

It is a real MCP server (the SDK's low-level `Server`), reached in-process through `mcp.Client(server)`
by the provider session, so conformance checks and scope enforcement exercise it exactly as they do an
upstream. `memactors provider serve-builtin --stdio` serves the same server over stdio.

Ranking: BM25 over FTS5 (`porter unicode61`) on each episode's text and summary. Requested paths add a
second ranking (episodes whose files_touched contains a requested path, newest first) fused with BM25 by
reciprocal rank fusion, k = 60; with an embedding model the cosine ranking joins the fusion. Ties break
by recency (started_at, newest first), then id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import attrs
import mcp.types as t
import sqlite_utils
from mcp.server import Server

from . import __version__
from .store import Store

CONTRACT_VERSION = 1
RRF_K = 60
MAX_ITEM_TEXT = 2000
CANDIDATES = 200

_WORD = re.compile(r"\w+", re.UNICODE)


def _schema(props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


TOOLS = [
    t.Tool(name="memory_contract", description="Contract version and provider identity.", input_schema=_schema({}, [])),
    t.Tool(
        name="memory_record_episode",
        description="Store one episode; returns the ids it is stored under.",
        input_schema=_schema(
            {
                "episode_id": {"type": "string"},
                "scope": {"type": "string"},
                "trust_class": {"type": "string"},
                "episode": {"type": "object"},
                "text": {"type": "string"},
            },
            ["episode_id", "scope", "trust_class", "episode", "text"],
        ),
    ),
    t.Tool(
        name="memory_recall",
        description="Search episodes in the given scopes.",
        input_schema=_schema(
            {
                "query": {"type": "string", "maxLength": 512},
                "scope": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20},
                "paths": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            },
            ["query", "scope", "limit"],
        ),
    ),
    t.Tool(
        name="memory_forget",
        description="Forget one stored id.",
        input_schema=_schema({"id": {"type": "string"}}, ["id"]),
    ),
]


def fts_query(query: str) -> str | None:
    """A safe FTS5 MATCH expression: every word of the query, quoted, OR-ed. None when there are no words."""
    words = _WORD.findall(query.lower())
    if not words:
        return None
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


@attrs.frozen
class Hit:
    episode_id: str
    text: str
    summary: str
    started_at: str
    score: float


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal rank fusion: Σ 1 / (k + rank) over every ranking an id appears in (rank from 1)."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
    return fused


class BuiltinProvider:
    """The contract's four operations over the store's builtin_* tables."""

    name = "builtin"

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- record ---------------------------------------------------------------------------------
    async def record(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["episode_id"])
        episode = args.get("episode") or {}
        text = str(args["text"])
        summary = str(episode.get("summary") or "")
        files = [str(f) for f in episode.get("files_touched") or []]
        started_at = str(episode.get("started_at") or "")
        content_hash = hashlib.sha256(f"{text}\0{summary}".encode()).hexdigest()

        def write(db: sqlite_utils.Database) -> None:
            row = db.execute("SELECT doc_id, content_hash FROM builtin_docs WHERE episode_id = ?", [episode_id]).fetchone()
            if row is not None and row[1] == content_hash:
                return  # recording the same episode twice changes nothing
            if row is not None:
                db.execute("DELETE FROM builtin_fts WHERE rowid = ?", [row[0]])
                db.execute("DELETE FROM builtin_docs WHERE doc_id = ?", [row[0]])
            cur = db.execute(
                "INSERT INTO builtin_docs (episode_id, scope, text, summary, files, started_at, content_hash)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [episode_id, str(args["scope"]), text, summary, json.dumps(files), started_at, content_hash],
            )
            db.execute("INSERT INTO builtin_fts (rowid, text, summary) VALUES (?, ?, ?)", [cur.lastrowid, text, summary])

        await self.store.write(write)
        return {"ids": [episode_id]}

    # -- recall ---------------------------------------------------------------------------------
    async def recall(self, args: dict[str, Any]) -> dict[str, Any]:
        scopes = [str(s) for s in args["scope"]][:2]
        limit = max(1, min(20, int(args.get("limit", 8))))
        paths = [str(p) for p in args.get("paths") or []][:20]
        match = fts_query(str(args.get("query", "")))

        def read(db: sqlite_utils.Database) -> tuple[list[str], list[str], dict[str, Hit]]:
            marks = ",".join("?" * len(scopes))
            hits: dict[str, Hit] = {}
            bm25_rank: list[str] = []
            if match is not None:
                rows = db.execute(
                    f"SELECT d.episode_id, d.text, d.summary, d.started_at, bm25(builtin_fts) AS s"
                    f" FROM builtin_fts JOIN builtin_docs d ON d.doc_id = builtin_fts.rowid"
                    f" WHERE builtin_fts MATCH ? AND d.scope IN ({marks})"
                    f" ORDER BY s, d.started_at DESC, d.episode_id LIMIT {CANDIDATES}",
                    [match, *scopes],
                ).fetchall()
                for eid, text, summary, started, score in rows:
                    hits[eid] = Hit(eid, text, summary, started, -float(score))
                    bm25_rank.append(eid)
            path_rank: list[str] = []
            if paths:
                conds = " OR ".join("EXISTS (SELECT 1 FROM json_each(d.files) WHERE value = ?)" for _ in paths)
                rows = db.execute(
                    f"SELECT d.episode_id, d.text, d.summary, d.started_at FROM builtin_docs d"
                    f" WHERE d.scope IN ({marks}) AND ({conds})"
                    f" ORDER BY d.started_at DESC, d.episode_id LIMIT {CANDIDATES}",
                    [*scopes, *paths],
                ).fetchall()
                for eid, text, summary, started in rows:
                    hits.setdefault(eid, Hit(eid, text, summary, started, 0.0))
                    path_rank.append(eid)
            return bm25_rank, path_rank, hits

        bm25_rank, path_rank, hits = await self.store.read(read)
        fused = rrf([r for r in (bm25_rank, path_rank) if r])
        order = sorted(fused, key=lambda eid: (-fused[eid], _neg(hits[eid].started_at), eid))[:limit]
        items = [{"id": eid, "text": _item_text(hits[eid]), "score": round(fused[eid], 9)} for eid in order]
        return {"items": items}

    # -- forget ---------------------------------------------------------------------------------
    async def forget(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["id"])

        def write(db: sqlite_utils.Database) -> bool:
            row = db.execute("SELECT doc_id FROM builtin_docs WHERE episode_id = ?", [episode_id]).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM builtin_fts WHERE rowid = ?", [row[0]])
            db.execute("DELETE FROM builtin_docs WHERE doc_id = ?", [row[0]])
            return True

        return {"forgotten": await self.store.write(write)}

    def contract(self) -> dict[str, Any]:
        return {"contract": CONTRACT_VERSION, "provider": {"name": self.name, "version": __version__}}

    # -- MCP ------------------------------------------------------------------------------------
    def server(self) -> Server[Any]:
        """The MCP server exposing the four contract tools."""

        async def list_tools(ctx: Any, params: Any) -> t.ListToolsResult:
            return t.ListToolsResult(tools=TOOLS)

        async def call_tool(ctx: Any, params: t.CallToolRequestParams) -> t.CallToolResult:
            args = dict(params.arguments or {})
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
                    return t.CallToolResult(content=[t.TextContent(type="text", text=f"unknown tool {other}")], is_error=True)
            return t.CallToolResult(content=[t.TextContent(type="text", text=json.dumps(out))], structured_content=out)

        return Server("memactors-builtin", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


def _neg(started_at: str) -> tuple[int, ...]:
    """Sort key for 'newest first' on ISO strings."""
    return tuple(-ord(c) for c in started_at)


def _item_text(hit: Hit) -> str:
    text = hit.text if not hit.summary else f"summary: {hit.summary}\n{hit.text}"
    return text[:MAX_ITEM_TEXT]
