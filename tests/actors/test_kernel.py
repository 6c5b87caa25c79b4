"""Tests of the actor kernel: ask/tell, deadlines, shutdown answers, the supervisor and its intensity."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from memactors.actors.kernel import (
    ActorFailed,
    Address,
    ChildSpec,
    SupervisorFailed,
    deadline,
    open_mailbox,
    open_supervisor,
    serve,
)
from memactors.errors import ActorStopped, DeadlineExceeded, InvalidArgument, UnknownEpisode


class Boom(Exception):
    """A crash the tests inject."""


@attrs.frozen
class Echo:
    text: str


@attrs.frozen
class Fail:
    error: Exception


@attrs.frozen
class Hang:
    pass


@attrs.frozen
class Sleep:
    seconds: float


@attrs.frozen
class Crash:
    """Ask the actor to crash its whole incarnation (not just the handler)."""


class EchoActor:
    """A small real actor: echoes, fails, hangs or crashes on request; counts its incarnations."""

    def __init__(self, name: str = "echo", size: int = 4, concurrency: int = 1) -> None:
        self.address, self._mailbox = open_mailbox(name, size)
        self.concurrency = concurrency
        self.incarnations = 0
        self.handled: list[str] = []

    async def run(self, *, task_status: trio.TaskStatus[Address[Any]] = trio.TASK_STATUS_IGNORED) -> None:
        self.incarnations += 1
        incarnation = self.incarnations
        crash = trio.Event()

        async def crash_when_asked() -> None:
            await crash.wait()
            raise Boom(f"incarnation {incarnation} crashed")

        async def handle(message: object) -> object:
            match message:
                case Echo(text):
                    self.handled.append(text)
                    return (incarnation, text)
                case Fail(error):
                    raise error
                case Hang():
                    await trio.sleep_forever()
                case Sleep(seconds):
                    await trio.sleep(seconds)
                    return "slept"
                case Crash():
                    crash.set()
                    await trio.sleep_forever()
            raise AssertionError(f"unexpected message {message!r}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(crash_when_asked)
            task_status.started(self.address)
            await serve(self._mailbox, handle, concurrency=self.concurrency)
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_askers() -> AsyncIterator[trio.Nursery]:
    """A nursery for requesters that fails (in milliseconds, on the mock clock) if any of them hangs."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            yield nursery


async def ask_later(address: Address[Any], message: object, results: list[object]) -> None:
    """Ask and record the answer or the error, so a test can look at several requesters at once."""
    try:
        results.append(await address.ask(message))
    except Exception as exc:
        results.append(exc)


# --- ask / tell ---------------------------------------------------------------------------------


async def test_ask_returns_the_handlers_answer() -> None:
    actor = EchoActor()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)
        assert await address.ask(Echo("hello")) == (1, "hello")
        assert await address.ask(Echo("again")) == (1, "again")
        actor._mailbox.close()
    assert actor.handled == ["hello", "again"]


@pytest.mark.errors
async def test_a_handler_error_is_raised_in_the_requester_and_the_actor_keeps_serving() -> None:
    actor = EchoActor()
    domain_error = UnknownEpisode("no such episode", episode="ep_1")
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)

        with pytest.raises(ActorFailed) as failed:
            await address.ask(Fail(ValueError("bad input")))
        assert isinstance(failed.value.__cause__, ValueError)
        assert failed.value.context == {"actor": "echo", "message_type": "Fail", "error": "ValueError"}

        with pytest.raises(UnknownEpisode) as unknown:
            await address.ask(Fail(domain_error))
        assert unknown.value is domain_error  # a domain error arrives as it is, not wrapped

        assert await address.ask(Echo("still here")) == (1, "still here")
        actor._mailbox.close()
    assert actor.incarnations == 1


async def test_tell_is_handled_and_a_failing_tell_does_not_stop_the_actor() -> None:
    actor = EchoActor()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)
        await address.tell(Fail(ValueError("nobody hears this")))
        await address.tell(Echo("told"))
        assert await address.ask(Echo("asked")) == (1, "asked")
        actor._mailbox.close()
    assert actor.handled == ["told", "asked"]


async def test_serve_handles_up_to_its_concurrency_at_once(autojump_clock: trio.abc.Clock) -> None:
    actor = EchoActor(size=8, concurrency=3)
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)
        start = trio.current_time()
        async with open_askers() as askers:
            for _ in range(6):
                askers.start_soon(ask_later, address, Sleep(1.0), results)
        # Six one-second requests three at a time take two seconds, not one and not six.
        assert trio.current_time() - start == pytest.approx(2.0)
        actor._mailbox.close()
    assert results == ["slept"] * 6


