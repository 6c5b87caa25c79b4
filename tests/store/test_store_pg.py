"""The store on PostgreSQL — what only a shared, networked engine has.

Several daemons on one store (claims under FOR UPDATE SKIP LOCKED, the prune under an advisory lock,
migrations once, the same run ingested twice), the password never shown, one WARN without pgvector,
and an outage contained like a provider's. A real PostgreSQL server throughout (the worker's cluster,
or one of the test's own where the test stops it); the same-behaviour tests of the store, index,
retention, graph, recall, briefing and built-in provider run on both engines in their own modules.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from memactors.actors.retention import Retention
from memactors.config import ConfigHolder, load_config
from memactors.errors import StoreUnavailable
from memactors.metrics import Metrics
from memactors.modelapi import ModelApiClient
from memactors.service import MemoryService, open_memory_service
from memactors.store import Store, iso
from memactors.store.engines import open_store
from memactors.testing.fake_model_api import FakeModelApi
from memactors.testing.postgres import Cluster
from support import LogRecords, run_record, wait_ready, within, write_config
from support_readside import API, as_run

pytestmark = pytest.mark.fleet

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def holder_for(tmp_path: Path, url: str, extra: str = "", name: str = "a") -> ConfigHolder:
    """A daemon's configuration of its own (state directory `name`) on the store at `url`."""
    home = tmp_path / name
    home.mkdir(parents=True, exist_ok=True)
    path = write_config(home, extra, store_url=url)
    return ConfigHolder(lambda: load_config(path, env={"HOME": str(home)}))



# -- several daemons, one store -------------------------------------------------------------------------

async def test_daemons_starting_together_migrate_the_store_once(pg_url: str) -> None:
    stores: list[Store] = []

    async def open_one(n: int) -> None:
        stores.append(await open_store(pg_url, daemon_id=f"d{n}"))

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(open_one, n)
    try:
        names = await stores[0].read(lambda db: [r[0] for r in db.execute(
            "SELECT name FROM memactors_migrations ORDER BY name")])
        assert names == sorted(set(names)) and "0001_initial" in names and "0002_builtin" in names
    finally:
        for s in stores:
            s.close()


def _retention(store: Store) -> Retention:
    from memactors.actors.kernel import open_mailbox

    address, _ = open_mailbox("unused", 1)
    return Retention(store=store, provider="builtin", provider_address=address, index_address=address,
                     metrics=Metrics(), wall_clock=lambda: NOW, provider_timeout=2.0)


async def test_two_daemons_claim_disjoint_pending_rows(pg_url: str) -> None:
    """Every due pending row is claimed by exactly one daemon (FOR UPDATE SKIP LOCKED), however their
    claims interleave; a claimed row is nobody else's until its claim runs out."""
    a, b = await open_store(pg_url, daemon_id="host-a"), await open_store(pg_url, daemon_id="host-b")
    try:
        rows = [("forget", "builtin", f"ep_{n:04d}", f"ep_{n:04d}", iso(NOW), iso(NOW - timedelta(seconds=n)))
                for n in range(600)]
        await a.write(lambda db: db.executemany(
            "INSERT INTO pending (kind, provider, episode_id, provider_id, first_at, next_at) VALUES (?,?,?,?,?,?)",
            rows))
        claimed: dict[str, list[str]] = {"host-a": [], "host-b": []}

        async def drain(store: Store) -> None:
            retention = _retention(store)
            while batch := await retention._due():
                claimed[store.daemon_id] += [attempt.episode_id for attempt in batch]

        # One batch each first, in turn: host-b's claim skips what host-a holds (and both hold some, which
        # a free-for-all on a loaded machine does not promise: one daemon's claimers may take every row).
        for store in (a, b):
            claimed[store.daemon_id] += [attempt.episode_id for attempt in await _retention(store)._due()]
        assert claimed["host-a"] and claimed["host-b"] and not set(claimed["host-a"]) & set(claimed["host-b"])
        async with trio.open_nursery() as nursery:
            for store in (a, b, a, b):  # then two concurrent claimers per daemon
                nursery.start_soon(drain, store)
        everyone = claimed["host-a"] + claimed["host-b"]
        assert sorted(everyone) == sorted(r[2] for r in rows)  # each row once, none twice
        owners = await a.read(lambda db: dict(db.execute(
            "SELECT claimed_by, count(*) FROM pending GROUP BY claimed_by").fetchall()))
        assert owners == {"host-a": len(claimed["host-a"]), "host-b": len(claimed["host-b"])}
    finally:
        a.close()
        b.close()


