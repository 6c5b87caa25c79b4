"""Shared fixtures: a real config file, a real store (SQLite, or PostgreSQL for `both_engines` modules),
real listeners on port 0."""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio.testing

from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from memactors.store import Store
from memactors.store.engines import open_store
from support import RESIDENT, serving, wait_ready, write_config

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


ENGINES = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests in a module marked `both_engines` (the store, index, retention, graph, recall, briefing
    and built-in provider tests) run once per store engine: `[sqlite]` on the embedded file, `[postgresql]`
    on a database of this worker's throwaway PostgreSQL cluster. Everything they reach through the
    `engine` fixture (`store`, `make_holder`, `memory`, `store_url`) is on that engine."""
    if "engine" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_engines"):
        metafunc.parametrize("engine", ENGINES, indirect=True)


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> str:
    """The store engine of this test: "sqlite" unless its module runs on both (`both_engines`)."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """This worker's PostgreSQL server (memactors.testing.postgres), started on first use. Never
    skipped: without the server binaries the tests fail, naming the package `make test` installs."""
    from memactors.testing.postgres import Cluster

    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def pg_url(pg_cluster: Any) -> Iterator[str]:
    """A fresh database of this worker's cluster, dropped after the test (the fleet, migrate and store
    tests want whole databases, not the schemas `engine` tests get)."""
    url = pg_cluster.create_database()
    try:
        yield url
    finally:
        pg_cluster.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def pgvector_cluster() -> Iterator[Any]:
    """This worker's PostgreSQL server with pgvector: Debian's server with the portable pgvector that
    `make postgres` builds into its own tree (memactors.testing.pgvector_build), started on first use,
    for the pgvector tests only — the others run on Debian's server itself (`pg_cluster`). Never
    skipped: without the tree, or when its server cannot start, the tests fail naming what is missing."""
    from memactors.testing.postgres import Cluster

    cluster = Cluster(pgvector=True)
    try:
        yield cluster
    finally:
        cluster.close()


class _Schemas:
    """Empty stores on this worker's cluster, one PostgreSQL schema each, reused: a test takes one, and
    gives it back emptied (TRUNCATE … RESTART IDENTITY: empty tables, ids from 1 again), so the migrations
    run once per schema, not once per test (a database per test cost ~0.5 s of setup each)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.url = cluster.create_database("memactors_tests")
        self.free: list[str] = []
        self.made = 0

    def take(self) -> tuple[str, str]:
        if self.free:
            name = self.free.pop()
        else:
            self.made += 1
            name = f"t{self.made}"
            self.cluster.admin(f"CREATE SCHEMA {name} AUTHORIZATION memactors", dbname="memactors_tests")
        # search_path: the test's schema, then public (where extensions such as pgvector put their types)
        return name, f"{self.url}?options=-csearch_path%3D{name},public"

    def give_back(self, name: str) -> None:
        import re

        from memactors.store.pg import MIGRATIONS

        ours = {t for _, sql in MIGRATIONS if isinstance(sql, str) for t in re.findall(r"CREATE TABLE (\w+)", sql)}
        tables = [r[0] for r in self.cluster.admin(
            f"SELECT tablename FROM pg_tables WHERE schemaname = '{name}' AND tablename <> 'memactors_migrations'",
            dbname="memactors_tests")]
        emptied = ", ".join(f"{name}.{t}" for t in tables if t in ours)
        dropped = ", ".join(f"{name}.{t}" for t in tables if t not in ours)  # made by the test itself
        try:
            self.cluster.admin("SET lock_timeout = '10s';"
                               + (f" TRUNCATE {emptied} RESTART IDENTITY CASCADE;" if emptied else "")
                               + (f" DROP TABLE {dropped} CASCADE;" if dropped else ""), dbname="memactors_tests")
        except Exception:  # still in use by a connection the test left open: not reused
            return
        self.free.append(name)


@pytest.fixture(scope="session")
def pg_schemas(pg_cluster: Any) -> _Schemas:
    return _Schemas(pg_cluster)


@pytest.fixture
def store_url(engine: str, request: pytest.FixtureRequest) -> Iterator[str | None]:
    """An empty PostgreSQL store's URL when the test runs on PostgreSQL (a schema of this worker's
    cluster, emptied after the test), else None."""
    if engine != "postgresql":
        yield None
        return
    schemas: _Schemas = request.getfixturevalue("pg_schemas")
    name, url = schemas.take()
    try:
        yield url
    finally:
        schemas.give_back(name)


@pytest.fixture
def config_path(tmp_path: Path, store_url: str | None) -> Path:
    return write_config(tmp_path, store_url=store_url)


@pytest.fixture
def make_holder(tmp_path: Path, store_url: str | None) -> Callable[[str], ConfigHolder]:
    def make(extra: str = "") -> ConfigHolder:
        path = write_config(tmp_path, extra, store_url=store_url)
        return ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))

    return make


@pytest.fixture
async def memory(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    """The embedded service on embedded defaults (built-in provider, summary without a model API)."""
    async with open_memory_service(make_holder("")) as service:
        await wait_ready(service)
        yield service



@pytest.fixture
async def store(tmp_path: Path, store_url: str | None) -> AsyncIterator[Store]:
    s = await open_store(store_url or tmp_path / "m.db")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def served(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[tuple[MemoryService, str]]:
    """A service with a resident claude-code harness (`RESIDENT`) and its gateway on 127.0.0.1: (service, url)."""
    async with serving(make_holder(RESIDENT)) as answer:
        yield answer


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
