"""Recall finds the words a run wrote, and items carry the run's gist.

Through the gateway with a run token (a real MCP client over streamable HTTP on 127.0.0.1), and on a
store written before migration 0009 (line breaks escaped as `\\n`, one rendering per document).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mcp.types as t
import pytest
import sqlean

from memactors.builtin import BuiltinProvider
from memactors.service import MemoryService
from memactors.store.engines import open_store
from support import run_record
from support_readside import API, as_run, gateway_client

A = f"project:{API}"


def text_of(result: t.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, t.TextContent))


def episode_items(document: str) -> list[tuple[str, str]]:
    """(provenance line, item text) of each episode item in a wrapper document."""
    nonce = re.match(r'<memory-data kind="\w+" nonce="([0-9a-f]{16})"', document).group(1)  # type: ignore[union-attr]
    out = []
    pattern = rf'(- episode [^\n]*)\n<item[^>]*>\n(.*?)\n</item nonce="{nonce}">'
    for m in re.finditer(pattern, document, re.S):
        out.append((m.group(1), m.group(2)))
    return out


@pytest.mark.req6
async def test_a_word_that_starts_a_line_is_found_by_a_one_word_recall_through_the_gateway(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    result_text = ("Rewrite the request introspector (#812)\n\nintrospector now reads the headers once.\r\n"
                   "\tmiddleware\tkeeps its order.")
    await service.ingest_run(run_record(run_id="812", result_text=result_text,
                                        events=[{"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z",
                                                 "path": "src/introspect.py"}]))
    await service.ingest_run(run_record(run_id="813", result_text="Bump the version"))
    token, _ = await as_run(service, "api-fixer", "900", API)
    async with gateway_client(url, token) as client:
        found = {}
        for word in ("introspector", "middleware", "keeps", "nintrospector"):
            found[word] = episode_items(text_of(await client.call_tool("recall", {"query": word})))
    for word in ("introspector", "middleware", "keeps"):
        assert len(found[word]) == 1, word
        provenance, text = found[word][0]
        assert "run 812" in provenance
        # The item leads with the run's own words, on one line, with no escapes and no field names.
        assert text.startswith("Rewrite the request introspector (#812) introspector now reads the headers once.")
        assert "\\n" not in text and "\n" not in text and "result_excerpt" not in text
        assert "touched src/introspect.py" in text
    assert found["nintrospector"] == []  # the escape is not indexed as part of a word any more
    view = await service.get_episode(re.search(r"episode (ep_\w+)", found["introspector"][0][0]).group(1))  # type: ignore[union-attr]
    assert view["episode"]["result_excerpt"] == ("Rewrite the request introspector (#812) introspector now reads the"
                                                 " headers once. middleware keeps its order.")
    assert "\\n" not in view["text"]


@pytest.mark.req11
@pytest.mark.req12
async def test_a_question_naming_only_a_module_finds_the_run_that_touched_it_through_the_gateway(
        served: tuple[MemoryService, str]) -> None:
    """What a run touched is indexed word by word — `httpx/_cookies.py` is `httpx`, `cookies`,
    `py` — so a question that shares no word with what the run said but names the module it changed
    ("the cookie jar") finds it; and with `paths` the path ranking is decisive: the newest
    runs that touched the path come first, whatever the question's words."""
    service, url = served

    def edit(path: str) -> dict[str, str]:
        return {"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z", "path": path}

    await service.ingest_run(run_record(run_id="701", result_text="Keep them across redirects (#701)",
                                        events=[edit("httpx/_cookies.py"), edit("tests/test_cookies.py")]))
    await service.ingest_run(run_record(run_id="702", result_text="Tidy the client's redirect handling",
                                        events=[edit("httpx/_client.py")]))
    for i in range(6):  # newer runs on the same client module, about something else
        await service.ingest_run(run_record(
            run_id=f"71{i}", result_text=f"Refactor transport selection, step {i}",
            started_at=f"2026-11-28T1{i}:00:00Z", ended_at=f"2026-11-28T1{i}:30:00Z",
            events=[edit("httpx/_client.py")]))
    token, _ = await as_run(service, "api-fixer", "901", API)
    async with gateway_client(url, token) as client:
        cookie = episode_items(text_of(await client.call_tool("recall", {"query": "the cookie jar", "limit": 3})))
        boosted = episode_items(text_of(await client.call_tool(
            "recall", {"query": "redirect handling", "paths": ["httpx/_client.py"], "limit": 3})))
    assert cookie and "run 701" in cookie[0][0], cookie
    assert cookie[0][1].startswith("Keep them across redirects (#701)")
    runs = [re.search(r"\brun (\w+)", provenance).group(1) for provenance, _ in boosted]  # type: ignore[union-attr]
    assert runs == ["715", "714", "713"], runs  # the path's newest runs (an earlier ranking led with 702)


