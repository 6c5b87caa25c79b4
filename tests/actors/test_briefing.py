"""Briefing composition (REQ-14), the per-run cache (REQ-15) and exposure (REQ-17).

The out-of-range cap scenario lives with the config tests: tests/config/test_config.py::test_req14_out_of_range_cap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from memactors.config import ConfigHolder
from memactors.errors import NotAttributed
from memactors.service import MemoryService, open_memory_service
from memactors.wrapper import BRIEFING_MAX_BYTES
from support import refuse_inserts, run_record, wait_ready
from support_readside import API, as_run, count, fault_toml, fixed_clock, sample

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike (issue 19)

HARNESS = '[harness.api-fixer]\nharness = "claude-code"\n'
BRIEFINGS = "harness_memory_briefings_total"


@pytest.fixture
async def fixed(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    """The built-in provider, a configured api-fixer harness, and a wall clock fixed at NOW."""
    async with open_memory_service(make_holder(HARNESS), wall_clock=fixed_clock) as service:
        await wait_ready(service)
        yield service


async def populate(service: MemoryService, *, facts: int = 20, runs: int = 5, others: int = 3) -> None:
    for i in range(runs):
        await service.ingest_run(run_record(
            run_id=f"r{i}", trace_id=f"t{i}", started_at=f"2026-11-2{i}T09:00:00Z",
            ended_at=f"2026-11-2{i}T09:10:00Z", result_text=f"api-fixer main ledger run {i}",
            sessions=[{"session_id": "s", "cwd": "/srv/api", "repo": API, "git_branch": "main"}],
            # an edit: a run that only answered one short line is trivial and takes no briefing slot
            events=[{"kind": "edit", "session_id": "s", "at": f"2026-11-2{i}T09:05:00Z", "path": f"src/ledger{i}.py"}]))
    for i in range(facts):
        await service.add_fact(scope=f"project:{API}", text=f"fact number {i:02d} about the ledger",
                               confidence=round(0.3 + i / 40, 3))
    for i in range(others):
        await service.report_presence(harness=f"other-{i}", run_id=f"o{i}", session_id="s", repo=API,
                                      branch="main", paths=(f"pkg/{i}",), ttl_seconds=3600)


def names(answer_json: dict) -> list[str]:
    return [s["name"] for s in answer_json["sections"]]


def items(answer_json: dict, name: str) -> list[dict]:
    return next(s for s in answer_json["sections"] if s["name"] == name)["items"]


@pytest.mark.req14
async def test_req14_sections_keep_their_order_and_bounds(fixed: MemoryService) -> None:
    await populate(fixed)
    _, view = await as_run(fixed, "api-fixer", "100", API)
    answer = await fixed.agent_briefing(view, delivery="tool")
    assert names(answer.json) == ["collisions", "recent_runs", "facts", "episodes"]
    assert len(answer.text) <= 2000 and answer.nbytes <= BRIEFING_MAX_BYTES
    assert [c["provenance"]["harness"] for c in items(answer.json, "collisions")] == ["other-0", "other-1", "other-2"]
    runs = next(s for s in answer.json["sections"] if s["name"] == "recent_runs")
    shown = [r["provenance"]["run"] for r in runs["items"]]
    # Newest first, each with its gist, none the episodes section shows already (issue 38).
    # (An episode the section picked but dropped to fit is not repeated either.)
    in_episodes = {e["provenance"]["run"] for e in items(answer.json, "episodes")}
    assert shown and shown == sorted(shown, reverse=True) and not set(shown) & in_episodes
    assert len(shown) + runs["dropped"] + len(in_episodes) <= 5
    assert all(r["text"].startswith("api-fixer main ledger run ") for r in runs["items"])
    facts = next(s for s in answer.json["sections"] if s["name"] == "facts")
    assert 0 < len(facts["items"]) <= 8 and facts["dropped"] == 20 - len(facts["items"])
    assert f"({facts['dropped']} more not shown; use the recall tool for more)" in answer.text
    # Top live facts by confidence: the highest-numbered facts first.
    assert facts["items"][0]["text"] == "fact number 19 about the ledger"
    positions = [answer.text.index(f"## {n}") for n in ("collisions", "recent_runs", "facts", "episodes")]
    assert positions == sorted(positions)


@pytest.mark.req14
async def test_req14_a_small_cap_drops_items_whole(make_holder: Callable[[str], ConfigHolder]) -> None:
    async with open_memory_service(make_holder(HARNESS + "briefing_max_chars = 500\n"),
                                   wall_clock=fixed_clock) as service:
        await wait_ready(service)
        await populate(service)
        _, view = await as_run(service, "api-fixer", "100", API)
        answer = await service.agent_briefing(view, delivery="tool")
        assert len(answer.text) <= 500
        for s in answer.json["sections"]:
            for it in s["items"]:
                assert it["text"] in answer.text  # whole, never cut


@pytest.mark.req14
async def test_req14_deterministic_without_the_provider(
        tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    async with open_memory_service(make_holder(fault_toml(tmp_path, "error") + HARNESS),
                                   wall_clock=fixed_clock) as service:
        await wait_ready(service, "down")
        await populate(service)
        first = await service.get_briefing("api-fixer")
        second = await service.get_briefing("api-fixer")
        assert first["document"] == second["document"] != ""
        assert first["degraded"] == "provider_unavailable"
        assert "## episodes (provider_unavailable)" in first["document"]
        # The run-facing path computes the same bytes (refresh recomputes, still identical).
        _, view = await as_run(service, "api-fixer", "100", API)
        a = await service.agent_briefing(view, delivery="tool", refresh=True)
        b = await service.agent_briefing(view, delivery="tool", refresh=True)
        assert a.text == b.text


@pytest.mark.req14
async def test_req14_an_empty_briefing_outside_any_repository(fixed: MemoryService, tmp_path: Path) -> None:
    await populate(fixed)
    _, outside = await as_run(fixed, "api-fixer", "300", None, workdir=str(tmp_path))
    answer = await fixed.agent_briefing(outside, delivery="tool")
    assert answer.text == "" and answer.items == {"collisions": 0, "recent_runs": 0, "facts": 0, "episodes": 0}
    assert sample(fixed, BRIEFINGS, harness="api-fixer", delivery="tool", outcome="empty") == 1


@pytest.mark.req14
async def test_req14_every_section_empty_is_an_empty_briefing(fixed: MemoryService) -> None:
    _, view = await as_run(fixed, "api-fixer", "100", "forge.example/acme/quiet")
    assert (await fixed.agent_briefing(view, delivery="resource")).text == ""


@pytest.mark.req15
async def test_req15_a_runs_briefing_is_computed_once_and_refresh_recomputes(fixed: MemoryService) -> None:
    await populate(fixed, facts=2)
    _, view = await as_run(fixed, "api-fixer", "100", API)
    first = await fixed.agent_briefing(view, delivery="tool")
    await fixed.add_fact(scope=f"project:{API}", text="a brand new fact", confidence=1.0)
    again = await fixed.agent_briefing(view, delivery="resource")
    assert again.text == first.text and again.cached
    refreshed = await fixed.agent_briefing(view, delivery="tool", refresh=True)
    assert "a brand new fact" in refreshed.text
    assert (await fixed.agent_briefing(view, delivery="tool")).text == refreshed.text
    assert sample(fixed, BRIEFINGS, harness="api-fixer", delivery="tool", outcome="ok") == 3
    assert sample(fixed, "harness_memory_briefing_bytes", harness="api-fixer") == refreshed.nbytes


@pytest.mark.req15
async def test_req15_an_unattributed_caller_gets_not_attributed(fixed: MemoryService) -> None:
    with pytest.raises(NotAttributed):
        await fixed.agent_briefing(await fixed.caller_view(None), delivery="tool")


@pytest.mark.req17
async def test_req17_each_briefing_read_writes_exposure(fixed: MemoryService) -> None:
    await populate(fixed, facts=2)
    _, view = await as_run(fixed, "api-fixer", "100", API)
    answer = await fixed.agent_briefing(view, delivery="tool", call_id="7")
    await fixed.agent_briefing(view, delivery="resource", call_id="8")
    rows = await fixed.store.read(lambda db: db.execute(
        "SELECT surface, call_id, fact_id FROM exposures WHERE run_id = '100' ORDER BY id").fetchall())
    assert answer.exposed == 2
    assert sorted((s, c) for s, c, _ in rows) == [("briefing_resource", "8")] * 2 + [("briefing_tool", "7")] * 2
    assert {f for *_, f in rows} == set(answer.fact_ids)


@pytest.mark.req17
async def test_req17_a_preview_is_not_exposure(fixed: MemoryService) -> None:
    await populate(fixed, facts=3)
    preview = await fixed.get_briefing("api-fixer")
    assert "fact number 02" in preview["document"] and preview["items"]["facts"] == 3
    assert await count(fixed, "SELECT count(*) FROM exposures") == 0
    assert await count(fixed, "SELECT count(*) FROM briefings") == 0
    assert sample(fixed, BRIEFINGS, harness="api-fixer", delivery="tool", outcome="ok") == 0


@pytest.mark.req17
async def test_req17_facts_are_withheld_when_exposure_cannot_be_written(fixed: MemoryService) -> None:
    await populate(fixed, facts=3)
    refuse, allow = refuse_inserts(fixed.store.engine, "exposures", "disk full")
    await fixed.store.write(lambda db: db.execute(refuse))
    _, view = await as_run(fixed, "api-fixer", "100", API)
    briefing = await fixed.agent_briefing(view, delivery="tool")
    assert briefing.withheld and items(briefing.json, "facts") == [] and "fact number" not in briefing.text
    assert "(3 more not shown; use the recall tool for more)" in briefing.text
    recall = await fixed.agent_recall(view, query="ledger")
    assert recall.withheld and items(recall.json, "facts") == [] and "fact number" not in recall.text
    # The cached briefing still holds the facts; a later read that can write exposure serves them.
    await fixed.store.write(lambda db: db.execute(allow))
    assert "fact number" in (await fixed.agent_briefing(view, delivery="tool")).text


@pytest.mark.req14
async def test_req14_a_default_briefing_over_a_repository_with_matching_episodes_shows_episodes(
        fixed: MemoryService) -> None:
    """At the default briefing_max_chars = 2000 the built-in provider's compact items fit the episodes
    share (issue 10): episodes are shown, each whole, not only counted as not shown."""
    await populate(fixed, facts=2, others=1)
    _, view = await as_run(fixed, "api-fixer", "100", API)
    answer = await fixed.agent_briefing(view, delivery="tool")
    shown = items(answer.json, "episodes")
    assert shown, answer.text
    assert len(answer.text) <= 2000
    for it in shown:
        assert it["text"] in answer.text  # whole, never cut
        assert it["text"].startswith("api-fixer main ledger run ")  # the run's own words (issue 17's gist)


async def test_trivial_runs_take_no_briefing_slot_and_recent_runs_say_what_each_run_did(
        fixed: MemoryService) -> None:
    await populate(fixed, facts=0, runs=5, others=0)
    for i in range(3):  # newer than every informative run: a `claude -p "hello"` each
        await fixed.ingest_run(run_record(
            run_id=f"hello{i}", trace_id=f"h{i}", started_at=f"2026-11-28T1{i}:00:00Z",
            ended_at=f"2026-11-28T1{i}:00:05Z", result_text="Hello! How can I help you today?",
            sessions=[{"session_id": "s", "cwd": "/srv/api", "repo": API, "git_branch": "main"}]))
    _, view = await as_run(fixed, "api-fixer", "100", API)
    answer = await fixed.agent_briefing(view, delivery="tool")
    runs = items(answer.json, "recent_runs")
    episodes = items(answer.json, "episodes")
    shown = [i["provenance"]["run"] for i in (*runs, *episodes)]
    assert runs and episodes and not any(r.startswith("hello") for r in shown)
    assert len(shown) == len(set(shown))  # no section repeats another's item
    for run in runs:
        assert run["text"].startswith("api-fixer main ledger run ") and "src/ledger" in run["text"]