async def test_the_prune_runs_on_one_daemon_at_a_time(pg_url: str) -> None:
    a, b = await open_store(pg_url, daemon_id="host-a"), await open_store(pg_url, daemon_id="host-b")
    try:
        async with a.singleton("prune") as mine:
            assert mine
            async with b.singleton("prune") as theirs:
                assert not theirs  # held by host-a: host-b skips it (never waits)
            async with b.singleton("migrate-other") as other:
                assert other  # another singleton is free
        async with b.singleton("prune") as now_mine:
            assert now_mine
    finally:
        a.close()
        b.close()


async def test_the_same_run_ingested_on_two_hosts_is_one_episode_and_the_second_is_a_duplicate(
        tmp_path: Path, pg_url: str) -> None:
    record = run_record(run_id="r-twice", result_text="fixed the ledger rounding")
    async with open_memory_service(holder_for(tmp_path, pg_url, name="a")) as a, \
            open_memory_service(holder_for(tmp_path, pg_url, name="b")) as b:
        await wait_ready(a)
        await wait_ready(b)
        assert a.store.daemon_id != b.store.daemon_id
        results: list[dict[str, Any]] = []

        async def ingest(service: MemoryService) -> None:
            results.append(await service.ingest_run(record))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ingest, a)
            nursery.start_soon(ingest, b)
        outcomes = sorted(r["outcome"] for r in results)
        assert outcomes[0] == "duplicate" and outcomes[1] in ("recorded", "queued"), results
        assert results[0]["episode_id"] == results[1]["episode_id"]
        counts = await a.store.read(lambda db: db.execute(
            "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM episodes),"
            " (SELECT count(*) FROM run_records), (SELECT count(*) FROM episode_bodies)").fetchone())
        assert tuple(counts) == (1, 1, 1, 1)  # the loser's rows rolled back or removed
        # Either daemon sees it, and recall on the other finds it in the caller's scope.
        _, view = await as_run(b, "api-fixer", "200", API)
        answer = await b.agent_recall(view, query="ledger rounding")
        assert results[0]["episode_id"] in answer.text


# -- the password ---------------------------------------------------------------------------------------

async def test_the_store_password_is_never_shown(tmp_path: Path, pg_cluster: Cluster, pg_url: str) -> None:
    secret = pg_cluster.password
    assert secret in pg_url
    with LogRecords() as logs:
        holder = holder_for(tmp_path, pg_url)
        assert secret not in repr(holder.current) and secret not in repr(holder.current.store)
        async with open_memory_service(holder) as memory:
            await wait_ready(memory)
            status = await memory.status()
            doctor = await memory.doctor()
        # a wrong password: the error names the store, never a password
        wrong = pg_url.replace(secret, "not-the-password")
        with pytest.raises(StoreUnavailable) as refused:
            await open_store(wrong)
    assert status["store"]["where"] == f"postgresql memactors@127.0.0.1:{pg_cluster.port}/{pg_url.rsplit('/', 1)[1]}"
    assert status["store"]["daemon_id"] and status["store"]["reachable"]
    assert "memory store" in [r["name"] for r in doctor["rows"]]
    shown = [str(status), str(doctor), str(refused.value), *(str(r) for r in logs.records)]
    assert not [s for s in shown if secret in s or "not-the-password" in s]
    assert "password authentication failed" in str(refused.value)
    assert f"127.0.0.1:{pg_cluster.port}" in str(refused.value)


def test_a_bad_store_url_is_refused_naming_the_key_without_its_password(tmp_path: Path) -> None:
    from memactors.errors import ConfigError

    path = write_config(tmp_path, store_url="mysql://app:hunter2@db.example/memory")
    with pytest.raises(ConfigError) as bad:
        load_config(path, env={"HOME": str(tmp_path)})
    assert "[store] url" in str(bad.value) and "hunter2" not in str(bad.value) and "[REDACTED]" in str(bad.value)
    path = write_config(tmp_path)
    env = {"HOME": str(tmp_path), "MEMACTORS_STORE_URL": "postgresql://app:hunter2@db.example:5432/memory"}
    config = load_config(path, env=env)
    assert config.store.url == env["MEMACTORS_STORE_URL"] and "hunter2" not in repr(config)