# --- deadlines ----------------------------------------------------------------------------------


@pytest.mark.errors
async def test_a_request_to_a_stuck_actor_raises_deadline_exceeded_at_the_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    actor = EchoActor()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)
        start = trio.current_time()
        with pytest.raises(DeadlineExceeded) as exceeded:
            with deadline(2.0, "echo request", actor="echo"):
                await address.ask(Hang())
        assert trio.current_time() - start == 2.0
        assert exceeded.value.context == {"deadline_s": 2.0, "actor": "echo"}
        assert "echo request did not finish within 2 s" in str(exceeded.value)
        nursery.cancel_scope.cancel()


async def test_deadline_lets_a_fast_block_through(autojump_clock: trio.abc.Clock) -> None:
    with deadline(2.0, "nap") as scope:
        await trio.sleep(1.9)
    assert not scope.cancelled_caught


async def test_a_request_whose_requester_gave_up_while_queued_is_skipped(autojump_clock: trio.abc.Clock) -> None:
    actor = EchoActor()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)
        nursery.start_soon(address.ask, Sleep(5.0))  # keeps the actor busy for 5 s
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(DeadlineExceeded):
            with deadline(1.0, "echo request"):
                await address.ask(Echo("too late"))
        await trio.sleep(5.0)
        assert await address.ask(Echo("in time")) == (1, "in time")
        actor._mailbox.close()
    assert actor.handled == ["in time"]


# --- stopping -----------------------------------------------------------------------------------


@pytest.mark.errors
async def test_in_flight_and_queued_requests_get_actor_stopped_at_shutdown(autojump_clock: trio.abc.Clock) -> None:
    actor = EchoActor(size=2)
    results: list[object] = []
    async with open_askers() as askers:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(actor.run)
            askers.start_soon(ask_later, address, Hang(), results)  # in flight
            await trio.sleep(1)
            for text in ("a", "b", "c"):  # two queued, one waiting for room
                askers.start_soon(ask_later, address, Echo(text), results)
            await trio.sleep(1)
            assert address.statistics().queued == 2
            assert address.statistics().waiting_senders == 1
            # Stop the actor: cancel its task, then close its mailbox, as an owner does.
            nursery.cancel_scope.cancel()
        actor._mailbox.close()
    assert len(results) == 4
    assert all(isinstance(result, ActorStopped) for result in results), results
    assert actor.handled == []


@pytest.mark.errors
async def test_tell_and_ask_to_a_stopped_actor_raise_actor_stopped() -> None:
    actor = EchoActor()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(actor.run)
        actor._mailbox.close()  # serve returns, run returns
    with pytest.raises(ActorStopped) as stopped:
        await address.ask(Echo("anyone?"))
    assert stopped.value.context == {"actor": "echo"}
    with pytest.raises(ActorStopped):
        await address.tell(Echo("anyone?"))
    assert address.statistics().closed


async def test_mailbox_statistics_count_queued_requests_and_the_buffer_is_bounded(
    autojump_clock: trio.abc.Clock,
) -> None:
    address, mailbox = open_mailbox("idle", size=2)
    assert attrs.asdict(address.statistics()) == {
        "name": "idle", "queued": 0, "capacity": 2, "waiting_senders": 0, "closed": False,
    }
    await address.tell(Echo("1"))
    await address.tell(Echo("2"))
    with trio.move_on_after(1) as blocked:
        await address.tell(Echo("3"))  # nobody reads: a full mailbox pushes back
    assert blocked.cancelled_caught
    assert address.statistics().queued == 2
    mailbox.close()
    assert address.statistics().queued == 0


