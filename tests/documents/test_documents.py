"""The briefing actor's document rules, as pure code: near-duplicate facts, the briefing's
one-line episode provenance, and what makes a run empty. The surfaces are in test_briefing_episodes.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memactors.actors.index import KeptItem, Provenance
from memactors.documents import age, briefing_episode_item, collapse_facts, fact_item, is_empty_run
from memactors.store.facts import Fact

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
TZ_FACT = "The ledger tests need TZ=UTC and a fixed clock; run them with make test-ledger before every push"


def fact(i: int, text: str, confidence: float) -> Fact:
    return Fact(f"f_{i:02d}", "project:forge.example/acme/api", text, confidence, "live",
                      "2026-11-01T00:00:00Z", "2026-11-01T00:00:00Z")


def test_near_duplicate_facts_collapse_into_the_highest_confidence_one() -> None:
    facts = [
        fact(1, TZ_FACT, 0.70),
        fact(2, "Webhook deliveries retry five times with jitter before they are marked dead", 0.65),
        fact(3, TZ_FACT.replace("every push", "every single push"), 0.90),  # one word more
        fact(4, TZ_FACT.lower() + ".", 0.80),  # case and punctuation do not count
        fact(5, TZ_FACT.replace("make test-ledger before every push", "pytest -p no:randomly in CI"), 0.95),
        fact(6, "Sessions are stored as JSON with a schema version; pickled ones are dropped", 0.60),
    ]
    shown = collapse_facts(facts, limit=8)
    # Facts 1, 3 and 4 are one: shown once, at fact 1's place, as the most confident (3), 2 counted.
    assert [(f.id, similar) for f, similar in shown] == [("f_03", 2), ("f_02", 0), ("f_05", 0), ("f_06", 0)]
    assert [f.id for f, _ in collapse_facts(facts, limit=2)] == ["f_03", "f_02"]
    assert collapse_facts(facts, limit=8) == shown  # deterministic


def test_distinct_short_facts_stay_apart() -> None:
    facts = [fact(i, f"fact number {i:02d} about the ledger", 0.5) for i in range(10)]
    assert [similar for _, similar in collapse_facts(facts, limit=8)] == [0] * 8


def test_a_collapsed_fact_says_how_many_it_stands_for() -> None:
    item = fact_item(fact(3, TZ_FACT, 0.9), similar=2)
    assert item.provenance.line().endswith(" · similar 2")
    assert "similar" not in fact_item(fact(3, TZ_FACT, 0.9)).provenance.line()


@pytest.mark.parametrize(("started", "expected"), [
    ("2026-12-01T11:59:30Z", "0m"), ("2026-12-01T11:20:00Z", "40m"), ("2026-12-01T07:00:00Z", "5h"),
    ("2026-11-29T13:00:00Z", "47h"), ("2026-11-29T12:00:00Z", "2d"), ("2025-12-01T12:00:00Z", "365d"),
    ("2026-12-02T00:00:00Z", "0m"), ("not a time", None), ("2026-12-01T11:00:00", None),
])
def test_age_is_one_short_token(started: str, expected: str | None) -> None:
    assert age(started, NOW) == expected


def test_a_briefing_episode_has_a_one_line_provenance_from_the_daemons_row() -> None:
    kept = KeptItem("ep_1", "Fix rounding of ledger totals. harness release-bot", 0.3, Provenance(
        episode_id="ep_00000000000000000001", run_id="r20261127T090000-a1b2c3", harness="api-fixer",
        adapter="claude-code", model="claude-x", repo="forge.example/acme/api", branch="main", outcome="failed",
        started_at="2026-11-27T09:00:00Z", scope="project:forge.example/acme/api", trust_class="agent"))
    item = briefing_episode_item(kept, NOW)
    assert item.provenance.line() == (
        "- episode · run r20261127T090000-a1b2c3 · harness api-fixer · outcome failed · age 4d")
    assert item.untrusted and item.text == kept.text


BODY = {"reason": "exit_nonzero", "result_excerpt": "", "summary": None, "files_touched": [],
        "verify_failures": []}


@pytest.mark.parametrize(("changes", "empty"), [
    ({}, True),
    ({"result_excerpt": "  \n "}, True),
    ({"reason": "launch_failed", "result_excerpt": "error: unknown option --fast"}, True),
    ({"result_excerpt": "Refused: the API key is missing."}, False),
    ({"summary": "Tried to fix the ledger."}, False),
    ({"files_touched": ["src/ledger/post.py"]}, False),
    ({"verify_failures": [{"error_class": "AssertionError", "count": 1}]}, False),
])
def test_an_empty_run_is_judged_from_the_stored_episode(changes: dict[str, object], empty: bool) -> None:
    assert is_empty_run({**BODY, **changes}) is empty
