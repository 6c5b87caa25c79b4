"""Plugin: the store under test. `engine` ("sqlite", or both engines for a module marked `both_engines`),
this worker's PostgreSQL clusters (`pg_cluster`, `pgvector_cluster`), a fresh database (`pg_url`) or a
reused empty schema (`store_url`), an open `store` on that engine, a fresh pgvector database
(`vector_url`) and a store open on it (`vector_store`), and each engine that holds vectors in turn
(`vector_store_url`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from memactors.store import Store
from memactors.store.engines import open_store

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
async def store(tmp_path: Path, store_url: str | None) -> AsyncIterator[Store]:
    s = await open_store(store_url or tmp_path / "m.db")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def vector_url(pgvector_cluster: Any) -> Iterator[str]:
    """A fresh database on the worker's pgvector server (Debian's PostgreSQL with the pgvector `make
    postgres` compiles, from its own tree: never the system's directories), with the extension created by
    the administrator as docs/fleet.md says (it is not a trusted extension: the daemon's role may not
    create it)."""
    url = pgvector_cluster.create_database()
    name = url.rsplit("/", 1)[1]
    pgvector_cluster.admin("CREATE EXTENSION vector", dbname=name)
    try:
        yield url
    finally:
        pgvector_cluster.drop_database(name)


@pytest.fixture
async def vector_store(vector_url: str) -> AsyncIterator[Store]:
    """The store open on `vector_url` (PostgreSQL with pgvector), closed before the database is dropped."""
    s = await open_store(vector_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=["sqlite", "pgvector"])
def vector_store_url(request: pytest.FixtureRequest) -> str | None:
    """Each engine whose store holds vectors, in turn: None (the SQLite file) or `vector_url`."""
    return None if request.param == "sqlite" else request.getfixturevalue("vector_url")
