"""Briefing composition (REQ-14), the per-run cache (REQ-15) and exposure (REQ-17).

The out-of-range cap scenario lives with the config tests: tests/config/test_config.py::test_req14_out_of_range_cap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memactors.config import ConfigHolder
from memactors.documents import BRIEFING_MAX_BYTES
from memactors.errors import NotAttributed
from memactors.service import MemoryService, open_memory_service
from support import refuse_inserts, run_record, wait_ready
from support_readside import API, as_run, count, fault_toml, fixed_clock, sample

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike

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
    # Newest first, each with its gist, none the episodes section shows already.
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
    share: episodes are shown, each whole, not only counted as not shown."""
    await populate(fixed, facts=2, others=1)
    _, view = await as_run(fixed, "api-fixer", "100", API)
    answer = await fixed.agent_briefing(view, delivery="tool")
    shown = items(answer.json, "episodes")
    assert shown, answer.text
    assert len(answer.text) <= 2000
    for it in shown:
        assert it["text"] in answer.text  # whole, never cut
        assert it["text"].startswith("api-fixer main ledger run ")  # the run's own words (its gist)


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


IMPORTED = HARNESS + '[harness.imported]\nharness = "claude-code"\n[harness.docs]\nharness = "codex"\n'


def commit(i: int) -> dict:
    """The i-th commit (0 = oldest, one a day from 2026-08-01) of a history, as `import git` records it
    (`cli.importing.commit_record`): a subject and a body, and its files. The older half is about the
    docs (what a harness named `docs` would match as words), the newer half about the ledger."""
    from types import SimpleNamespace

    from memactors.cli.importing import commit_record

    at = (datetime(2026, 8, 1, 9, 0, tzinfo=UTC) + timedelta(days=i)).isoformat().replace("+00:00", "Z")
    # (Each touches its own file: commits alike in words and files are one fact, shown once.)
    topic = ("Update the docs for release", f"docs/guide{i}.md") if i < 60 else ("Fix the ledger rounding case",
                                                                               f"src/ledger{i}.py")
    message = (f"{topic[0]} {i} (#{1000 + i})\n\n* {topic[0]} {i}\n* Add a changelog entry and the tests that"
               f" show it, with a paragraph of why the change is right and how it was checked by hand\n")
    repo = SimpleNamespace(root="/srv/api", key=API, branch="main")
    return commit_record(repo, "imported", f"{i:040x}", at, at, message, [topic[1], "CHANGELOG.md"])


async def test_a_briefing_on_an_imported_history_shows_two_of_the_newest_commits_by_their_subject(
        make_holder: Callable[[str], ConfigHolder]) -> None:
    """After `import git` a briefing's episodes are the newest commits that have a subject and
    files, at least two of them at the default cap (placed whole: the built-in provider's briefing items
    are the subject line and the files), for the import's own harness and for a new harness whose name
    is a word of many old commits (`docs`: its briefing was a text search for "docs" that served the
    oldest commits)."""
    async with open_memory_service(make_holder(IMPORTED), wall_clock=fixed_clock) as service:
        await wait_ready(service)
        for i in range(120):
            await service.ingest_run(commit(i))
        newest = [f"git-{i:040x}" for i in reversed(range(120))]
        for harness in ("imported", "docs", "api-fixer"):
            _, view = await as_run(service, harness, f"b-{harness}", API)
            answer = await service.agent_briefing(view, delivery="tool")
            assert len(answer.text) <= 2000
            episodes = items(answer.json, "episodes")
            assert len(episodes) >= 2, answer.text
            for e in episodes:
                assert e["provenance"]["run"] in newest[:50], (harness, e["provenance"]["run"])
                assert e["text"].startswith("Fix the ledger rounding case"), e["text"]
                assert "changelog entry" not in e["text"] and "src/ledger" in e["text"]  # subject, files
            runs = items(answer.json, "recent_runs")
            assert runs and all(r["text"].startswith("Fix the ledger rounding case") for r in runs)
            shown = [i["provenance"]["run"] for i in (*runs, *episodes)]
            assert len(shown) == len(set(shown))  # no section repeats another's item


async def test_a_briefing_places_the_episodes_that_fit_whole_after_one_too_long(
        make_holder: Callable[[str], ConfigHolder]) -> None:
    """REQ-14 places an episode whole or not at all; when the provider's first candidates are
    too long for the share left (a long harness name, a long run id), the briefing looks further down
    the candidates for ones that fit, rather than showing one episode and counting the rest."""
    harness = "payments-reconciliation-nightly-fixer"
    async with open_memory_service(make_holder(f'[harness.{harness}]\nharness = "claude-code"\n'),
                                   wall_clock=fixed_clock) as service:
        await wait_ready(service)
        long = "Rework the reconciliation of settlement batches against the processor's payout report"
        for i, (text, path) in enumerate([("Fix it (#1)", "a.py"), ("Fix it again (#2)", "b.py"),
                                          (long, "src/payments/reconciliation/settlement_batches.py"),
                                          (long + " twice", "src/payments/reconciliation/payout_reports.py"),
                                          (long + " thrice", "src/payments/reconciliation/processor_fees.py")]):
            await service.ingest_run(run_record(
                harness=harness, run_id=f"0193c9a2-7d4e-7f00-8000-00000000000{i}", trace_id=f"t{i}",
                started_at=f"2026-11-2{i}T09:00:00Z", ended_at=f"2026-11-2{i}T09:10:00Z", result_text=text,
                sessions=[{"session_id": "s", "cwd": "/srv/api", "repo": API, "git_branch": "main"}],
                events=[{"kind": "edit", "session_id": "s", "at": f"2026-11-2{i}T09:05:00Z", "path": path}]))
        _, view = await as_run(service, harness, "b-1", API)
        answer = await service.agent_briefing(view, delivery="tool")
        section = next(s for s in answer.json["sections"] if s["name"] == "episodes")
        assert len(section["items"]) >= 2, answer.text
        assert section["dropped"] >= 1 and "more not shown; use the recall tool for more" in answer.text
        assert {e["text"] for e in section["items"]} & {"Fix it again (#2) · touched b.py", "Fix it (#1) · touched a.py"}
