"""Plugin: the fault provider (memactors.testing) as the tests configure it: one fork server per pytest process,
the files a fault provider writes (`FaultFiles`), its configuration (`fault_toml`), and polling, a shiftable
clock and metric samples for the provider-layer tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from memactors.testing import fault_provider_params


@pytest.fixture(scope="session", autouse=True)
def _fault_provider_fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One fork server per pytest process for the fault provider (memactors.testing._zygote): each
    fault provider is still its own process on real stdio pipes, but forked from one that imported it
    already, instead of paying ~1.3 s of CPU to import mcp's types: ~100 of them in a run."""
    from memactors.testing import _zygote

    path = str(tmp_path_factory.mktemp("zygote") / "s")
    # not waited for: it imports while the first tests run; a launcher waits for its socket. It exits at
    # EOF on its stdin, so it does not outlive a worker that dies without this teardown.
    server = subprocess.Popen([sys.executable, _zygote.__file__, "serve", path], stdin=subprocess.PIPE)
    os.environ["MEMACTORS_FAULT_ZYGOTE"] = path
    try:
        yield
    finally:
        del os.environ["MEMACTORS_FAULT_ZYGOTE"]
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)


@attrs.define
class FaultFiles:
    """The files a fault-provider subprocess writes or reads, under one directory."""

    root: Path

    @property
    def calls(self) -> Path:
        return self.root / "calls.jsonl"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def pid(self) -> Path:
        return self.root / "provider.pid"

    def read_calls(self) -> list[dict[str, Any]]:
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines() if line.strip()]

    def tools(self) -> list[str]:
        return [c["tool"] for c in self.read_calls()]

    def stored(self) -> dict[str, Any]:
        return json.loads(self.state.read_text())["items"] if self.state.exists() else {}

    def read_pid(self) -> int | None:
        try:
            return int(self.pid.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def set_modes(self, *modes: str) -> None:
        self.control.write_text(",".join(modes))


def fault_toml(files: FaultFiles, *modes: str, name: str = "fault", provider: bool = True,
               provider_timeout: str = "1s", extra_episodes: str = "", state: bool = True, control: bool = True,
               pid: Path | bool = True) -> str:
    """TOML declaring `[mcp.<name>]` as the fault provider (stdio subprocess), selected as provider.

    It appends every call to `files.calls`; it keeps its items in `files.state` (else in memory, gone when it
    exits) unless not `state`; while `files.control` exists its modes are replaced by the file's (unless not
    `control`); it writes its pid first to `files.pid`, or to the file `pid` names, or nowhere (False), so a
    test can SIGKILL or SIGSTOP it."""
    files.root.mkdir(parents=True, exist_ok=True)
    params = fault_provider_params(*modes, calls_file=files.calls, state_file=files.state if state else None,
                                   control_file=files.control if control else None, pid_file=files.pid if pid is True else pid or None)
    text = ""
    if provider:
        text += f'[memory]\nprovider = "{name}"\n'
        text += f'[memory.episodes]\nprovider_timeout = "{provider_timeout}"\n{extra_episodes}'
    text += f"[mcp.{name}]\ncommand = {json.dumps(params.command)}\nargs = {json.dumps(list(params.args))}\n"
    return text


async def poll(condition: Callable[[], Awaitable[bool] | bool], *, seconds: float = 20.0, what: str = "condition") -> None:
    """Wait, in real time, for something another task or process makes true.

    Sleeps in a worker thread, so it works under a frozen `MockClock` too.
    """
    end = time.monotonic() + seconds
    while True:
        value = condition()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{what} not met within {seconds} s")
        await trio.to_thread.run_sync(time.sleep, 0.02)


@attrs.define
class ShiftableClock:
    """A wall clock: a fixed start plus trio time elapsed (so MockClock drives it) plus a manual shift."""

    start: datetime = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    shift: timedelta = timedelta(0)
    follow_trio: bool = True
    _t0: float | None = None

    def __call__(self) -> datetime:
        elapsed = 0.0
        if self.follow_trio:
            try:
                now = trio.current_time()
            except RuntimeError:
                now = 0.0
            if self._t0 is None:
                self._t0 = now
            elapsed = now - self._t0
        return self.start + self.shift + timedelta(seconds=elapsed)


def exposition(metrics: Any) -> str:
    return metrics.exposition().decode()


def sample(metrics: Any, name: str, **labels: str) -> float | None:
    """The value of one sample in the /metrics exposition (labels matched exactly), None if absent:
    `metrics` is a `Metrics` or the exposition's text as scraped. (A service's counter, 0 before its
    first increment: support_readside.sample.)"""
    from prometheus_client.parser import text_string_to_metric_families

    text = metrics if isinstance(metrics, str) else exposition(metrics)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None