# -- pgvector -------------------------------------------------------------------------------------------

async def test_without_pgvector_hybrid_ranking_warns_once_and_recall_ranks_by_text(
        tmp_path: Path, pg_url: str, pg_cluster: Cluster) -> None:
    from memactors.testing.fake_model_api import FakeBehaviour, run_fake_model_api

    # The role may not create extensions in this database (as on a server where pgvector is not
    # installed, or a managed one that does not allow it): whether or not this machine has pgvector.
    pg_cluster.admin(f'REVOKE CREATE ON DATABASE "{pg_url.rsplit("/", 1)[1]}" FROM memactors, PUBLIC')

    async with run_fake_model_api(behaviour=FakeBehaviour(embed_mode="bag_of_words", embed_dim=16)) as api:
        holder = holder_for(tmp_path, pg_url, f'[model_api]\nbase_url = "{api.base_url}"\nembedding_model = "e"\n')
        with LogRecords() as logs:
            async with open_memory_service(holder) as memory:
                await wait_ready(memory)
                result = await memory.ingest_run(run_record())
                found = await memory.recall(query="ledger rounding", repo=API)
        warned = [r for r in logs.records if r["level"] == "WARNING" and "pgvector" in r["message"]]
    assert len(warned) == 1
    assert [e["episode_id"] for e in found["episodes"]] == [result["episode_id"]]
    assert found["degraded"] is None