#: A REQ-5 rendering as the daemon wrote it before migration 0009: line breaks escaped as `\n`.
_OLD_TEXT = (
    "episode_id: ep_old\nharness: api-fixer\nadapter: claude-code\nrun_id: 7\ntrace_id: t\nmodel: m\n"
    "repo: forge.example/acme/api\nbranch: fix/flaky\noutcome: failed\nreason: verify_failed\n"
    "started_at: 2026-11-01T00:00:00Z\nduration_ms: 1\ncost_usd: \ncost_source: unknown\n"
    "files_touched: internal/ledger/reconcile.go, internal/clock/clock.go\npull_request: \n"
    "verify_failures: test_failure: 2\n"
    "result_excerpt: Pinned the clock\\nreconcile still flakes under race\\\\detector\nsummary: \n"
    "trust_class: standard\nscope: project:forge.example/acme/api\n"
)


async def test_migration_0009_reindexes_an_existing_store(tmp_path: Path) -> None:
    """A store written before 0009: its episode bodies are flattened and the built-in provider's
    documents re-indexed from their stored renderings (escapes read as spaces), keeping doc ids."""
    path = tmp_path / "old.db"
    s = await open_store(path)
    s.close()
    db = sqlean.connect(str(path), isolation_level=None)
    db.executescript(
        """
        DROP TRIGGER builtin_docs_fts_insert; DROP TRIGGER builtin_docs_fts_delete;
        DROP TRIGGER builtin_docs_fts_update; DROP TABLE builtin_fts; DROP INDEX builtin_docs_by_scope_time;
        ALTER TABLE builtin_docs ADD COLUMN text TEXT NOT NULL DEFAULT '';
        ALTER TABLE builtin_docs DROP COLUMN title; ALTER TABLE builtin_docs DROP COLUMN excerpt;
        ALTER TABLE builtin_docs DROP COLUMN failures; ALTER TABLE builtin_docs DROP COLUMN meta;
        ALTER TABLE builtin_docs DROP COLUMN harness; ALTER TABLE builtin_docs DROP COLUMN branch;
        ALTER TABLE builtin_docs DROP COLUMN outcome;
        CREATE VIRTUAL TABLE builtin_fts USING fts5 (scope_key, text, summary, content = 'builtin_docs',
            content_rowid = 'doc_id', tokenize = 'porter unicode61');
        DELETE FROM _sqlite_migrations WHERE name = '0009_flat_text_and_builtin_fields';
        """)
    from memactors.store import scope_key
    doc_id = (1 << 32) | 1
    db.execute("INSERT INTO builtin_scopes (scope, num, next_seq) VALUES (?, 1, 2)", [A])
    db.execute("INSERT INTO builtin_docs (doc_id, episode_id, scope, scope_key, text, summary, files, started_at,"
               " content_hash) VALUES (?, 'ep_old', ?, ?, ?, '', ?, '2026-11-01T00:00:00Z', 'h')",
               [doc_id, A, scope_key(A), _OLD_TEXT,
                json.dumps(["internal/ledger/reconcile.go", "internal/clock/clock.go"])])
    db.execute("INSERT INTO builtin_fts (builtin_fts) VALUES ('rebuild')")
    body = {"episode_id": "ep_old", "result_excerpt": "Pinned the clock\nreconcile still flakes", "summary": None,
            "verify_failures": [{"error_class": "test\tfailure", "count": 2}]}
    db.execute("INSERT INTO episode_bodies (id, body) VALUES (1, ?)", [json.dumps(body)])
    # Before: the word after the escaped break is indexed as "nreconcile".
    assert db.execute("SELECT count(*) FROM builtin_fts WHERE builtin_fts MATCH 'nreconcile'").fetchone()[0] == 1
    db.close()

    s = await open_store(path)
    try:
        stored = json.loads(await s.read(lambda db: db.execute("SELECT body FROM episode_bodies").fetchone()[0]))
        assert stored["result_excerpt"] == "Pinned the clock reconcile still flakes"
        assert stored["verify_failures"] == [{"error_class": "test failure", "count": 2}]
        p = BuiltinProvider(s)
        out = await p.recall({"query": "reconcile", "scope": [A], "limit": 5})
        assert [i["id"] for i in out["items"]] == ["ep_old"]
        assert out["items"][0]["text"] == (
            "Pinned the clock reconcile still flakes under race\\detector · touched internal/ledger/reconcile.go,"
            " internal/clock/clock.go · verify failures: test_failure ×2")
        assert (await p.recall({"query": "nreconcile", "scope": [A], "limit": 5}))["items"] == []
        row = await s.read(lambda db: db.execute(
            "SELECT doc_id, title, harness, branch, outcome, meta FROM builtin_docs").fetchone())
        assert row[0] == doc_id and row[1].startswith("Pinned the clock reconcile")
        assert row[2:5] == ("api-fixer", "fix/flaky", "failed")
        assert "forge.example/acme/api" in row[5] and "verify_failed" in row[5]
    finally:
        s.close()