def test_a_mailbox_must_be_bounded() -> None:
    with pytest.raises(InvalidArgument):
        open_mailbox("unbounded", size=float("inf"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        open_mailbox("negative", size=-1)


# --- supervisor: restarts -----------------------------------------------------------------------


async def test_a_crashed_permanent_child_is_restarted_and_its_address_still_works(
    autojump_clock: trio.abc.Clock,
) -> None:
    actor = EchoActor(size=4)
    results: list[object] = []
    async with open_supervisor(max_restarts=3, window=5.0) as supervisor:
        address = await supervisor.start(ChildSpec("echo", actor.run))
        assert address is actor.address
        assert await address.ask(Echo("before")) == (1, "before")
        async with open_askers() as askers:
            askers.start_soon(ask_later, address, Crash(), results)
            await trio.testing.wait_all_tasks_blocked()
            askers.start_soon(ask_later, address, Echo("queued across the crash"), results)
        assert isinstance(results[0], ActorStopped)  # in flight in the crashed incarnation: never hangs
        assert results[1] == (2, "queued across the crash")  # served by the new incarnation
        assert await address.ask(Echo("after")) == (2, "after")
        assert supervisor.running() == ["echo"]
    assert actor.incarnations == 2


async def test_a_transient_child_is_restarted_after_a_crash_but_not_after_a_normal_return(
    autojump_clock: trio.abc.Clock,
) -> None:
    incarnations = 0

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal incarnations
        incarnations += 1
        task_status.started()
        if incarnations == 1:
            raise Boom("first run crashes")

    async with open_supervisor() as supervisor:
        await supervisor.start(ChildSpec("job", child, restart="transient"))
        await trio.sleep(1)  # past the restart's backoff
        assert supervisor.running() == []
    assert incarnations == 2


async def test_a_permanent_child_that_returns_is_restarted() -> None:
    incarnations = 0
    finished = trio.Event()

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal incarnations
        incarnations += 1
        task_status.started()
        if incarnations == 3:
            finished.set()
            await trio.sleep_forever()

    async with open_supervisor(max_restarts=2) as supervisor:
        await supervisor.start(ChildSpec("loop", child, shutdown_grace=0))
        await finished.wait()
    assert incarnations == 3


async def test_a_temporary_child_is_never_restarted_and_its_mailbox_closes(autojump_clock: trio.abc.Clock) -> None:
    actor = EchoActor()
    async with open_supervisor() as supervisor:
        address = await supervisor.start(ChildSpec("echo", actor.run, restart="temporary"))
        assert isinstance(await _ask_error(address, Crash()), ActorStopped)
        await trio.testing.wait_all_tasks_blocked()
        assert supervisor.running() == []
        with pytest.raises(ActorStopped):
            await address.ask(Echo("gone"))
    assert actor.incarnations == 1


async def _ask_error(address: Address[Any], message: object) -> Exception:
    try:
        with trio.fail_after(60):  # a hang fails in milliseconds on the mock clock
            await address.ask(message)
    except Exception as exc:
        return exc
    raise AssertionError("the ask did not fail")


async def test_an_error_before_started_is_raised_from_start_and_not_restarted() -> None:
    attempts = 0

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal attempts
        attempts += 1
        raise Boom("cannot open")

    async with open_supervisor(max_restarts=0) as supervisor:
        with pytest.raises(Boom):
            await supervisor.start(ChildSpec("broken", child))
        assert supervisor.running() == []
    assert attempts == 1


async def test_a_child_that_reports_a_new_address_after_a_restart_fails_the_supervisor() -> None:
    async def child(*, task_status: trio.TaskStatus[Address[Any]] = trio.TASK_STATUS_IGNORED) -> None:
        address, _mailbox = open_mailbox("fresh-each-time")
        task_status.started(address)
        raise Boom("crash")

    with pytest.raises(SupervisorFailed, match="new address"):
        async with open_supervisor() as supervisor:
            await supervisor.start(ChildSpec("fresh", child))
            await trio.sleep_forever()


# --- supervisor: restart intensity --------------------------------------------------------------


async def test_the_supervisor_gives_up_past_its_restart_intensity(autojump_clock: trio.abc.Clock) -> None:
    bystander = EchoActor("bystander")
    incarnations = 0

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal incarnations
        incarnations += 1
        task_status.started()
        await trio.sleep(1.0)
        raise Boom(f"crash {incarnations}")

    with pytest.raises(SupervisorFailed) as failed:
        async with open_supervisor("root", max_restarts=3, window=5.0) as supervisor:
            await supervisor.start(ChildSpec("bystander", bystander.run))
            await supervisor.start(ChildSpec("crashing", child))
            await trio.sleep_forever()
    assert incarnations == 4  # the first run and three restarts; the fourth crash is one too many
    assert trio.current_time() == pytest.approx(4.3)  # four 1 s runs and three 0.1 s backoffs
    assert "'crashing' failed more than 3 times in 5 s" in str(failed.value)
    assert failed.value.context == {"supervisor": "root", "child": "crashing", "last_error": "Boom"}
    assert isinstance(failed.value.__cause__, Boom)
    with pytest.raises(ActorStopped):  # the other children were stopped with it
        await bystander.address.ask(Echo("still there?"))


async def test_restarts_spread_out_beyond_the_window_do_not_count(autojump_clock: trio.abc.Clock) -> None:
    incarnations = 0

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal incarnations
        incarnations += 1
        task_status.started()
        if incarnations <= 10:
            await trio.sleep(3.0)
            raise Boom("crash every 3 s")

    # At most two restarts in any 5 s: a crash every 3 s stays within it forever.
    async with open_supervisor(max_restarts=2, window=5.0) as supervisor:
        await supervisor.start(ChildSpec("steady", child, restart="transient"))
        await trio.sleep(60)
    assert incarnations == 11


async def test_restarts_closer_than_the_window_do_count(autojump_clock: trio.abc.Clock) -> None:
    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep(2.0)
        raise Boom("crash every 2 s")

    with pytest.raises(SupervisorFailed):
        async with open_supervisor(max_restarts=2, window=5.0) as supervisor:
            await supervisor.start(ChildSpec("flaky", child))
            await trio.sleep(60)
    # Crashes at 2, 4.1 (after a 0.1 s backoff) and 6.2: the first two fill the window, the third is one too many.
    assert trio.current_time() == pytest.approx(6.2)


# --- supervisor: backoff, bursts and resource exhaustion ---------------------------------------


def _crashing_child(starts: list[float], errors: list[BaseException]) -> Any:
    """A child that crashes right after starting with the next error of ``errors``, then stays up."""

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if errors:
            raise errors.pop(0)
        await trio.sleep_forever()

    return child


async def test_restarts_back_off_exponentially_up_to_the_cap(autojump_clock: trio.abc.Clock) -> None:
    starts: list[float] = []
    async with open_supervisor(max_restarts=1, window=60, backoff=0.1, max_backoff=1.0, max_burst=50) as sup:
        await sup.start(ChildSpec("flaky", _crashing_child(starts, [Boom(str(i)) for i in range(7)])))
        await trio.sleep(30)
        assert len(starts) == 8
        await sup.stop("flaky")
    gaps = [round(b - a, 6) for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


async def test_a_burst_of_instant_crashes_is_one_incident(autojump_clock: trio.abc.Clock) -> None:
    """Five instant crashes in a row (as a child hitting one bad moment does) are one incident, so a
    supervisor allowing one incident per minute keeps the child instead of giving up within 15 ms."""
    starts: list[float] = []
    async with open_supervisor(max_restarts=1, window=60, max_burst=8) as sup:
        await sup.start(ChildSpec("bursty", _crashing_child(starts, [Boom(str(i)) for i in range(5)])))
        await trio.sleep(10)
        assert sup.running() == ["bursty"]
        await sup.stop("bursty")
    assert len(starts) == 6


async def test_a_child_crashing_instantly_on_every_restart_is_given_up_after_its_burst(
    autojump_clock: trio.abc.Clock,
) -> None:
    starts: list[float] = []
    with pytest.raises(SupervisorFailed, match="crashed 4 times in a row") as failed:
        async with open_supervisor("root", max_restarts=5, window=60, max_burst=3) as sup:
            await sup.start(ChildSpec("doomed", _crashing_child(starts, [Boom(str(i)) for i in range(100)])))
            await trio.sleep_forever()
    assert len(starts) == 4
    assert failed.value.context["child"] == "doomed"
    assert isinstance(failed.value.__cause__, Boom)


async def test_resource_exhaustion_is_retried_after_backoff_and_never_counted(autojump_clock: trio.abc.Clock) -> None:
    """EMFILE, a full disk or SQLite unable to open its file are the machine's state, not the child's
    logic: even a supervisor allowing no incident at all keeps retrying, at most max_backoff apart."""
    import errno

    import sqlean

    exhaustion: list[BaseException] = [OSError(errno.EMFILE, "Too many open files") for _ in range(12)]
    exhaustion += [sqlean.OperationalError("unable to open database file"), MemoryError()]
    exhaustion.append(ActorFailed("wrapped", actor="x"))
    exhaustion[-1].__cause__ = OSError(errno.ENFILE, "File table overflow")
    starts: list[float] = []
    async with open_supervisor(max_restarts=0, window=60, max_burst=1, backoff=0.1, max_backoff=2.0) as sup:
        await sup.start(ChildSpec("starved", _crashing_child(starts, exhaustion)))
        await trio.sleep(60)
        assert sup.running() == ["starved"]
        await sup.stop("starved")
    assert len(starts) == 16
    assert max(b - a for a, b in zip(starts, starts[1:], strict=False)) == pytest.approx(2.0)


async def test_a_resource_exhaustion_that_lasts_is_alarmed_once_then_given_up(autojump_clock: trio.abc.Clock) -> None:
    """Retried, never counted as an incident, but not forever. While it lasts the
    supervisor says so (`exhausted()`); after exhaustion_alarm seconds one CRITICAL line; after
    exhaustion_limit seconds it gives up like any other give-up, naming the child and what ran out."""
    import errno

    from support import LogRecords

    starts: list[float] = []
    seen: list[dict[str, Any]] = []
    with LogRecords("WARNING") as logs, pytest.raises(SupervisorFailed) as failed:
        async with open_supervisor(max_restarts=0, window=60, max_burst=1, backoff=0.1, max_backoff=5.0,
                                   exhaustion_alarm=60.0, exhaustion_limit=180.0) as sup:
            errors: list[BaseException] = [OSError(errno.EMFILE, "Too many open files") for _ in range(1000)]
            await sup.start(ChildSpec("starved", _crashing_child(starts, errors)))
            await trio.sleep(30)
            seen.append(sup.exhausted())
            await trio.sleep_forever()
    assert seen[0]["starved"]["error"] == "OSError EMFILE" and seen[0]["starved"]["attempts"] > 1
    assert 25 <= seen[0]["starved"]["seconds"] <= 30
    assert failed.value.context["child"] == "starved"
    assert "EMFILE" in str(failed.value) and "180" in str(failed.value)
    assert 180 <= starts[-1] - starts[0] <= 185  # trio time (MockClock): the limit, within one backoff
    critical = [r for r in logs.records if r["level"] == "CRITICAL"]
    assert len(critical) == 1 and critical[0]["extra"]["child"] == "starved"
    assert 60 <= critical[0]["extra"]["seconds"] < 70


async def test_a_child_that_recovers_between_exhaustions_starts_a_new_spell(autojump_clock: trio.abc.Clock) -> None:
    """A child that ran longer than the longest backoff had recovered: the next exhaustion starts the
    clock again, so short spells hours apart never add up to a give-up."""
    import errno

    from support import LogRecords

    runs: list[float] = []

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        runs.append(trio.current_time())
        task_status.started()
        # Two quick EMFILE crashes, then 100 s of service, then EMFILE again, for 10 rounds (~1,000 s).
        if len(runs) % 3 == 0:
            await trio.sleep(100)
        if len(runs) < 30:
            raise OSError(errno.EMFILE, "Too many open files")
        await trio.sleep_forever()

    with LogRecords("WARNING") as logs:
        async with open_supervisor(max_restarts=0, window=60, max_burst=1, backoff=0.1, max_backoff=5.0,
                                   exhaustion_alarm=60.0, exhaustion_limit=180.0) as sup:
            await sup.start(ChildSpec("recovering", child))
            while len(runs) < 30:  # noqa: ASYNC110 -- MockClock autojump drives the child's crashes
                await trio.sleep(1)
            assert sup.running() == ["recovering"]
            assert sup.exhausted()["recovering"]["attempts"] >= 1  # just restarted: the spell goes on
            await trio.sleep(10)
            assert sup.exhausted() == {}  # up longer than any backoff: recovered
            await sup.stop("recovering")
    assert runs[-1] - runs[0] > 180
    assert not [r for r in logs.records if r["level"] in ("CRITICAL", "ERROR")]


async def test_exhaustion_bounds_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="exhaustion_alarm"):
        async with open_supervisor(exhaustion_alarm=600.0, exhaustion_limit=300.0):
            pass


def test_resource_exhaustion_is_told_apart_from_logic_errors() -> None:
    import errno

    import sqlean

    from memactors.actors.kernel import is_resource_exhaustion

    assert is_resource_exhaustion(OSError(errno.EMFILE, "Too many open files"))
    assert is_resource_exhaustion(sqlean.OperationalError("database or disk is full"))
    assert is_resource_exhaustion(ExceptionGroup("g", [ValueError("x"), OSError(errno.ENOMEM, "no memory")]))
    assert not is_resource_exhaustion(OSError(errno.ECONNREFUSED, "refused"))
    assert not is_resource_exhaustion(sqlean.OperationalError("no such table: episodes"))
    assert not is_resource_exhaustion(Boom("logic"))


async def test_stopping_a_child_waiting_out_its_backoff_stops_it_at_once(autojump_clock: trio.abc.Clock) -> None:
    starts: list[float] = []
    async with open_supervisor(max_restarts=5, window=60, backoff=30.0, max_backoff=30.0) as sup:
        await sup.start(ChildSpec("slow-to-return", _crashing_child(starts, [Boom("once")])))
        await trio.testing.wait_all_tasks_blocked()
        before = trio.current_time()
        await sup.stop("slow-to-return")
        assert trio.current_time() == before
        assert sup.running() == []
    assert len(starts) == 1


# --- supervisor: cancellation and graceful stop -------------------------------------------------


async def test_stopping_a_child_is_not_a_crash_and_is_not_restarted(autojump_clock: trio.abc.Clock) -> None:
    incarnations = 0

    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal incarnations
        incarnations += 1
        task_status.started()
        await trio.sleep_forever()

    # max_restarts=0: one counted restart would fail the supervisor.
    async with open_supervisor(max_restarts=0) as supervisor:
        await supervisor.start(ChildSpec("sleeper", child))
        start = trio.current_time()
        await supervisor.stop("sleeper")
        assert trio.current_time() == start  # no mailbox, no way to hear a stop: cancelled at once
        assert supervisor.running() == []
        await supervisor.start(ChildSpec("sleeper", child))
    assert incarnations == 2  # started twice by hand, never restarted


async def test_cancelling_the_supervisor_is_not_a_crash(autojump_clock: trio.abc.Clock) -> None:
    actor = EchoActor()
    with trio.move_on_after(1.0) as outer:
        async with open_supervisor(max_restarts=0) as supervisor:
            await supervisor.start(ChildSpec("echo", actor.run))
            await trio.sleep_forever()
    assert outer.cancelled_caught
    assert actor.incarnations == 1
    with pytest.raises(ActorStopped):
        await actor.address.ask(Echo("after"))


async def test_a_child_that_ignores_stop_longer_than_its_grace_is_cancelled(autojump_clock: trio.abc.Clock) -> None:
    actor = EchoActor(size=4)
    results: list[object] = []
    async with open_supervisor(max_restarts=0) as supervisor:
        address = await supervisor.start(ChildSpec("echo", actor.run, shutdown_grace=3.0))
        async with open_askers() as askers:
            askers.start_soon(ask_later, address, Hang(), results)
            await trio.testing.wait_all_tasks_blocked()
            askers.start_soon(ask_later, address, Echo("queued"), results)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            await supervisor.stop("echo")
            assert trio.current_time() - start == 3.0
    assert [type(result) for result in results] == [ActorStopped, ActorStopped]
    assert actor.handled == []
    assert actor.incarnations == 1


async def test_a_child_that_finishes_within_its_grace_answers_the_request_in_hand(
    autojump_clock: trio.abc.Clock,
) -> None:
    actor = EchoActor(size=4)
    results: list[object] = []
    async with open_supervisor() as supervisor:
        address = await supervisor.start(ChildSpec("echo", actor.run, shutdown_grace=3.0))
        async with open_askers() as askers:
            askers.start_soon(ask_later, address, Sleep(1.0), results)
            await trio.testing.wait_all_tasks_blocked()
            askers.start_soon(ask_later, address, Echo("queued"), results)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            await supervisor.stop("echo")
            assert trio.current_time() - start == 1.0
    assert isinstance(results[0], ActorStopped)  # the queued one, answered at once
    assert results[1] == "slept"
    assert actor.incarnations == 1


async def test_leaving_the_supervisor_stops_children_latest_first() -> None:
    stopped: list[str] = []

    def child_named(name: str) -> ChildSpec:
        async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                stopped.append(name)

        return ChildSpec(name, child)

    async with open_supervisor() as supervisor:
        for name in ("store", "index", "briefing"):
            await supervisor.start(child_named(name))
    assert stopped == ["briefing", "index", "store"]


def test_a_child_spec_rejects_an_unknown_restart_strategy() -> None:
    async def child(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    with pytest.raises(InvalidArgument):
        ChildSpec("x", child, restart="sometimes")  # type: ignore[arg-type]