def test_the_pgvector_tests_run_on_the_portable_build_never_the_systems_server(
        pgvector_cluster: Cluster) -> None:
    """The vector path is tested on the tree `make postgres` builds (Debian's server copied, pgvector
    compiled with portable flags into it), whatever this machine has in /usr/lib/postgresql (Debian 12
    has no pgvector; a hand-built one there is not what CI has)."""
    from memactors.testing.pgvector_build import read_stamp
    from memactors.testing.postgres import pgvector_install

    tree = pgvector_install()
    assert pgvector_cluster.install is not None and not pgvector_cluster.bindir.is_relative_to("/usr")
    assert pgvector_cluster.bindir.is_relative_to(tree) or pgvector_cluster.bindir.is_relative_to(pgvector_cluster.root)
    assert pgvector_cluster.bindir.parts[-5:-2] == ("usr", "lib", "postgresql")  # Debian's layout, copied
    running = pgvector_cluster.admin("SELECT setting FROM pg_settings WHERE name = 'data_directory'")
    assert running == [(str(pgvector_cluster.data),)]
    (available,) = pgvector_cluster.admin(
        "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
    stamp = read_stamp(tree)
    assert stamp is not None and available[0] == stamp["pgvector"]  # the tree's own share/…/extension
    assert "OPTFLAGS=" in stamp["make_flags"] and (tree / stamp["vector_so"]).exists()


def test_an_hnsw_index_builds_and_answers_on_this_cpu(pgvector_cluster: Cluster) -> None:
    """The reproduction: on a CPU without AVX-512 the wheel's pgvector killed the backend with
    SIGILL at the first `CREATE INDEX … USING hnsw`. The portable build builds it, a query ordered by
    cosine distance is answered through it, and no backend of the server died."""
    import psycopg

    url = pgvector_cluster.create_database()
    name = url.rsplit("/", 1)[1]
    try:
        pgvector_cluster.admin("CREATE EXTENSION vector", dbname=name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v vector(3))")
            conn.execute("INSERT INTO t SELECT i, ARRAY[cos(i), sin(i), i % 7]::float4[]::vector "
                         "FROM generate_series(1, 100) i")
            conn.execute("CREATE INDEX t_hnsw ON t USING hnsw (v vector_cosine_ops)")
            conn.execute("SET enable_seqscan = off")
            query = "SELECT id FROM t ORDER BY v <=> '[1, 0, 0]' LIMIT 3"
            plan = [r[0] for r in conn.execute(f"EXPLAIN {query}").fetchall()]
            assert any("t_hnsw" in line for line in plan), plan
            ids = [r[0] for r in conn.execute(query).fetchall()]
        assert len(ids) == 3 and set(ids) <= set(range(1, 101))
        log = pgvector_cluster.log.read_text(encoding="utf-8", errors="replace")
        assert "terminated by signal" not in log, log[-2000:]
    finally:
        pgvector_cluster.drop_database(name)


def test_the_pgvector_server_starts_from_a_virtualenv_the_postgres_user_cannot_reach(
        tmp_path: Path) -> None:
    """CI's clone (and so its virtualenv) may live where the `postgres` user cannot go (a 0700 home):
    the server tree is staged into the cluster's own directory first, layout kept (PostgreSQL finds its
    lib and share directories relative to its programs), and runs there."""
    import shutil

    from memactors.testing.postgres import pgvector_install

    install = pgvector_install()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    moved = private / "venv" / "pgvector"
    shutil.copytree(install, moved, symlinks=True)
    with Cluster(install=moved) as cluster:
        if os.geteuid() == 0:  # the server runs as `postgres`, who cannot reach `private`
            assert cluster.bindir.is_relative_to(cluster.root) and not cluster.bindir.is_relative_to(private)
        url = cluster.create_database("v")
        cluster.admin("CREATE EXTENSION vector", dbname="v")
        assert cluster.admin("SELECT extname FROM pg_extension WHERE extname = 'vector'", dbname="v")
        assert url.endswith("/v")


def test_a_cluster_starts_where_the_postgres_user_cannot_enter_the_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0700 TMPDIR (pam_tmpdir's /tmp/user/0, or a /tmp made 0700): under root the server runs as
    `postgres`, who could not reach a cluster there; the cluster goes to /var/tmp and starts."""
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    with Cluster() as cluster:
        assert cluster.root.is_relative_to("/var/tmp" if os.geteuid() == 0 else private)
        assert cluster.create_database("x").endswith("/x")


async def test_with_pgvector_hybrid_recall_fuses_cosine_on_postgresql(
        vector_store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    """REQ-11's hybrid ranking on PostgreSQL: vectors in pgvector (HNSW, cosine), embedded once per
    content, fused with the text ranking by RRF; a cosine-only hit comes back; scope holds. On the
    portable pgvector build on Debian's server (`pgvector_cluster`), so it runs on every machine `make
    test` runs on;
    the test above covers a server without pgvector."""
    from memactors.builtin import BuiltinProvider, missing_vectors

    a, b = "project:forge.example/acme/api", "project:forge.example/acme/web"

    def args(eid: str, text: str, scope: str = a) -> dict[str, Any]:
        return {"episode_id": eid, "scope": scope, "trust_class": "standard", "text": text,
                "episode": {"started_at": "2026-11-28T09:00:00Z", "files_touched": [], "summary": None}}

    store, api, client = vector_store, bag_of_words_api, embed_client
    # No floor: the fusion's every candidate (the fake model's cosine-only hits are noise).
    p = BuiltinProvider(store, embedder=client.embed, embedding_model="fake-embed", relevance_floor=0.0)
    assert await p.check_vectors()
    await p.record(args("ep_1", "rounding error in invoices"))
    await p.record(args("ep_2", "totally different words here"))
    assert api.requests_to("/v1/embeddings") == []  # recording never waits for the model
    assert await p.embed_pending() == 2  # the background embedder's pass: one batch
    await p.record(args("ep_9", "rounding error in invoices"))  # same content: the cache
    await p.record(args("ep_b", "totally different words here", scope=b))
    assert await p.embed_pending() == 2
    assert len(api.requests_to("/v1/embeddings")) == 1
    assert await store.read(missing_vectors) == 0
    assert await store.read(lambda db: db.execute("SELECT count(*) FROM builtin_vec").fetchone()[0]) == 4
    kinds = await store.read(lambda db: db.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'builtin_vec'").fetchall())
    assert any("(scope, cell)" in k[0] for k in kinds)  # the cells' b-tree (builtin.vector_cells)
    form = await store.read(lambda db: db.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'builtin_vec'::regclass AND attname = 'embedding'").fetchone()[0])
    assert form == "halfvec(64)"  # half float32's bytes
    out = await p.recall({"query": "different words", "scope": [a], "limit": 5})
    ids = [i["id"] for i in out["items"]]
    assert ids[0] == "ep_2" and set(ids) == {"ep_1", "ep_2", "ep_9"}  # cosine-only hits too
    assert "degraded" not in out
    # scope holds in the cosine ranking too: the other scope's twin of ep_2 alone
    other = await p.recall({"query": "rounding", "scope": [b], "limit": 5})
    assert [i["id"] for i in other["items"]] == ["ep_b"]
    # a forget takes the vector with the document
    assert await p.forget({"id": "ep_2"}) == {"forgotten": True}
    assert await store.read(lambda db: db.execute("SELECT count(*) FROM builtin_vec").fetchone()[0]) == 3
    # each vector is stored once: the cache points at its document's, and keeps a copy only
    # when that document goes (REQ-11's cache by content and model outlives it)
    def copies(db: Any) -> int:
        return int(db.execute("SELECT count(*) FROM builtin_embed_cache"
                              " WHERE length(vector) > 0").fetchone()[0])

    assert await store.read(copies) == 0
    assert await p.forget({"id": "ep_9"}) == {"forgotten": True}
    assert await p.forget({"id": "ep_1"}) == {"forgotten": True}
    assert await store.read(copies) == 1
    requests = len(api.requests_to("/v1/embeddings"))  # the recalls' queries were embedded
    await p.record(args("ep_3", "rounding error in invoices"))
    assert await p.embed_pending() == 1
    assert len(api.requests_to("/v1/embeddings")) == requests  # from the cache
    assert await store.read(copies) == 0
    # a store from before: every cache row a copy; at start they point at the documents
    def before(db: Any) -> None:
        db.execute("UPDATE builtin_embed_cache SET vector = ?, doc_id = NULL", [b"\0" * 256])
        db.execute("DELETE FROM builtin_meta WHERE key = 'cache_form'")

    await store.write(before)
    assert await p.check_vectors()
    assert await store.read(copies) == 0


async def test_with_pgvector_the_daemon_ranks_hybrid_and_warns_nothing(
        tmp_path: Path, vector_url: str) -> None:
    """The daemon as a user configures it (`[store] url`, `[model_api] embedding_model`) on a database
    with pgvector: no WARN at start, every ingested episode gets its vector (doctor has nothing to say
    about embeddings), and recall through the service fuses the cosine ranking: an episode sharing no
    word with the query still comes back in the caller's repository, after the text match, and nothing
    of another repository does."""
    from memactors.testing.fake_model_api import FakeBehaviour, run_fake_model_api

    other_repo = [{"session_id": "s1", "cwd": "/srv/web", "repo": "forge.example/acme/web", "git_branch": "main"}]
    async with run_fake_model_api(behaviour=FakeBehaviour(embed_mode="bag_of_words", embed_dim=32)) as api:
        holder = holder_for(tmp_path, vector_url,
                            f'[model_api]\nbase_url = "{api.base_url}"\nembedding_model = "e"\n'
                            # every fused match, cosine-only ones too (the fake model's are noise under the floor)
                            '[memory]\nrelevance_floor = 0\n')
        with LogRecords() as logs:
            async with open_memory_service(holder) as memory:
                await wait_ready(memory)
                text_hit = await memory.ingest_run(run_record(run_id="r1", result_text="fixed the ledger rounding"))
                cosine_only = await memory.ingest_run(run_record(run_id="r2", result_text="refactored billing"))
                elsewhere = await memory.ingest_run(run_record(run_id="r3", result_text="fixed the ledger rounding",
                                                              sessions=other_repo))
                assert {r["outcome"] for r in (text_hit, cosine_only, elsewhere)} == {"recorded"}
                assert await memory.builtin.wait_embedded() == 0  # in the background
                found = await memory.recall(query="ledger rounding", repo=API)
                doctor = await memory.doctor()
                vectors = await memory.store.read(lambda db: db.execute(
                    "SELECT count(*) FROM builtin_vec").fetchone()[0])
        warned = [r for r in logs.records if r["level"] == "WARNING" and "pgvector" in r["message"]]
    assert warned == []
    assert vectors == 3
    assert "memory embeddings" not in [r["name"] for r in doctor["rows"]]
    assert found["degraded"] is None
    assert [e["episode_id"] for e in found["episodes"]] == [text_hit["episode_id"], cosine_only["episode_id"]]


async def test_store_migrate_moves_sqlite_vec_vectors_into_pgvector(tmp_path: Path, vector_url: str) -> None:
    """`memactors store migrate` (the CLI, as a subprocess) from a SQLite store with hybrid ranking:
    every episode's vector lands in pgvector (no model call: they are copied), and the daemon on
    PostgreSQL ranks hybrid at once."""
    from memactors.testing.fake_model_api import FakeBehaviour, run_fake_model_api

    async with run_fake_model_api(behaviour=FakeBehaviour(embed_mode="bag_of_words", embed_dim=32)) as api:
        model = (f'[model_api]\nbase_url = "{api.base_url}"\nembedding_model = "e"\n'
                 '[memory]\nrelevance_floor = 0\n')  # every fused match (the fake model's cosines are noise)
        config = write_config(tmp_path, model)
        holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(tmp_path)}))
        async with open_memory_service(holder) as memory:
            await wait_ready(memory)
            ids = [(await memory.ingest_run(run_record(run_id=f"r{n}", result_text=text)))["episode_id"]
                   for n, text in enumerate(("fixed the ledger rounding", "refactored billing", "tidied docs"))]
            assert await memory.builtin.wait_embedded() == 0
        embedded = len(api.requests_to("/v1/embeddings"))
        env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
        done = await trio.run_process([sys.executable, "-m", "memactors.cli", "store", "migrate", "--to", vector_url,
                                       "--json"], env=env, capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode()
        assert json.loads(done.stdout)["ok"]
        target = await open_store(vector_url)
        try:
            moved = await target.read(lambda db: db.execute(
                "SELECT d.episode_id FROM builtin_vec v JOIN builtin_docs d ON d.doc_id = v.doc_id").fetchall())
        finally:
            target.close()
        assert sorted(r[0] for r in moved) == sorted(ids)
        assert len(api.requests_to("/v1/embeddings")) == embedded  # copied, not embedded again
        async with open_memory_service(holder_for(tmp_path, vector_url, model, name="pg")) as memory:
            await wait_ready(memory)
            found = await memory.recall(query="ledger rounding", repo=API)
    assert found["degraded"] is None
    assert [e["episode_id"] for e in found["episodes"]][0] == ids[0]
    assert set(e["episode_id"] for e in found["episodes"]) == set(ids)  # the others by cosine alone


# -- serve-builtin on PostgreSQL -----------------------------------------------------------------------

def _serve_builtin(pg_url: str | None = None) -> str:
    """An `[mcp.bi]` upstream: `memactors provider serve-builtin --stdio` (with `--db pg_url` when given)."""
    db = f', "--db", "{pg_url}"' if pg_url else ""
    # provider_timeout 10 s: the connection budget (5 × it) must cover the subprocess's start on a loaded
    # machine, where 10 s (the default's) did not; no deadline is what these tests are about
    return (f'[mcp.bi]\ncommand = "{sys.executable}"\n'
            f'args = ["-m", "memactors.cli", "provider", "serve-builtin", "--stdio"{db}]\n'
            '[memory.episodes]\nprovider_timeout = "10s"\n')


async def test_serve_builtin_serves_a_postgresql_store_as_an_upstream(tmp_path: Path, pg_url: str) -> None:
    """`memactors provider serve-builtin --stdio --db postgresql://…` as a daemon's `[mcp.bi]` upstream
    (the CLI, a subprocess on real stdio): the conformance suite passes, an ingested run is recorded
    through it into PostgreSQL (`builtin_docs` there, tsvector), and recall finds it."""
    config = write_config(tmp_path, '[memory]\nprovider = "bi"\n' + _serve_builtin(pg_url))
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(tmp_path)}))
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        report = await memory.check_provider("bi")
        assert [c["status"] for c in report["checks"]] == ["pass"] * 7, report
        result = await memory.ingest_run(run_record(result_text="fixed the ledger rounding"))
        assert result["outcome"] == "recorded"
        found = await memory.recall(query="ledger rounding", repo=API)
    assert [e["episode_id"] for e in found["episodes"]] == [result["episode_id"]]
    store = await open_store(pg_url)
    try:
        docs = await store.read(lambda db: [r[0] for r in db.execute("SELECT episode_id FROM builtin_docs")])
    finally:
        store.close()
    assert result["episode_id"] in docs
    # the daemon's own store (SQLite here) holds no document: the upstream's are in PostgreSQL
    assert await _sqlite_docs(tmp_path / "state" / "memactors.db") == []


async def _sqlite_docs(path: Path) -> list[str]:
    store = await open_store(path)
    try:
        return await store.read(lambda db: [r[0] for r in db.execute("SELECT episode_id FROM builtin_docs")])
    finally:
        store.close()


async def test_serve_builtin_without_db_serves_the_configured_postgresql_store(
        tmp_path: Path, pg_url: str) -> None:
    """Without `--db`, `serve-builtin` serves the store the configuration names — `[store] url` when
    set — not the state directory's SQLite file."""
    import mcp

    from memactors.conformance import synthetic_episode

    config = write_config(tmp_path, store_url=pg_url)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    params = mcp.StdioServerParameters(command=sys.executable, args=[
        "-m", "memactors.cli", "provider", "serve-builtin", "--stdio"], env=env)
    episode, text = synthetic_episode("served")
    async with mcp.Client(params) as client:
        recorded = await client.call_tool("memory_record_episode", {
            "episode_id": episode["episode_id"], "scope": episode["scope"], "trust_class": "standard",
            "episode": episode, "text": text})
        assert not recorded.is_error, recorded.content
        recalled = await client.call_tool("memory_recall", {"query": "conformance check served",
                                                            "scope": [episode["scope"]], "limit": 5})
    assert [i["id"] for i in recalled.structured_content["items"]] == [episode["episode_id"]]
    store = await open_store(pg_url)
    try:
        docs = await store.read(lambda db: [r[0] for r in db.execute("SELECT episode_id FROM builtin_docs")])
    finally:
        store.close()
    assert docs == [episode["episode_id"]]
    assert not await trio.Path(tmp_path / "state" / "memactors.db").exists()


async def test_serve_builtin_refuses_a_url_it_cannot_serve_naming_the_option(
        tmp_path: Path, pg_cluster: Cluster) -> None:
    """A URL that is no PostgreSQL store is refused naming `--db`, its password masked, and is never
    taken for a file name; a PostgreSQL store that cannot be reached is one line naming the store, no
    password, no traceback."""
    import socket

    async def serve(db: str) -> Any:
        return await trio.run_process(
            [sys.executable, "-m", "memactors.cli", "provider", "serve-builtin", "--stdio", "--db", db],
            cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}, stdin=b"", capture_stdout=True,
            capture_stderr=True, check=False)

    refused = await serve("mysql://app:hunter2@db.example/memory")
    err = refused.stderr.decode()
    assert refused.returncode != 0 and "--db" in err and "PostgreSQL" in err and "hunter2" not in err, err
    assert "Traceback" not in err and list(await trio.Path(tmp_path).iterdir()) == []  # no "mysql:" directory
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = await serve(f"postgresql://memactors:not-shown-pw@127.0.0.1:{port}/memory")
    err = down.stderr.decode()
    assert down.returncode != 0 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("memactors: ") and f"127.0.0.1:{port}/memory" in last and "not-shown-pw" not in err


# -- an outage ------------------------------------------------------------------------------------------

@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A cluster this test may stop and start without disturbing the worker's other tests."""
    with Cluster() as cluster:
        yield cluster


@pytest.fixture
def trio_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=1.0)


