"""SPEC-0030 REQ-10 and REQ-13 (record side): record retries, forgetting, the hourly retention prune."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from fix_providers import FaultFiles, ShiftableClock, fault_toml, poll, sample
from memactors.actors import retention as retention_module
from memactors.config import ConfigHolder
from memactors.errors import UnknownEpisode
from memactors.metrics import Metrics
from memactors.service import MemoryService, open_memory_service
from support import run_record, wait_ready, within

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike

REPO = "forge.example/acme/api"
UNREACHABLE = '[memory]\nprovider = "fault"\n[mcp.fault]\ncommand = "/nonexistent/memory-provider"\n'


def _run(n: int) -> dict[str, Any]:
    return run_record(run_id=str(n), trace_id=f"t-{n}", result_text=f"fixed ledger rounding number {n}",
                      started_at=f"2026-11-28T09:{n:02d}:00Z", ended_at=f"2026-11-28T09:{n:02d}:30Z")


async def _pending(memory: MemoryService) -> dict[str, int]:
    return (await memory.status())["pending"]


async def _body(memory: MemoryService, episode_id: str) -> tuple[Any, ...]:
    return await memory.store.read(lambda db: db.execute(
        "SELECT forgotten_at, body_id IS NULL FROM episodes WHERE episode_id = ?", [episode_id]).fetchone())


@pytest.mark.req13
@pytest.mark.slow
async def test_req13_record_retries_survive_a_daemon_restart(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    async with open_memory_service(make_holder(UNREACHABLE)) as memory:
        result = await memory.ingest_run(_run(1))
        assert result["outcome"] == "queued"
        assert (await _pending(memory))["records"] == 1
    files = FaultFiles(tmp_path / "fault")
    async with open_memory_service(make_holder(fault_toml(files))) as memory:
        async def indexed() -> bool:
            return (await memory.status())["counts"]["indexed_ids"] == 1

        await poll(indexed, what="the queued episode recorded after the restart")
        assert await _pending(memory) == {"records": 0, "forgets": 0, "record_failed": 0, "forget_failed": 0,
                                         "record_quarantined": 0}
    assert list(files.stored()) == [result["episode_id"]]


@pytest.mark.req13
async def test_req13_a_record_is_marked_record_failed_after_24_hours(
        make_holder: Callable[[str], ConfigHolder], autojump_clock: trio.testing.MockClock) -> None:
    """Retried while inside the 24-hour window, record_failed after it.

    Autojump moves virtual time on whenever every task waits, including while SQLite works in a
    thread, so when an attempt happens is not predictable here. What is checked is exact anyway: a row
    seen `failed` at a wall time inside the window would prove an early give-up (the mark precedes the
    look), and the row must end `failed` once the window has passed.
    """
    clock = ShiftableClock()
    metrics = Metrics()
    window = retention_module.RETRY_WINDOW
    async with open_memory_service(make_holder(UNREACHABLE), wall_clock=clock, metrics=metrics) as memory:
        assert (await memory.ingest_run(_run(1)))["outcome"] == "queued"
        # The window starts when the row was queued (its first_at), not when the ingest call returned:
        # autojump may move virtual time on while the store works in a thread (PostgreSQL: often).
        from memactors._wire import parse_time

        first = parse_time(await memory.store.read(
            lambda db: db.execute("SELECT first_at FROM pending WHERE kind = 'record'").fetchone()[0]))
        seen_pending_inside = False
        for _ in range(200):
            pending = await _pending(memory)
            if clock() - first < window:
                assert pending["record_failed"] == 0, "gave up inside the 24-hour window"
                seen_pending_inside |= pending["records"] == 1
            elif pending["record_failed"] == 1:
                break
            await trio.sleep(1800)
        assert seen_pending_inside
        assert await _pending(memory) == {"records": 0, "forgets": 0, "record_failed": 1, "forget_failed": 0,
                                          "record_quarantined": 0}
        attempts, error = await memory.store.read(
            lambda db: db.execute("SELECT attempts, last_error FROM pending").fetchone())
        assert attempts >= 2 and "ProviderUnavailable" in error
        assert sample(metrics, "harness_memory_pending", provider="fault", kind="record") == 0


@pytest.mark.req10
async def test_forgetting_with_the_builtin_provider_removes_it_everywhere(memory: MemoryService) -> None:
    result = await memory.ingest_run(_run(1))
    eid = result["episode_id"]
    assert [e["episode_id"] for e in (await memory.recall(query="ledger", repo=REPO))["episodes"]] == [eid]
    out = await memory.forget(eid)
    assert out["ids"] == 1 and out["forgotten"] == 1 and out["pending"] == 0 and out["body_deleted"]
    assert (await memory.recall(query="ledger", repo=REPO))["episodes"] == []
    forgotten_at, no_body = await _body(memory, eid)
    assert forgotten_at and no_body
    docs = await memory.store.read(lambda db: db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0])
    assert docs == 0
    # The body's and the run record's own rows are deleted (their pages are reused, no hole left in a
    # kept row); the run row stays, without its record, for the graph.
    left = await memory.store.read(lambda db: db.execute(
        "SELECT (SELECT count(*) FROM episode_bodies), (SELECT count(*) FROM run_records),"
        " (SELECT count(*) FROM runs WHERE record_id IS NULL)").fetchone())
    assert tuple(left) == (0, 0, 1)
    view = await memory.get_episode(eid)
    assert view["forgotten_at"] and "text" not in view and view["index"][0]["forgotten_at"]
    again = await memory.forget(eid)
    assert again["forgotten_at"] == out["forgotten_at"]
    with pytest.raises(UnknownEpisode):
        await memory.forget("ep_00000000000000000000")


@pytest.mark.req10
@pytest.mark.slow
async def test_req10_forget_holds_while_the_provider_is_down(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path, trio_clock: trio.testing.MockClock) -> None:
    files = FaultFiles(tmp_path / "fault")
    metrics = Metrics()
    async with open_memory_service(make_holder(fault_toml(files, provider_timeout="0.5s")), metrics=metrics) as memory:
        await wait_ready(memory)
        eid = (await memory.ingest_run(_run(1)))["episode_id"]
        assert [e["episode_id"] for e in (await memory.recall(query="ledger", repo=REPO))["episodes"]] == [eid]
        files.set_modes("hang_forget")  # memory_forget now times out; recall still answers
        out, _ = await within(trio_clock, 0.5, lambda: memory.forget(eid))  # answered within provider_timeout
        assert out["pending"] == 1 and out["forgotten"] == 0 and not out["body_deleted"]
        # The provider still holds and returns the episode; REQ-9 drops it as forgotten, at once.
        recall = await memory.recall(query="ledger", repo=REPO)
        assert recall["episodes"] == [] and recall["degraded"] is None
        assert eid in files.stored()
        assert sample(metrics, "harness_memory_results_dropped_total", provider="fault", reason="forgotten") == 1
        assert (await _pending(memory))["forgets"] == 1
        assert sample(metrics, "harness_memory_pending", provider="fault", kind="forget") == 1
        files.set_modes()  # the provider recovers: the retry completes the forget

        async def done() -> bool:
            return (await _pending(memory))["forgets"] == 0

        await poll(done, seconds=40, what="the forget retried to completion")
        assert eid not in files.stored()
        _, no_body = await _body(memory, eid)
        assert no_body, "the stored body goes once every id is forgotten"


@pytest.mark.req10
async def test_a_forget_that_keeps_failing_is_marked_forget_failed_after_24_hours(
        make_holder: Callable[[str], ConfigHolder], autojump_clock: trio.testing.MockClock) -> None:
    clock = ShiftableClock()
    async with open_memory_service(make_holder(UNREACHABLE), wall_clock=clock) as memory:
        eid = (await memory.ingest_run(_run(1)))["episode_id"]
        # As if an earlier record had succeeded: the provider holds one id, then goes away for good.
        await memory.store.write(lambda db: (db.execute(
            "INSERT INTO memory_index (provider, provider_id, episode_id, scope, recorded_at)"
            " VALUES ('fault', ?, ?, 'project:forge.example/acme/api', '2026-11-28T00:00:00Z')", [eid, eid]),
            db.execute("DELETE FROM pending")))
        out = await memory.forget(eid)
        assert out["ids"] == 1 and out["pending"] == 1 and not out["body_deleted"]
        await trio.sleep(12 * 3600)
        assert (await _pending(memory))["forgets"] == 1
        assert (await _body(memory, eid))[1] == 0, "the body stays while the forget is pending"
        for _ in range(48):
            if (await _pending(memory))["forgets"] == 0:
                break
            await trio.sleep(1800)
        assert await _pending(memory) == {"records": 0, "forgets": 0, "record_failed": 0, "forget_failed": 1,
                                          "record_quarantined": 0}
        forgotten_at, no_body = await _body(memory, eid)
        assert forgotten_at and no_body, "failed counts as done: the body goes, the tombstone stays"
        tomb = await memory.store.read(lambda db: db.execute(
            "SELECT forgotten_at FROM memory_index WHERE episode_id = ?", [eid]).fetchone()[0])
        assert tomb is not None


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Autojump only after 20 ms of real idleness, so virtual time does not run while SQLite or
    PostgreSQL works in a thread (with a zero threshold every thread wait is a jump and provider
    deadlines expire spuriously; 5 ms was too short for PostgreSQL at load 4, CI-like)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


@pytest.mark.req10
async def test_the_hourly_prune_forgets_only_episodes_older_than_retention(
        make_holder: Callable[[str], ConfigHolder], patient_clock: trio.testing.MockClock) -> None:
    clock = ShiftableClock()
    holder = make_holder('[memory.episodes]\nretention = "30d"\n')
    async with open_memory_service(holder, wall_clock=clock) as memory:
        old = (await memory.ingest_run(_run(1)))["episode_id"]
        clock.shift += timedelta(days=20)
        young = (await memory.ingest_run(_run(2)))["episode_id"]
        for _ in range(150):  # both recorded to the provider (retries, backing off to 1 h, included)
            if (await memory.status())["counts"]["indexed_ids"] == 2:
                break
            await trio.sleep(600)
        assert (await memory.status())["counts"]["indexed_ids"] == 2
        clock.shift += timedelta(days=11)  # old is 31 days old, young 11
        for _ in range(12):  # within the next hourly prune (virtual time; see the 24 h test's note)
            if (await _body(memory, old))[0] is not None:
                break
            await trio.sleep(600)
        assert (await _body(memory, old))[0] is not None
        assert (await _body(memory, young))[0] is None
        # (Not through recall: under autojump its provider_timeout expires while SQLite works in threads.)
        async def docs() -> list[str]:
            return [r[0] for r in await memory.store.read(lambda db: db.execute(
                "SELECT episode_id FROM builtin_docs").fetchall())]

        for _ in range(12):
            if await docs() == [young]:
                break
            await trio.sleep(600)
        assert await docs() == [young], "the provider forgot the old episode and kept the young one"


@pytest.mark.req10
async def test_req10_a_finished_tombstone_is_deleted_one_retention_period_after_the_forget(
        make_holder: Callable[[str], ConfigHolder], patient_clock: trio.testing.MockClock) -> None:
    """The hourly prune deletes the tombstone of an episode
    forgotten more than `retention` ago once every forget of it is over (its episode and index rows);
    the run row stays, so the run is never recorded again; a fresher tombstone stays."""
    clock = ShiftableClock()
    holder = make_holder('[memory.episodes]\nretention = "30d"\n')
    async with open_memory_service(holder, wall_clock=clock) as memory:
        await wait_ready(memory)
        first = (await memory.ingest_run(_run(1)))["episode_id"]
        second = (await memory.ingest_run(_run(2)))["episode_id"]
        # Both recorded at the provider first (retries included). Under autojump a record's or a
        # forget's provider_timeout can run out in virtual time while PostgreSQL works in a thread (CI
        # saw the first record fail once, and the forget then had nothing to forget at the provider):
        # the state, never the first round's answer, ends each wait.
        for _ in range(150):  # up to 25 h of virtual time: a retry's backoff grows to 1 h
            if (await memory.status())["counts"]["indexed_ids"] == 2:
                break
            await trio.sleep(600)
        assert (await memory.status())["counts"]["indexed_ids"] == 2
        out = await memory.forget(first)
        assert out["forgotten_at"] is not None and out["failed"] == 0
        for _ in range(150):  # the retry loop finishes a forget its first round left pending
            if (await _body(memory, first))[1]:
                break
            await trio.sleep(600)
        assert (await _body(memory, first))[1], "the forgotten episode's body is deleted once its forget is over"
        clock.shift += timedelta(days=31)  # first: forgotten 31 days ago; second: recorded 31 days ago

        async def tombstones() -> list[str]:
            return [r[0] for r in await memory.store.read(lambda db: db.execute(
                "SELECT episode_id FROM episodes ORDER BY episode_id").fetchall())]

        # The next hourly prune deletes it. Virtual time can jump while a prune's SQLite work runs in
        # its thread (the clock autojumps after 5 ms of real idleness, which a loaded machine gives
        # it), so the bound is generous: the state, not an hour count, ends the wait.
        for _ in range(200):
            if await tombstones() == [second]:
                break
            await trio.sleep(600)
        assert await tombstones() == [second]
        assert (await _body(memory, second))[0] is not None, "the second was forgotten by this prune: it stays"
        with pytest.raises(UnknownEpisode):
            await memory.get_episode(first)
        left = await memory.store.read(lambda db: db.execute(
            "SELECT (SELECT count(*) FROM memory_index WHERE episode_id = ?),"
            " (SELECT count(*) FROM runs WHERE run_id = '1')", [first]).fetchone())
        assert tuple(left) == (0, 1)
        again = await memory.ingest_run(_run(1))
        assert again["outcome"] == "duplicate" and await tombstones() == [second]


@pytest.mark.req10
@pytest.mark.slow
async def test_req10_retention_applies_to_an_external_provider(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real subprocess, real time: the prune period is shortened to half a second here (the hourly
    cadence itself is tested on MockClock above); the episode's age comes from a shifted wall clock."""
    monkeypatch.setattr(retention_module, "PRUNE_EVERY", 0.5)
    files = FaultFiles(tmp_path / "fault")
    clock = ShiftableClock(follow_trio=False)
    holder = make_holder(fault_toml(files, extra_episodes='retention = "30d"\n'))
    async with open_memory_service(holder, wall_clock=clock) as memory:
        await wait_ready(memory)
        eid = (await memory.ingest_run(_run(1)))["episode_id"]
        assert eid in files.stored()
        await trio.sleep(1.0)  # prunes run; the episode is young
        assert "memory_forget" not in files.tools()
        clock.shift = timedelta(days=31)
        await poll(lambda: any(c["tool"] == "memory_forget" and c["arguments"] == {"id": eid}
                               for c in files.read_calls()), what="memory_forget for the episode's id")
        # The fault provider logs a call before it applies it and saves its state: wait for the state.
        await poll(lambda: eid not in files.stored(), what="the episode gone from the provider's state")
        assert eid not in files.stored()

        async def body_gone() -> bool:
            return (await _body(memory, eid))[1] == 1

        await poll(body_gone, what="stored body deleted")


