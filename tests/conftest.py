"""Shared fixtures: a real config file, a real SQLite state directory, real listeners on port 0."""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import trio.testing

from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from memactors.store import Store
from support import RESIDENT, wait_ready, write_config

#: Variables of a user's own setup that would point a test, or an agent CLI it starts, at their files.
_PROFILE_VARS = ("HARNESS_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "CODEX_HOME", "CLAUDE_CONFIG_DIR",
                 "MEMACTORS_HARNESS", "MEMACTORS_RUN_TOKEN")


@pytest.fixture(scope="session", autouse=True)
def _no_user_profile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite never reads the user's own configuration: HOME is an empty directory of this session's
    and the variables above are unset, for the tests and every process they start. `make test` once
    passed or failed by what the user's profile held (issue 18); each test passes what it needs."""
    saved = {name: os.environ.get(name) for name in ("HOME", *_PROFILE_VARS)}
    os.environ["HOME"] = str(tmp_path_factory.mktemp("home"))
    for name in _PROFILE_VARS:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def _fault_provider_fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One fork server per pytest process for the fault provider (memactors.testing._zygote): each
    fault provider is still its own process on real stdio pipes, but forked from one that imported it
    already, instead of paying ~1.3 s of CPU to import mcp's types: ~100 of them in a run."""
    import subprocess
    import sys

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


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


@pytest.fixture
def make_holder(tmp_path: Path) -> Callable[[str], ConfigHolder]:
    def make(extra: str = "") -> ConfigHolder:
        path = write_config(tmp_path, extra)
        return ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))

    return make


@pytest.fixture
async def memory(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    """The embedded service on embedded defaults (built-in provider, summary without a model API)."""
    async with open_memory_service(make_holder("")) as service:
        await wait_ready(service)
        yield service



@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "m.db")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def served(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[tuple[MemoryService, str]]:
    """A service with a resident claude-code harness (`RESIDENT`) and its gateway on 127.0.0.1: (service, url)."""
    async with open_memory_service(make_holder(RESIDENT)) as service, trio.open_nursery() as nursery:
        await wait_ready(service)
        url = await service.start_gateway(nursery)
        yield service, url
        nursery.cancel_scope.cancel()


@pytest.fixture
def trio_clock() -> trio.testing.MockClock:
    """trio's clock for the test (pytest-trio runs the test on it): real time, until `support.within`
    freezes it to show that a call is answered within a budget of trio time."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture(autouse=True)
def _collect_garbage_per_test() -> Iterator[None]:
    """Collect garbage after every test, so a leaked socket or process warns (and fails) in the test
    that leaked it, not in whichever later test the collector happens to run in.

    Then freeze what survived (gc.freeze): the next collection scans only what later tests allocate.
    Every object a test creates is still collected at its end; what is frozen is what outlived its test
    (imported modules, pydantic's models, caches), which a full collection walked again after every test:
    ~0.09 s of CPU a test, 985 times. pytest_sessionfinish unfreezes and collects what became garbage."""
    yield
    gc.collect()
    gc.freeze()



_CPU_DIR = os.environ.get("MEMACTORS_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:  # noqa: ARG001
    """With MEMACTORS_TEST_CPU=<dir>, note each test's CPU (this process and its reaped children) and
    wall into <dir>/<worker>.tsv, to rank tests by the CPU they cost, not only by their wall time."""
    if not _CPU_DIR:
        yield
        return

    def cpu() -> tuple[float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    own0, kids0 = cpu()
    wall0 = time.monotonic()
    yield
    own1, kids1 = cpu()
    out = Path(_CPU_DIR) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.tsv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as f:
        f.write(f"{item.nodeid}\t{own1 - own0:.3f}\t{kids1 - kids0:.3f}\t{time.monotonic() - wall0:.3f}\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:  # noqa: ARG001
    gc.unfreeze()
    gc.collect()
