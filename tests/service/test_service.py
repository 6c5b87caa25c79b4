"""The thin path through the embedded service: ingest → episode → built-in provider → recall."""

from __future__ import annotations

import pytest

from memactors.errors import InvalidArgument, UnknownEpisode
from memactors.service import MemoryService, open_memory_service
from support import example, run_record, wait_ready


@pytest.mark.req1
async def test_req1_the_default_needs_nothing(memory: MemoryService) -> None:
    """No [memory] table: the built-in provider records the episode in-process, no process started."""
    result = await memory.ingest_run(example("run-42-api-fixer.json"))
    assert result["outcome"] == "recorded"
    status = await memory.status()
    assert status["provider"] == "builtin"
    assert status["transport"] == "in-process"
    assert status["counts"]["indexed_ids"] == 1
    row = await memory.get_episode(result["episode_id"])
    assert [i["provider"] for i in row["index"]] == ["builtin"]


async def test_recall_finds_the_episode_in_its_repo_only(memory: MemoryService) -> None:
    for name in ("run-42-api-fixer.json", "run-7-billing-bot.json"):
        await memory.ingest_run(example(name))
    hit = await memory.recall(query="flaky ledger", repo="forge.example/acme/api")
    assert [i["harness"] for i in hit["episodes"]] == ["api-fixer"]
    assert hit["degraded"] is None
    miss = await memory.recall(query="flaky ledger", repo="forge.example/acme/billing")
    assert miss["episodes"] == []


async def test_ingesting_the_same_run_twice_is_idempotent(memory: MemoryService) -> None:
    first = await memory.ingest_run(example("run-42-api-fixer.json"))
    second = await memory.ingest_run(example("run-42-api-fixer.json"))
    assert second["episode_id"] == first["episode_id"]
    assert second["outcome"] == "duplicate"
    status = await memory.status()
    assert status["counts"]["episodes"] == 1
    assert status["counts"]["indexed_ids"] == 1


async def test_a_bad_record_is_rejected_naming_the_field_and_nothing_is_written(memory: MemoryService) -> None:
    bad = run_record()
    del bad["sessions"][0]["session_id"]
    with pytest.raises(InvalidArgument, match=r"sessions\[0\]\.session_id"):
        await memory.ingest_run(bad)
    with pytest.raises(InvalidArgument, match="started_at"):
        await memory.ingest_run(run_record(started_at="yesterday"))
    runs = await memory.store.read(lambda db: db.execute("SELECT count(*) FROM runs").fetchone()[0])
    assert runs == 0
    assert (await memory.list_episodes())["episodes"] == []


async def test_list_filters_by_harness_repo_and_since(memory: MemoryService) -> None:
    for name in ("run-42-api-fixer.json", "run-7-billing-bot.json", "run-9-pr-triage.json"):
        await memory.ingest_run(example(name))
    by_repo = await memory.list_episodes(repo="forge.example/acme/api")
    assert {e["harness"] for e in by_repo["episodes"]} == {"api-fixer", "pr-triage"}
    by_harness = await memory.list_episodes(harness="billing-bot")
    assert [e["run_id"] for e in by_harness["episodes"]] == ["7"]
    since = await memory.list_episodes(since="2026-11-29T00:00:00Z")
    assert {e["harness"] for e in since["episodes"]} == {"billing-bot", "pr-triage"}
    with pytest.raises(InvalidArgument, match="since"):
        await memory.list_episodes(since="last tuesday")


async def test_unknown_episode_is_not_found(memory: MemoryService) -> None:
    with pytest.raises(UnknownEpisode):
        await memory.get_episode("ep_00000000000000000000")


async def test_episodes_survive_a_restart(make_holder) -> None:  # type: ignore[no-untyped-def]
    holder = make_holder("")
    async with open_memory_service(holder) as service:
        await wait_ready(service)
        first = await service.ingest_run(example("run-42-api-fixer.json"))
    async with open_memory_service(holder) as service:
        await wait_ready(service)
        assert (await service.get_episode(first["episode_id"]))["episode"]["run_id"] == "42"
        hit = await service.recall(query="ledger", repo="forge.example/acme/api")
        assert [i["episode_id"] for i in hit["episodes"]] == [first["episode_id"]]


async def test_actor_queue_depths_are_exported(memory: MemoryService) -> None:
    text = memory.metrics.exposition().decode()
    for actor in ("provider_session", "index", "summary", "assembler", "retention", "briefing"):
        assert f'memactors_actor_queue_depth{{actor="{actor}"}} 0.0' in text
