"""An episode's gist (`gist.gist`) and the built-in provider's answer to a metadata-only query."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memactors.actors.index import text_belongs_body
from memactors.builtin import BuiltinProvider, metadata_only
from memactors.documents import gist
from memactors.store import Store
from memactors.tui import HarnessEntry, TuiState

A = "project:forge.example/acme/api"
_WORD = re.compile(r"[^\W_]+")

BODY = {
    "episode_id": "ep_1", "harness": "api-fixer", "adapter": "claude-code", "run_id": "42", "trace_id": "t",
    "model": "m", "repo": "forge.example/acme/api", "branch": "fix/flaky", "outcome": "failed",
    "reason": "verify_failed", "started_at": "2026-11-28T09:00:00Z", "duration_ms": 1, "cost_usd": None,
    "cost_source": "unknown", "files_touched": ["internal/ledger/reconcile.go", "internal/clock/clock.go"],
    "pull_request": None, "verify_failures": [{"error_class": "test_failure", "count": 2}],
    "result_excerpt": "Pinned the clock in the ledger reconcile test; TestLedgerReconcile still fails under -race. "
                      + "Looked at the rounding of cents in the invoice builder too. " * 6,
    "summary": None, "trust_class": "standard", "scope": A,
}


def test_the_gist_leads_with_the_runs_words_then_the_match_then_what_it_touched() -> None:
    import json

    text = gist(BODY, ["invoice"], 320)
    assert text.startswith("Pinned the clock in the ledger reconcile test; TestLedgerReconcile still fails")
    assert text.endswith("touched internal/ledger/reconcile.go, internal/clock/clock.go"
                         " · verify failures: test_failure ×2")
    assert len(text) <= 320 and "invoice" in text
    # Nothing the provenance line says, no field names, no escapes.
    for said in ("api-fixer", "fix/flaky", "failed", "42", "summary:", "result_excerpt", "trust_class", "\\n"):
        assert said not in text, said
    assert text_belongs_body(text, json.dumps(BODY))
    # The summary leads when there is one; the query's words found later come as a snippet.
    with_summary = gist({**BODY, "summary": "Clock pinned; reconcile still flaky."}, ["rounding"], 320)
    assert with_summary.startswith("Clock pinned; reconcile still flaky. · Pinned the clock") or \
        with_summary.startswith("Clock pinned; reconcile still flaky. …")
    assert "rounding" in with_summary
    # Narrow: the run's words come first and survive; what it touched gives way.
    assert gist(BODY, (), 80).startswith("Pinned the clock")
    assert gist({"files_touched": ["a.py"]}, (), 320) == "touched a.py"
    assert gist({}, (), 320) == ""


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=400),
       width=st.integers(0, 400), words=st.lists(st.sampled_from(["a", "ledger", "é", "x1"]), max_size=3))
def test_the_gist_only_ever_holds_the_episodes_own_words_within_its_width(text: str, width: int,
                                                                          words: list[str]) -> None:
    body = {"result_excerpt": text, "files_touched": ["src/a_b.py"], "verify_failures": [["lint", 3]]}
    out = gist(body, words, width)
    assert len(out) <= width
    allowed = set(_WORD.findall(f"{text} src/a_b.py lint 3 files_touched verify_failures".casefold()))
    assert set(_WORD.findall(out.casefold())) <= allowed


def test_the_tui_lists_each_recent_episode_with_its_gist() -> None:
    app = TuiState([HarnessEntry("api-fixer", "claude-code", True)])
    app.refreshed({"provider": "builtin", "state": "ready"}, {"episodes": [
        {"episode_id": "ep_1", "harness": "api-fixer", "run_id": "42", "outcome": "failed",
         "repo": "forge.example/acme/api", "branch": "fix/flaky", "started_at": "2026-11-28T09:00:00Z",
         # the row as ListEpisodes sends it: the gist and the files, never the episode body
         "gist": "Pinned the clock in the ledger reconcile test", "files": BODY["files_touched"], "files_total": 2}], "total": 1})
    lines = app.episode_lines()
    assert lines[0].startswith("2026-11-28 09:00  api-fixer  run 42  failed")
    assert lines[1].strip().startswith("Pinned the clock in the ledger reconcile test · "
                                       "touched internal/ledger/reconcile.go")


def _doc(eid: str, started: str, *, branch: str = "main", outcome: str = "succeeded", files: tuple[str, ...] = (),
         excerpt: str = "", harness: str = "api-fixer") -> dict:
    return {"episode_id": eid, "scope": A, "trust_class": "standard", "text": "", "episode": {
        **BODY, "episode_id": eid, "started_at": started, "branch": branch, "outcome": outcome, "harness": harness,
        "files_touched": list(files), "result_excerpt": excerpt, "verify_failures": []}}


@pytest.mark.req14
async def test_req14_a_metadata_only_query_is_ordered_by_what_helps_the_next_run(store: Store) -> None:
    """REQ-14's episode query (repository, branch, harness name) matches every episode's metadata alike;
    the built-in provider orders it by recency, this branch and failed-then-fixed, not by BM25's
    preference for the shortest text."""
    p = BuiltinProvider(store)
    long = "Reworked the reconcile loop and its retry budget across the ledger package " * 3
    await p.record(_doc("ep_typo", "2026-01-01T00:00:00Z", excerpt="fix typo", files=("README.md",)))
    await p.record(_doc("ep_old", "2026-10-01T00:00:00Z", excerpt=long, files=("ledger/a.go",)))
    await p.record(_doc("ep_fail", "2026-11-01T00:00:00Z", outcome="failed", excerpt=long, files=("ledger/r.go",)))
    await p.record(_doc("ep_fix", "2026-11-02T00:00:00Z", excerpt=long + " fixed", files=("ledger/r.go",)))
    await p.record(_doc("ep_other", "2026-11-03T00:00:00Z", branch="feat/x", excerpt=long, files=("x.go",)))
    await p.record(_doc("ep_new", "2026-11-04T00:00:00Z", excerpt=long, files=("ledger/b.go",)))
    await p.record(_doc("ep_empty", "2026-11-05T00:00:00Z"))  # no output, no edits: never picked
    query = "forge.example/acme/api main api-fixer"
    assert await store.read(lambda db: metadata_only(db, ["forge", "example", "acme", "api", "main", "api", "fixer"],
                                                     [A]))
    out = await p.recall({"query": query, "scope": [A], "limit": 3})
    ids = [i["id"] for i in out["items"]]
    assert ids == ["ep_fix", "ep_new", "ep_fail"]  # the fix of a failure, then the newest on main
    assert "ep_typo" not in ids and "ep_empty" not in ids and "ep_other" not in ids
    assert all(i["text"].startswith("Reworked the reconcile loop") for i in out["items"])
    # A word from what a run said makes it a real query again: BM25 (the typo run matches "typo"),
    # unless the query names the repository first, as REQ-14's does (a harness named `docs`).
    assert (await p.recall({"query": "typo " + query, "scope": [A], "limit": 3}))["items"][0]["id"] == "ep_typo"
    assert [i["id"] for i in (await p.recall({"query": query + " typo", "scope": [A], "limit": 3}))["items"]] == ids
    # A word no episode has (a new harness's name) still leaves it metadata-only.
    assert [i["id"] for i in (await p.recall(
        {"query": "forge.example/acme/api main brand-new-bot", "scope": [A], "limit": 3}))["items"]] == ids


@pytest.mark.req14
async def test_a_word_that_becomes_an_episodes_metadata_makes_the_query_metadata_only_at_the_next_recall(
        store: Store) -> None:
    """The built-in provider remembers which words a scope's metadata lacks (the probe that finds nothing
    is the dear one); an episode recorded since, whose harness is named by the word, is still seen: the
    same query turns from a text search into REQ-14's metadata-only order at once."""
    p = BuiltinProvider(store)
    await p.record(_doc("ep_a", "2026-01-01T00:00:00Z", excerpt="reconcile reconcile the reconcile loop",
                        files=("ledger/r.go",)))
    await p.record(_doc("ep_b", "2026-02-01T00:00:00Z", excerpt="Reworked the retry budget; reconcile once",
                        files=("ledger/b.go",)))
    first = await p.recall({"query": "reconcile", "scope": [A], "limit": 3})
    assert [i["id"] for i in first["items"]][0] == "ep_a"  # BM25: a word of what the runs said
    assert not await store.read(lambda db: metadata_only(db, ["reconcile"], [A]))
    await p.record(_doc("ep_c", "2026-03-01T00:00:00Z", excerpt="Bumped the linter config", files=("x.go",),
                        harness="reconcile"))
    assert await store.read(lambda db: metadata_only(db, ["reconcile"], [A]))
    again = await p.recall({"query": "reconcile", "scope": [A], "limit": 3})
    assert [i["id"] for i in again["items"]][0] == "ep_c"  # the harness's own run first, not BM25's best


def test_the_last_failure_class_that_fits_exactly_is_shown() -> None:
    """Room for ", …" is kept only while more are to come: a last piece that fits exactly is shown,
    for failures as for files (the two parts are one rule)."""
    from memactors.documents._gist import _failures_part, _files_part

    assert _failures_part([("test_failure", 2)], len("verify failures: test_failure ×2")) == \
        "verify failures: test_failure ×2"
    assert _files_part(["src/ledger/reconcile.py"], 31) == "touched src/ledger/reconcile.py"
    assert _failures_part([("lint", 1), ("test_failure", 2)], 30) == "verify failures: lint, …"