async def test_a_store_outage_is_contained_and_work_resumes_without_a_restart(
        tmp_path: Path, own_cluster: Cluster, trio_clock: trio.testing.MockClock) -> None:
    url = own_cluster.create_database("memory")
    holder = holder_for(tmp_path, url, '[memory.episodes]\nprovider_timeout = "1s"\n')
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        first = await memory.ingest_run(run_record(run_id="before", result_text="ledger rounding fixed"))
        assert first["outcome"] == "recorded"
        _, view = await as_run(memory, "api-fixer", "300", API)

        await trio.to_thread.run_sync(own_cluster.stop)
        # IngestRun: UNAVAILABLE, naming the store, nothing acknowledged
        with pytest.raises(StoreUnavailable) as refused:
            await memory.ingest_run(run_record(run_id="during", result_text="ledger rounding again"))
        assert refused.value.code == "UNAVAILABLE"
        assert f"127.0.0.1:{own_cluster.port}/memory" in str(refused.value)
        assert own_cluster.password not in str(refused.value)
        # recall and briefing: degraded, within provider_timeout
        answer, _ = await within(trio_clock, 1.0, lambda: memory.agent_recall(view, query="ledger"))
        assert answer.document.degraded == "store_unavailable"
        briefing, _ = await within(trio_clock, 1.0, lambda: memory.agent_briefing(view, delivery="tool"))
        assert briefing.document.degraded == "store_unavailable"
        trio_clock.rate = 1.0
        # status and doctor say so, naming host and database
        status = await memory.status()
        assert not status["store"]["reachable"] and status["counts"] is None
        doctor = await memory.doctor()
        row = next(r for r in doctor["rows"] if r["name"] == "memory store")
        assert row["status"] == "fail" and f"127.0.0.1:{own_cluster.port}/memory" in row["message"]
        assert not doctor["ok"] and own_cluster.password not in str(doctor)

        await trio.to_thread.run_sync(own_cluster.start)
        with trio.fail_after(30):  # the pools reconnect by themselves
            while not (await memory.status())["store"]["reachable"]:  # noqa: ASYNC110 -- polls the daemon's status
                await trio.sleep(0.2)
        again = await memory.ingest_run(run_record(run_id="after", result_text="ledger rounding third"))
        assert again["outcome"] in ("recorded", "queued")
        with trio.fail_after(30):
            while True:
                found = await memory.recall(query="ledger rounding", repo=API)
                if {first["episode_id"], again["episode_id"]} <= {e["episode_id"] for e in found["episodes"]}:
                    break
                await trio.sleep(0.2)
        assert found["degraded"] is None
        listed = await memory.list_episodes()
        assert sorted(e["run_id"] for e in listed["episodes"]) == ["after", "before"]  # "during" never acknowledged