@pytest.mark.req13
async def test_the_first_success_after_failures_makes_the_backlog_due(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    """Records that failed wait out their backoff — unless the provider is seen back: the first
    successful record makes every waiting record due at once, so a recovered provider catches up in
    seconds rather than at each row's next attempt (up to an hour away)."""
    files = FaultFiles(tmp_path / "fault")
    async with open_memory_service(make_holder(fault_toml(files))) as memory:
        await wait_ready(memory)
        await trio.Path(files.control).write_text("error")
        for n in (1, 2, 3):
            assert (await memory.ingest_run(_run(n)))["outcome"] == "queued"
        later = "2999-01-01T00:00:00.000000Z"
        await memory.store.write(lambda db: db.execute("UPDATE pending SET next_at = ?", [later]))
        await trio.Path(files.control).write_text("")
        assert (await memory.ingest_run(_run(4)))["outcome"] == "recorded"

        async def all_recorded() -> bool:
            return (await memory.status())["counts"]["indexed_ids"] == 4

        await poll(all_recorded, seconds=15, what="the backlog recorded after the first success")
        assert (await _pending(memory))["records"] == 0


async def _attempt_times(memory: MemoryService) -> tuple[int, Any]:
    """(attempts, wall time of the last failed attempt) of the one pending record row, from its next_at."""
    from memactors._wire import parse_time

    row = await memory.store.read(lambda db: db.execute(
        "SELECT attempts, next_at FROM pending WHERE kind = 'record'").fetchone())
    attempts, next_at = row
    return attempts, parse_time(next_at) - timedelta(seconds=retention_module.backoff_seconds(attempts))


@pytest.mark.req13
async def test_a_failed_record_is_retried_when_its_row_is_due_not_a_minute_later(
        make_holder: Callable[[str], ConfigHolder], mock_clock: trio.testing.MockClock) -> None:
    """The retry loop sleeps until the earliest next_at and is woken when a row is added or rescheduled:
    the second attempt of a record that failed comes ~5 s (FIRST_BACKOFF) after the first, not after the
    loop's idle minute. Trio time only moves when the test jumps it (autojump would leap over timers
    while SQLite works in a thread), in 0.1 s steps."""
    clock = ShiftableClock()
    metrics = Metrics()
    async with open_memory_service(make_holder(UNREACHABLE), wall_clock=clock, metrics=metrics) as memory:
        assert (await memory.ingest_run(_run(1)))["outcome"] == "queued"
        attempts, first = await _attempt_times(memory)
        assert attempts == 1
        jumped = 0.0
        while attempts < 2 and jumped < 30:
            mock_clock.jump(0.1)
            jumped += 0.1
            await trio.to_thread.run_sync(time.sleep, 0.01)
            attempts, second = await _attempt_times(memory)
        assert attempts == 2, f"no retry within {jumped:.1f} s of trio time"
        assert timedelta(seconds=4.9) <= second - first < timedelta(seconds=6)
        for _ in range(200):  # and a third, ~10 s later
            mock_clock.jump(0.1)
            await trio.to_thread.run_sync(time.sleep, 0.01)
            if (await _attempt_times(memory))[0] == 3:
                break
        assert (await _attempt_times(memory))[0] == 3
        # REQ-21 counts episodes: one queued episode attempted three times is one error.
        assert sample(metrics, "harness_memory_episodes_recorded_total", provider="fault", outcome="error") == 1


@pytest.mark.req13
@pytest.mark.slow
async def test_a_record_backlog_drains_without_pausing_between_batches(
        make_holder: Callable[[str], ConfigHolder], mock_clock: trio.testing.MockClock) -> None:
    """More due rows than one batch (DUE_BATCH) drain while trio time stands still: the loop goes
    straight on to the next batch instead of waiting 0.5 s after each."""
    async with open_memory_service(make_holder("")) as memory:
        for n in range(retention_module.DUE_BATCH + 10):
            record = run_record(run_id=f"b{n}", trace_id=f"tb-{n}", result_text=f"fixed ledger rounding {n}")
            assert (await memory.ingest_run(record))["outcome"] == "recorded"
        now = "2000-01-01T00:00:00.000000Z"
        await memory.store.write(lambda db: db.execute(
            "INSERT INTO pending (kind, provider, episode_id, first_at, next_at)"
            " SELECT 'record', 'builtin', episode_id, ?, ? FROM episodes", [now, now]))
        await memory.retention.address.tell(retention_module.Kick())

        async def drained() -> bool:
            return (await _pending(memory))["records"] == 0

        await poll(drained, seconds=60, what="a backlog of more than one batch drained with trio time frozen")
