"""Test helpers: a real config file, a real SQLite state directory, real listeners on port 0."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio.testing

from memactors.config import ConfigHolder
from memactors.gateway import start_gateway
from memactors.service import MemoryService, open_memory_service

T = TypeVar("T")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


#: The drop-in that turns the embedded model off for a test's daemon (`write_config`).
NO_EMBEDDINGS = "[memory]\nembeddings = false\n"
# On a loaded 2-core CI machine (4 pytest workers) one built-in record has taken 2.1 s of wall clock, past the 2 s
# default, and the run was then (correctly) queued rather than recorded. Tests of the built-in provider assert on
# "recorded", so they get a deadline a loaded machine cannot miss; tests of deadlines set their own.
ROOMY_PROVIDER_TIMEOUT = '[memory.episodes]\nprovider_timeout = "30s"\n'


def write_config(tmp_path: Path, extra: str = "", *, store_url: str | None = None,
                 embeddings: bool | None = None) -> Path:
    """A global harness.toml keeping state under tmp_path and listening on free loopback ports; with
    `store_url`, the store in that PostgreSQL database.

    `embeddings`: the built-in provider's hybrid ranking. By default it is off (through the documented
    setting, `[memory] embeddings = false`, in a drop-in) unless `extra` configures an embedding model:
    a test daemon that records episodes would otherwise load and run the embedded model in the
    background (docs/benchmarks.md, "Suite cost"). The tests of the embedded model pass True."""
    path = tmp_path / "harness.toml"
    dropins = tmp_path / "harness_d"
    if embeddings is False or (embeddings is None and "embedding_model" not in extra):
        dropins.mkdir(exist_ok=True)
        (dropins / "00-tests-no-embeddings.toml").write_text(NO_EMBEDDINGS, encoding="utf-8")
    else:
        (dropins / "00-tests-no-embeddings.toml").unlink(missing_ok=True)
    if "provider_timeout" in extra or 'provider = "' in extra:
        (dropins / "00-tests-provider-timeout.toml").unlink(missing_ok=True)
    else:
        dropins.mkdir(exist_ok=True)
        (dropins / "00-tests-provider-timeout.toml").write_text(ROOMY_PROVIDER_TIMEOUT, encoding="utf-8")
    url = f'url = "{store_url}"\n' if store_url else ""
    path.write_text(
        f'[store]\npath = "{tmp_path / "state"}"\n{url}'
        '[operator]\nlisten = "127.0.0.1:0"\n'
        '[gateway]\nlisten = "127.0.0.1:0"\n'
        '[metrics]\nlisten = "127.0.0.1:0"\n' + extra,
        encoding="utf-8",
    )
    return path


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


#: An earlier run's answer worth a briefing's slot (more than a one-line "done": the trivial-run rule),
#: which the agent tests seed and expect back from recall and in the briefing.
SEED_TEXT = ("ledger rounding fixed with Decimal quantize: invoice totals are now summed in integer cents "
             "before the ledger reconciles them")


def run_record(**overrides: Any) -> dict[str, Any]:
    """A small valid run record in forge.example/acme/api; override any top-level field."""
    record: dict[str, Any] = {
        "harness": "api-fixer",
        "adapter": "claude-code",
        "run_id": "1",
        "trace_id": "t-1",
        "started_at": "2026-11-28T09:00:00Z",
        "ended_at": "2026-11-28T09:10:00Z",
        "duration_ms": 600000,
        "outcome": "succeeded",
        "reason": "completed",
        "result_text": "fixed the ledger rounding",
        "spawned_process": True,
        "sessions": [{"session_id": "s1", "cwd": "/srv/api", "repo": "forge.example/acme/api",
                      "git_branch": "main"}],
        "events": [],
    }
    record.update(overrides)
    return record



#: A resident claude-code harness with briefings on: the gateway's tests' configuration.
RESIDENT = '[harness.api-fixer]\nharness = "claude-code"\nmemory_briefing = true\n'


async def wait_ready(service: MemoryService, state: str = "ready") -> None:
    # a hang guard, not a deadline under test: on a loaded machine (load 25 on 2 cores) a provider's
    # subprocess takes a minute to start
    with trio.fail_after(300):
        while (await service.status())["state"] != state:  # noqa: ASYNC110 -- polls the actor over its mailbox
            await trio.sleep(0.01)


@asynccontextmanager
async def serving(holder: ConfigHolder, **options: Any) -> AsyncIterator[tuple[MemoryService, str]]:
    """The embedded service (``open_memory_service(holder, **options)``), ready, with its gateway on
    127.0.0.1 (port 0): ``(service, gateway URL)``. Both stop with the block."""
    async with open_memory_service(holder, **options) as service, trio.open_nursery() as nursery:
        await wait_ready(service)
        url = await start_gateway(service, nursery)
        yield service, url
        nursery.cancel_scope.cancel()


class LogRecords:
    """Every loguru record while in use (`with LogRecords() as logs:`), for tests that assert on log
    lines or wait for one (the daemon's signal task logs from a worker thread: a lock guards the list)."""

    def __init__(self, level: str = "DEBUG") -> None:
        import threading

        self.level = level
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._id: int | None = None

    def __enter__(self) -> LogRecords:
        from loguru import logger

        def sink(message: Any) -> None:
            record = message.record
            with self._lock:
                self.records.append({"level": record["level"].name, "message": record["message"],
                                     "extra": dict(record["extra"])})

        self._id = logger.add(sink, level=self.level)
        return self

    def __exit__(self, *exc: object) -> None:
        from loguru import logger

        if self._id is not None:
            logger.remove(self._id)

    def matching(self, message: str, level: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.records if r["message"] == message and (level is None or r["level"] == level)]

    def mark(self) -> int:
        with self._lock:
            return len(self.records)

    def since(self, mark: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records[mark:])

    async def wait_for(self, message: str, count: int = 1) -> None:
        """Wait until `message` has been logged `count` times: the state, polled, under a deadline."""
        with trio.fail_after(30):
            while len(self.matching(message)) < count:  # noqa: ASYNC110 -- the records come from any thread
                await trio.sleep(0.01)


_RECORDED_QUEUED = re.compile(r"(\d+) recorded, (\d+) queued")


def acknowledged(value: Any) -> Any:
    """Fold "queued" into "recorded" in an outcome, a list of them or a `runs ingest` summary line.

    Both mean the episode is acknowledged and stored; "queued" only says the provider did not answer
    within provider_timeout (a loaded machine) and the record is retried. Tests that are not about that
    difference compare the two as one.
    """
    if isinstance(value, list):
        return [acknowledged(v) for v in value]
    if value == "queued":
        return "recorded"
    if isinstance(value, str):
        return _RECORDED_QUEUED.sub(lambda m: f"{int(m[1]) + int(m[2])} recorded", value)
    return value


_PAUSE = "support.within: real-time pause"


def _threads_at_work() -> bool:
    """Whether a trio worker thread is running a job (named "<fn> from <task>"; idle ones are named
    "Trio thread N"), other than `within`'s own pause."""
    import threading

    return any(" from " in t.name for t in threading.enumerate() if t.name != _PAUSE)


async def within(clock: trio.testing.MockClock, budget: float, call: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    """Await ``call()`` on trio time alone, showing it never waits on a deadline further off than
    ``budget`` seconds; return its result and the trio seconds that passed.

    For "answered within provider_timeout" without a wall-clock assertion. The clock (the ``trio_clock``
    fixture: real time while the test sets up) is frozen for the call and moves only by jumps straight
    to the next deadline, and only to one due within ``budget`` from then, and only while everything
    waits: no task runnable, no worker thread at work, the same next deadline on two looks 5 ms of real
    time apart (so a deadline that guards local work, a store read, is never cut short however loaded
    the machine). A wait on a longer deadline (or on none) never ends, so the call fails here (after
    30 s of real time). Background timers of the service (a flush interval) may be jumped too, so the
    seconds returned are at least those the call waited.
    """
    clock.rate = 0.0
    start = clock.current_time()
    done: list[T] = []
    failed: list[Exception] = []

    async def run() -> None:
        try:
            done.append(await call())
        except Exception as error:  # raised as is below, not wrapped in the nursery's group
            failed.append(error)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            real_end = time.monotonic() + 30
            seen: float | None = None
            while not done and not failed:
                stats = trio.lowlevel.current_statistics()
                due = stats.seconds_to_next_deadline
                waiting = stats.tasks_runnable == 0 and not _threads_at_work()
                # float sums: 0.04 + 0.3 - 0.04 may be 0.30000000000000004
                next_deadline = clock.current_time() + due if waiting and 0 < due <= budget + 1e-6 else None
                if next_deadline is not None and next_deadline == seen:
                    clock.jump(due)
                    seen = None
                else:
                    seen = next_deadline
                if time.monotonic() > real_end:
                    raise AssertionError(f"no answer within {budget} s of trio time "
                                         f"({clock.current_time() - start:g} s passed; next deadline in {due:g} s)")
                await trio.to_thread.run_sync(time.sleep, 0.005, thread_name=_PAUSE)
    finally:
        clock.rate = 1.0
    if failed:
        raise failed[0]
    return done[0], clock.current_time() - start


def refuse_inserts(engine: str, table: str, message: str) -> tuple[str, str]:
    """SQL that makes every insert into `table` fail with `message` on this store engine, and the SQL
    that undoes it: (create, drop). Fault injection for tests that run on both engines."""
    if engine == "postgresql":
        return (f"CREATE FUNCTION refuse_{table}() RETURNS trigger LANGUAGE plpgsql AS"
                f" $$ BEGIN RAISE EXCEPTION '{message}'; END $$;"
                f" CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION refuse_{table}()",
                f"DROP TRIGGER refuse_{table} ON {table}; DROP FUNCTION refuse_{table}()")
    return (f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, '{message}'); END",
            f"DROP TRIGGER refuse_{table}")


def read_terminal(fd: int, out: bytes = b"") -> bytes:
    """``out`` and everything else a pty's controlling side gives until the program on the terminal has
    closed it: end of file, or the EIO Linux answers once no process holds the terminal open."""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk
