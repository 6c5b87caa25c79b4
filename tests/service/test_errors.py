"""SPEC-0030 "Error Handling Standards": provider failures are attributable, queued, never swallowed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from loguru import logger

from memactors import errors
from memactors.service import open_memory_service
from support import LogRecords, example, wait_ready


def _zep(tmp_path: Path, control: Path) -> str:
    args = ["-m", "memactors.testing.fault_provider", "--control", str(control)]
    return (f'[memory]\nprovider = "zep"\n[mcp.zep]\ncommand = "{sys.executable}"\n'
            f"args = {args!r}\n".replace("'", '"'))


@pytest.mark.errors
async def test_a_provider_error_is_attributable(tmp_path: Path, make_holder) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "modes"
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), format="{message} {extra}", level="DEBUG")
    try:
        async with open_memory_service(make_holder(_zep(tmp_path, control))) as memory:
            await wait_ready(memory)
            await trio.Path(control).write_text("error")
            result = await memory.ingest_run(example("run-42-api-fixer.json"))
            status = await memory.status()
    finally:
        logger.remove(sink)
    episode_id = result["episode_id"]
    assert result["outcome"] == "queued"
    assert status["pending"]["records"] == 1  # queued for retry, not lost
    failures = [line for line in lines if line.startswith("episode record failed")]
    assert failures, lines
    assert "'provider': 'zep'" in failures[0]
    assert f"'episode': '{episode_id}'" in failures[0]
    assert "failed on purpose" in failures[0]  # the provider's (redacted) message
    assert "TestLedgerReconcile" not in "\n".join(lines)  # no episode body in logs


def test_the_sentinels_exist_with_a_docstring_each() -> None:
    for name in ("ProviderUnavailable", "ProviderIncompatible", "ProviderReserved", "UnknownEpisode",
                 "NotAttributed", "NoRepository"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.MemactorsError)
        assert (cls.__doc__ or "").startswith("Raised when")
    wrapped = errors.ProviderUnavailable("record failed", provider="zep", episode="ep_1")
    assert str(wrapped) == "record failed (episode=ep_1 provider=zep)"


@pytest.mark.errors
async def test_a_provider_timeout_names_the_provider_the_operation_and_the_deadline(  # type: ignore[no-untyped-def]
        tmp_path: Path, make_holder) -> None:
    """A provider that does not answer was logged `error=TooSlowError detail=""`. The record's
    line and a degraded recall's line now name the provider, the tool and the deadline."""
    control = tmp_path / "modes"
    records: list[dict[str, object]] = []
    sink = logger.add(lambda m: records.append({"message": m.record["message"], **m.record["extra"]}), level="DEBUG")
    toml = _zep(tmp_path, control) + '[memory.episodes]\nprovider_timeout = "0.5s"\nsummary = false\n'
    try:
        async with open_memory_service(make_holder(toml)) as memory:
            await wait_ready(memory)
            await trio.Path(control).write_text("hang")  # every call but memory_contract never returns
            result = await memory.ingest_run(example("run-42-api-fixer.json"))
            answer = await memory.recall(query="ledger", repo="forge.example/acme/api", limit=5)
    finally:
        logger.remove(sink)
    assert result["outcome"] == "queued" and answer["degraded"] == "provider_unavailable"
    [record] = [r for r in records if r["message"] == "episode record failed"]
    assert record["provider"] == "zep" and record["op"] == "memory_record_episode"
    assert record["error"] == "ProviderTimeout"
    assert record["detail"] == "memory_record_episode did not answer within 5s (deadline_s=5 operation=" \
                               "memory_record_episode provider=zep)"
    [degraded] = [r for r in records if r["message"] == "episodes degraded: provider unavailable"]
    assert degraded["provider"] == "zep" and degraded["op"] == "memory_recall"
    assert degraded["error"] == "ProviderTimeout" and "memory_recall did not answer within 0.5s" in str(
        degraded["detail"])