async def test_pgvector_backfill_retires_vectors_of_an_older_embedding_text(
        vector_store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    """On pgvector: vectors stored under another embedding-text version (or model) are
    retired at the embedder's next pass and every episode is embedded again from its run's words; the
    cache keeps the rest from the model."""
    from memactors.builtin import BuiltinProvider, missing_vectors, vector_model

    scope = "project:forge.example/acme/api"
    store, api, client = vector_store, bag_of_words_api, embed_client
    p = BuiltinProvider(store, embedder=client.embed, embedding_model="fake-embed")
    for n in range(3):
        await p.record({"episode_id": f"ep_{n}", "scope": scope, "trust_class": "standard",
                        "text": f"result_excerpt: ledger change {n}\n",
                        "episode": {"started_at": f"2026-11-2{n}T09:00:00Z"}})
    assert await p.embed_pending() == 3
    await store.write(lambda db: db.execute(
        "UPDATE builtin_meta SET value = 'fake-embed+text0' WHERE key = 'vec_model'"))
    assert await p.embed_pending() == 3  # retired, and all three again (from the cache)
    assert len(api.requests_to("/v1/embeddings")) == 1
    model = await store.read(lambda db: db.execute(
        "SELECT value FROM builtin_meta WHERE key = 'vec_model'").fetchone()[0])
    assert model == vector_model("fake-embed")
    assert await store.read(missing_vectors) == 0


async def test_postgresql_scores_its_hits_for_the_fusion(vector_store: Store, embed_client: ModelApiClient) -> None:
    """PostgreSQL with pgvector: the text hits' score is the words matched then the cover density
    (the engine's order), the cosine hits' pgvector's similarity (1 − `<=>`); the same checks as
    SQLite's (`support_builtin.check_scored_hits`)."""
    from support_builtin import check_scored_hits

    store, client = vector_store, embed_client
    await check_scored_hits(store, client)
