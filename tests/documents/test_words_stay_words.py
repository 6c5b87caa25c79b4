"""Words stay words. A carriage return between words is a space like LF and TAB (it was
removed: `"second\\tline\\rthird"` was stored `"second linethird"`), and a terminal escape sequence —
CSI, OSC, any other ESC sequence — goes whole (its ESC alone went: `"\\x1b[31mred"` left `"[31mred"`).

A property test over the assembly every ingest runs, recall through the gateway with a run token (a real
MCP client over streamable HTTP), and the migration that cleans what was stored before, on both engines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mcp.types as t
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memactors._wire import parse_run_record
from memactors.builtin import BuiltinProvider
from memactors.episode import SessionRepo, assemble, drop_escape_remnants
from memactors.redact import REDACTED, redact
from memactors.service import MemoryService
from memactors.store import scope_key
from memactors.store.engines import open_store
from support import run_record
from support_readside import API, as_run, gateway_client

pytestmark = pytest.mark.both_engines

A = f"project:{API}"

#: What may stand between two words: line breaks and tabs, alone or in runs, with spaces.
BREAKS = (" ", "\t", "\n", "\r", "\r\n", "\n\r", " \r ", "\t\r\n", "\u2028", "\u2029")
#: Terminal escape sequences as agent CLIs print them: SGR colours, erase, cursor, titles and
#: hyperlinks (OSC ended by BEL or ST), charset designation, save/restore cursor, 8-bit CSI.
ESCAPES = ("\x1b[31m", "\x1b[0m", "\x1b[m", "\x1b[1;32m", "\x1b[38;5;208m", "\x1b[2K", "\x1b[K", "\x1b[1A",
           "\x1b[?25l", "\x1b]0;build: ok\x07", "\x1b]8;;https://forge.example/x\x1b\\", "\x1b(B", "\x1b7",
           "\x1b8", "\x9b1m", "\x1bc")

words = st.lists(st.from_regex(r"[A-Za-z0-9_é]{1,12}", fullmatch=True), min_size=1, max_size=12)


@st.composite
def terminal_text(draw: st.DrawFn) -> tuple[list[str], str]:
    """Words, and a text of them as a terminal would have it: each word wrapped in any escape
    sequences, a line break or tab (or a space) between each two."""
    ws = draw(words)
    parts = []
    for i, w in enumerate(ws):
        before = "".join(draw(st.lists(st.sampled_from(ESCAPES), max_size=2)))
        after = "".join(draw(st.lists(st.sampled_from(ESCAPES), max_size=2)))
        parts.append(before + w + after)
        if i < len(ws) - 1:
            parts.append(draw(st.sampled_from(BREAKS)))
    return ws, "".join(parts)


def assembled_excerpt(result_text: str) -> str:
    rec = parse_run_record(run_record(result_text=result_text))
    sessions = {s.session_id: SessionRepo(key=API, cwd=s.cwd) for s in rec.sessions}
    return assemble(rec, sessions, excerpt_chars=4000).result_excerpt


@pytest.mark.req6
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=terminal_text())
def test_words_between_breaks_and_escape_sequences_stay_the_same_words(case: tuple[list[str], str]) -> None:
    """Whatever escape sequences wrap the words and whichever breaks stand between them, the stored
    excerpt is the words, one space apart: none joined, none with a remnant of a sequence."""
    ws, text = case
    excerpt = assembled_excerpt(text)
    assert excerpt == " ".join(ws), (text, excerpt)


def test_line_breaks_tabs_and_a_colour_escape_leave_the_words_one_space_apart() -> None:
    assert assembled_excerpt("first\nsecond\tline\rthird") == "first second line third"
    assert assembled_excerpt("\x1b[31mred\x1b[0m alert") == "red alert"


@pytest.mark.req6
def test_an_escape_inside_a_secret_cannot_hide_it() -> None:
    """An escape sequence goes with the printable characters after its ESC; a secret with an ESC (or an
    8-bit CSI) inside, which the redactor found when it removed the control character alone, is still
    found (its second reading) and replaced."""
    token = "gh" + "p_" + "Idg53Z131ckMzKyTs2mPLn6YYc8kkswFm9il"
    for hidden in (token[:10] + "\x1b" + token[10:], token[:8] + "\x1b" + token[8:], token[:9] + "\x9b" + token[9:]):
        out = redact(f"pushed {hidden} ok")
        assert REDACTED in out and token[12:20] not in out, out


def text_of(result: t.CallToolResult) -> str:
    assert not result.is_error, result
    return "".join(c.text for c in result.content if isinstance(c, t.TextContent))


@pytest.mark.req6
@pytest.mark.req12
async def test_recall_finds_words_after_a_carriage_return_and_inside_colours_through_the_gateway(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    await service.ingest_run(run_record(
        run_id="250", result_text="first\nsecond\tline\rthird \x1b[31mred\x1b[0m \x1b]0;title\x07done",
        events=[{"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z", "path": "src/colour.py"}]))
    await service.ingest_run(run_record(run_id="251", result_text="Bump the version"))
    token, _ = await as_run(service, "api-fixer", "900", API)
    found = {}
    async with gateway_client(url, token) as client:
        for word in ("third", "red", "linethird", "31mred"):
            found[word] = re.findall(r"^- episode .* run (\w+)", text_of(
                await client.call_tool("recall", {"query": word})), re.M)
    assert found["third"] == ["250"] and found["red"] == ["250"], found
    assert found["linethird"] == [] and found["31mred"] == [], found  # no joined word, no remnant
    eid = await service.store.read(lambda db: db.execute(
        "SELECT episode_id FROM episodes WHERE run_id = '250'").fetchone()[0])
    assert (await service.get_episode(eid))["episode"]["result_excerpt"] == "first second line third red done"


def test_only_what_escape_sequences_left_is_dropped() -> None:
    assert drop_escape_remnants("[31mred[0m done") == "red done"
    assert drop_escape_remnants("bell [1;32m ok[m") == "bell ok"
    assert drop_escape_remnants("x[2K y [?25l") == "x y"
    for kept in ("took [10ms]", "run [mypy] now", "[mkdir", "regex [A-Z]", "a [K] b", "arr[0]", "see [1]"):
        assert drop_escape_remnants(kept) == kept


async def test_the_migration_cleans_stored_bodies_and_reindexes_the_builtin_documents(
        tmp_path: Path, store_url: str | None, engine: str) -> None:
    """A store written before words stayed words (an escape sequence's remnant in a body and in its document):
    the migration (SQLite 0012, PostgreSQL 0005) rewrites both and recall finds the word."""
    target = store_url or tmp_path / "m.db"
    store = await open_store(target)
    p = BuiltinProvider(store)
    old = "Pinned the clock [31mred[0m flake gone"
    body: dict[str, Any] = {"episode_id": "ep_old", "result_excerpt": old, "summary": None,
                            "verify_failures": [{"error_class": "[1mtest_failure", "count": 1}]}
    await p.record({"episode_id": "ep_old", "scope": A, "trust_class": "standard", "text": "",
                    "episode": {**body, "harness": "api-fixer", "branch": "main", "started_at": "2026-11-01T00:00:00Z",
                                "files_touched": ["src/clock.py"]}})

    def seed(db: Any) -> None:
        db.execute("INSERT INTO episode_bodies (id, body) VALUES (?, ?)", [424242, json.dumps(body)])
        marks = "memactors_migrations" if engine == "postgresql" else "_sqlite_migrations"
        name = "0005_words_stay_words" if engine == "postgresql" else "0012_words_stay_words"
        db.execute(f"DELETE FROM {marks} WHERE name = ?", [name])
    await store.write(seed)
    assert (await p.recall({"query": "red", "scope": [A], "limit": 5}))["items"] == []  # "31mred" is the word
    store.close()
    reopened = await open_store(target)
    try:
        stored = await reopened.read(lambda db: db.execute(
            "SELECT body FROM episode_bodies WHERE id = 424242").fetchone()[0])
        assert json.loads(stored)["result_excerpt"] == "Pinned the clock red flake gone"
        assert json.loads(stored)["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
        q = BuiltinProvider(reopened)
        out = await q.recall({"query": "red", "scope": [A], "limit": 5})
        assert [i["id"] for i in out["items"]] == ["ep_old"]
        assert out["items"][0]["text"].startswith("Pinned the clock red flake gone")
        row = await reopened.read(lambda db: db.execute(
            "SELECT title, excerpt, scope_key FROM builtin_docs WHERE episode_id = 'ep_old'").fetchone()
            if engine == "sqlite" else db.execute(
            "SELECT title, excerpt, scope FROM builtin_docs WHERE episode_id = 'ep_old'").fetchone())
        assert row[0] == row[1] == "Pinned the clock red flake gone"
        assert engine != "sqlite" or row[2] == scope_key(A)
    finally:
        reopened.close()