@pytest.mark.errors
async def test_a_timed_out_operator_forget_names_memory_forget_the_provider_and_its_deadline(  # type: ignore[no-untyped-def]
        tmp_path: Path, make_holder) -> None:
    """An operator's forget waits one provider_timeout for the provider, then leaves the forget to the
    retry loop. That wait ending said nothing; it now logs a line naming the tool, the provider and the
    deadline, as a record's and a recall's timeouts do."""
    control = tmp_path / "modes"
    toml = _zep(tmp_path, control) + '[memory.episodes]\nprovider_timeout = "0.5s"\nsummary = false\n'
    with LogRecords() as logs:
        async with open_memory_service(make_holder(toml)) as memory:
            await wait_ready(memory)
            result = await memory.ingest_run(example("run-42-api-fixer.json"))
            assert result["outcome"] == "recorded"
            await trio.Path(control).write_text("hang_forget")
            outcome = await memory.forget(result["episode_id"])
    assert outcome["pending"] == 1  # left to the retry loop, not lost
    [line] = [r for r in logs.matching("forget failed", "WARNING") if r["extra"].get("error") == "ProviderTimeout"]
    extra = line["extra"]
    assert (extra["provider"], extra["op"], extra["episode"]) == ("zep", "memory_forget", result["episode_id"])
    assert "memory_forget did not answer within 0.5s" in extra["detail"]


@pytest.mark.errors
async def test_a_provider_error_names_the_provider_and_the_operation_in_every_line(  # type: ignore[no-untyped-def]
        tmp_path: Path, make_holder) -> None:
    """Every provider error added a `handler failed actor=provider_session message_type=ProviderCall`
    line naming neither the provider nor the tool. Each line now names both."""
    control = tmp_path / "modes"
    with LogRecords() as logs:
        async with open_memory_service(make_holder(_zep(tmp_path, control))) as memory:
            await wait_ready(memory)
            await trio.Path(control).write_text("error")
            await memory.ingest_run(example("run-42-api-fixer.json"))
            answer = await memory.recall(query="ledger", repo="forge.example/acme/api", limit=5)
    assert answer["degraded"] == "provider_unavailable"
    failed = [r["extra"] for r in logs.matching("handler failed") if r["extra"]["actor"] == "provider_session"]
    assert failed, logs.records
    assert all(e["provider"] == "zep" for e in failed)
    assert {e["op"] for e in failed} == {"memory_record_episode", "memory_recall"}


@pytest.mark.errors
async def test_a_failed_summary_names_its_episode(make_holder) -> None:  # type: ignore[no-untyped-def]
    """REQ-7: a utility model that fails leaves the episode without a summary; the line saying so names
    the episode."""
    from memactors.testing.fake_model_api import FakeBehaviour, run_fake_model_api

    async with run_fake_model_api(behaviour=FakeBehaviour(chat_status=500)) as fake:
        toml = f'[model_api]\nbase_url = "{fake.base_url}"\nutility_model = "u"\n'
        with LogRecords() as logs:
            async with open_memory_service(make_holder(toml)) as memory:
                await wait_ready(memory)
                result = await memory.ingest_run(example("run-42-api-fixer.json"))
    [line] = [r["extra"] for r in logs.matching("episode summary") if r["extra"].get("outcome") == "fallback"]
    assert line["episode"] == result["episode_id"] and line["reason"] == "error"


@pytest.mark.errors
async def test_many_queued_records_failing_the_same_way_log_one_line_per_interval_with_the_count(  # type: ignore[no-untyped-def]
        tmp_path: Path, make_holder, trio_clock: trio.testing.MockClock) -> None:
    """During a store failover the retention loop logged one WARNING per queued record per retry
    (6,580 lines in 29 s). A failure repeated by many records is one line per RETRY_LOG_SECONDS of trio
    time, the next one carrying how many were folded into it."""
    from memactors.actors.retention import RETRY_LOG_SECONDS

    control = tmp_path / "modes"
    records: list[dict[str, object]] = []
    sink = logger.add(lambda m: records.append({"message": m.record["message"], **m.record["extra"]}), level="DEBUG")
    try:
        async with open_memory_service(make_holder(_zep(tmp_path, control))) as memory:
            await wait_ready(memory)
            await trio.Path(control).write_text("error")
            trio_clock.rate = 0.0  # trio time stands still while 12 records fail: one interval
            for n in range(12):
                result = await memory.ingest_run({**example("run-42-api-fixer.json"), "run_id": f"r{n}"})
                assert result["outcome"] == "queued"
            first = [r for r in records if r["message"] == "episode record failed"]
            trio_clock.jump(RETRY_LOG_SECONDS)
            await memory.ingest_run({**example("run-42-api-fixer.json"), "run_id": "after"})
            trio_clock.rate = 1.0
    finally:
        logger.remove(sink)
    kinds = [(r["error"], r["state"]) for r in first]
    # One line per kind of failure (the provider's error, then its breaker open), not one per record.
    assert len(kinds) == len(set(kinds)) <= 2, kinds
    later = [r for r in records if r["message"] == "episode record failed"][len(first):]
    assert len(later) == 1 and int(later[0]["suppressed"]) >= 1, later  # type: ignore[call-overload]
