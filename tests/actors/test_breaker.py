"""The provider breaker (ADR-0035 as docs/architecture.md's actor table fixes it), as a pure state machine on MockClock."""

from __future__ import annotations

import pytest
import trio

from memactors.breaker import Breaker

pytestmark = pytest.mark.req13


def _fail(breaker: Breaker, n: int, outcome: str = "failure") -> None:
    for _ in range(n):
        assert breaker.allow()
        breaker.report(outcome)  # type: ignore[arg-type]


async def test_five_consecutive_failures_or_timeouts_open_it(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 2)
    _fail(breaker, 2, "timeout")
    assert breaker.state == "closed"
    _fail(breaker, 1, "timeout")
    assert breaker.state == "open"
    assert not breaker.allow()


async def test_a_success_resets_the_count(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 4)
    assert breaker.allow()
    breaker.report("ok")
    _fail(breaker, 4)
    assert breaker.state == "closed"


async def test_cancellation_is_not_a_failure(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 10, "neutral")
    assert breaker.state == "closed"


async def test_open_for_30_seconds_then_exactly_one_half_open_probe(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 5)
    await trio.sleep(29.9)
    assert not breaker.allow()
    await trio.sleep(0.1)
    assert breaker.allow()  # the probe
    assert breaker.state == "half_open"
    assert not breaker.allow()  # nobody else while the probe is out
    breaker.report("ok")
    assert breaker.state == "closed"
    assert breaker.allow()


async def test_failed_probes_double_the_open_time_up_to_five_minutes(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 5)
    waits = []
    for _ in range(6):
        opened = trio.current_time()
        while not breaker.allow():  # noqa: ASYNC110 -- polling a pure state machine on virtual time
            await trio.sleep(1)
        waits.append(round(trio.current_time() - opened))
        breaker.report("timeout")
    assert waits == [30, 60, 120, 240, 300, 300]


async def test_a_successful_probe_resets_the_open_time(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 5)
    await trio.sleep(30)
    assert breaker.allow()
    breaker.report("failure")  # open for 60 s now
    await trio.sleep(60)
    assert breaker.allow()
    breaker.report("ok")
    _fail(breaker, 5)
    await trio.sleep(30)
    assert breaker.allow(), "after a close the open time starts at 30 s again"


async def test_a_probe_cancelled_for_our_own_reasons_lets_the_next_caller_probe(
        autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker()
    _fail(breaker, 5)
    await trio.sleep(30)
    assert breaker.allow()
    breaker.report("neutral")
    assert breaker.state == "open"
    assert breaker.allow()


async def test_a_custom_base_open_time_is_used_from_the_first_opening(autojump_clock: trio.testing.MockClock) -> None:
    breaker = Breaker(base_open=2.0)
    _fail(breaker, 5)
    await trio.sleep(2.0)
    assert breaker.allow()


async def test_the_built_in_providers_open_breaker_half_opens_as_soon_as_the_store_is_back(
        make_holder, trio_clock: trio.testing.MockClock) -> None:  # type: ignore[no-untyped-def]
    """After a PostgreSQL failover the built-in provider's breaker, opened by calls that failed
    during the switch, kept recall degraded for its 30 s open time. The store answering again (its
    `recoveries` count, which PgStore bumps when a call succeeds after an outage) makes the next call the
    half-open probe at once: no trio time passes here, so only that signal can close it."""
    from memactors.service import open_memory_service
    from support import run_record, wait_ready

    async with open_memory_service(make_holder("")) as memory:
        await wait_ready(memory)
        await memory.ingest_run(run_record(run_id="a", result_text="fixed the ledger rounding"))
        trio_clock.rate = 0.0  # the breaker's 30 s never pass
        breaker = memory.session.breaker
        _fail(breaker, 5)  # as calls that timed out before the store was known down
        degraded = await memory.recall(query="ledger rounding", repo="forge.example/acme/api")
        assert degraded["degraded"] == "provider_unavailable" and breaker.state == "open"
        memory.store.recoveries += 1  # the store is back
        served = await memory.recall(query="ledger rounding", repo="forge.example/acme/api")
        assert served["degraded"] is None and served["episodes"], served
        assert breaker.state == "closed"
        trio_clock.rate = 1.0
