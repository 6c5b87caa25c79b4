"""The fleet survives losing its database host (docs/fleet.md, "Surviving the loss of the
database host").

* after PostgreSQL restarts, the first ingest through the CLI on a running daemon succeeds first try;
* a daemon's connections killed by the server (`pg_terminate_backend`): the next recall and ingest succeed;
* the store's connections reset (TCP RST, through a proxy on 127.0.0.1): the next read and write succeed;
* a write whose connection dies before its COMMIT is run again, once, on a new connection; one whose
  connection dies while its COMMIT is on the wire is never run again (it may have committed);
* failover on a primary and a streaming standby (`pg_basebackup -R`, synchronous replication), the
  daemons on a libpq multi-host URL: two daemons ingesting concurrently, the primary killed -9, the
  standby promoted — every acknowledged episode is on the new primary, recalls degrade during the switch
  (within provider_timeout) and recover without a restart, a forget issued during the switch holds, and
  doctor names the primary in use;
* a switchover (the old primary back as a standby) and a primary made read-only: the writer notices and
  writes on the new primary only; a standby is never read from.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from fix_daemon import Daemon, start_daemon
from memactors.config import ConfigHolder, load_config
from memactors.errors import StoreUnavailable
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.service import open_memory_service
from memactors.store.engines import open_store
from memactors.testing.postgres import Cluster
from support import run_record, wait_ready, within, write_config
from support_readside import API, as_run, gateway_client

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

SERVICE = "harness.v1.MemoryService"


def daemon_on(tmp_path: Path, name: str, url: str, extra: str = "") -> Daemon:
    home = tmp_path / name
    home.mkdir(parents=True, exist_ok=True)
    return start_daemon(home, config=write_config(home, extra, store_url=url))


async def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=daemon.env,
                                  capture_stdout=True, capture_stderr=True, check=False)


async def ingest_file(daemon: Daemon, tmp_path: Path, run_id: str) -> subprocess.CompletedProcess[bytes]:
    record = tmp_path / f"{run_id}.json"
    record.write_text(json.dumps(run_record(run_id=run_id, result_text=f"ledger rounding {run_id}")))
    return await cli(daemon, "runs", "ingest", str(record), "--json")


async def test_the_first_ingest_after_a_postgresql_restart_succeeds(tmp_path: Path) -> None:
    cluster = Cluster()
    try:
        url = cluster.create_database("memory")
        a = daemon_on(tmp_path, "a", url)
        try:
            first = await ingest_file(a, tmp_path, "before")
            assert first.returncode == 0, first.stderr
            await trio.to_thread.run_sync(cluster.stop)
            await trio.to_thread.run_sync(cluster.start)
            done = await ingest_file(a, tmp_path, "after")
            assert done.returncode == 0, (done.stdout, done.stderr)
            (result,) = json.loads(done.stdout)
            assert result["outcome"] == "recorded", result
        finally:
            a.stop()
    finally:
        cluster.close()


def terminate_memactors_sessions(cluster: Cluster, dbname: str) -> int:
    """pg_terminate_backend every memactors session on `dbname` (as an operator or a failover manager
    would); returns how many."""
    rows = cluster.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         f" WHERE datname = '{dbname}' AND application_name LIKE 'memactors %'")
    return len(rows)


async def mint(daemon: Daemon, harness: str, run_id: str, repo: str) -> str:
    async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
        await rpc.call(f"{SERVICE}/ReportPresence", {
            "harness": harness, "run_id": run_id, "session_id": f"s-{run_id}", "repo": repo, "branch": "main",
            "paths": [], "ttl_seconds": 86400})
        return str((await rpc.call(f"{SERVICE}/MintRunToken", {"harness": harness, "run_id": run_id}))["token"])


async def recall_text(daemon: Daemon, token: str, query: str) -> tuple[str, bool]:
    """The recall tool's text on `daemon`, and whether it was degraded."""
    async with gateway_client(daemon.info["gateway"], token) as client:
        result = await client.call_tool("recall", {"query": query})
    text = "\n".join(c.text for c in result.content if hasattr(c, "text"))
    return text, "degraded=" in text


async def test_the_next_recall_and_ingest_after_pg_terminate_backend_succeed(
        tmp_path: Path, pg_cluster: Cluster, pg_url: str) -> None:
    dbname = pg_url.rsplit("/", 1)[1]
    a = daemon_on(tmp_path, "a", pg_url)
    try:
        token = await mint(a, "api-fixer", "t-1", API)
        first = await ingest_file(a, tmp_path, "one")
        assert first.returncode == 0, first.stderr
        (episode,) = json.loads(first.stdout)
        text, degraded = await recall_text(a, token, "ledger rounding")  # every pool has connections now
        assert episode["episode_id"] in text and not degraded
        assert terminate_memactors_sessions(pg_cluster, dbname) >= 2  # the writer's and a reader's, at least
        text, degraded = await recall_text(a, token, "ledger rounding")
        assert episode["episode_id"] in text and not degraded, text
        assert terminate_memactors_sessions(pg_cluster, dbname) >= 2
        done = await ingest_file(a, tmp_path, "two")
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert json.loads(done.stdout)[0]["outcome"] == "recorded"
    finally:
        a.stop()


async def test_a_write_whose_connection_dies_before_commit_runs_again_once(pg_url: str) -> None:
    store = await open_store(pg_url, daemon_id="t")
    try:
        await store.write(lambda db: db.execute("CREATE TABLE t28 (n INT)"))
        runs: list[int] = []

        def job(db: Any) -> str:
            runs.append(1)
            db.execute("INSERT INTO t28 VALUES (?)", [len(runs)])
            if len(runs) == 1:  # the server ends this session mid-transaction, before any COMMIT
                db.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            return "done"

        assert await store.write(job) == "done"
        assert len(runs) == 2
        rows = await store.read(lambda db: db.execute("SELECT n FROM t28").fetchall())
        assert rows == [(2,)]  # the first run's insert died with its session; the second committed once
    finally:
        store.close()


async def test_a_write_whose_connection_dies_during_commit_is_never_run_again(pg_url: str) -> None:
    store = await open_store(pg_url, daemon_id="t")
    try:
        # A deferred constraint trigger runs inside the COMMIT: it ends its own session there, so the
        # client loses the connection with the COMMIT on the wire and cannot know whether it committed.
        await store.write(lambda db: db.execute(
            "CREATE TABLE t28c (n INT);"
            " CREATE FUNCTION die() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); RETURN NULL; END $$;"
            " CREATE CONSTRAINT TRIGGER die AFTER INSERT ON t28c DEFERRABLE INITIALLY DEFERRED"
            " FOR EACH ROW EXECUTE FUNCTION die()"))
        runs: list[int] = []

        def job(db: Any) -> None:
            runs.append(1)
            db.execute("INSERT INTO t28c VALUES (1)")

        with pytest.raises(StoreUnavailable):
            await store.write(job)
        assert runs == [1]  # not run again: it may have committed
        assert await store.read(lambda db: db.execute("SELECT count(*) FROM t28c").fetchone()[0]) == 0
        assert await store.write(lambda db: db.execute("SELECT 1").fetchone()[0]) == 1  # the writer is back
    finally:
        store.close()


class ResettingProxy:
    """A TCP proxy on 127.0.0.1 to a PostgreSQL server that can reset every connection through it (an
    RST to both sides, as a NAT or a load balancer that drops its state does)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self.live: list[tuple[trio.SocketStream, trio.SocketStream]] = []

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, self._one, listeners)

    async def _one(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", self.target)
        pair = (client, server)
        self.live.append(pair)

        async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while data := await src.receive_some(65536):
                    await dst.send_all(data)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, client, server)
                nursery.start_soon(pump, server, client)
        finally:
            if pair in self.live:  # the client closed it (the pool retired a connection)
                self.live.remove(pair)
            for stream in pair:
                stream.socket.close()

    def reset_all(self) -> int:
        """RST both sides of every connection through the proxy; returns how many connections."""
        count = len(self.live)
        for pair in self.live:
            for stream in pair:
                if stream.socket.fileno() != -1:
                    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    stream.socket.close()  # linger 0: the kernel sends an RST, not a FIN
        self.live.clear()
        return count


async def test_after_a_tcp_reset_the_next_read_and_write_succeed(pg_cluster: Cluster, pg_url: str) -> None:
    proxy = ResettingProxy(pg_cluster.port)
    async with trio.open_nursery() as nursery:
        await proxy.serve(nursery)
        url = pg_url.replace(f":{pg_cluster.port}/", f":{proxy.port}/")
        store = await open_store(url, daemon_id="t")
        try:
            await store.write(lambda db: db.execute("CREATE TABLE t28t (n INT)"))
            await store.write(lambda db: db.execute("INSERT INTO t28t VALUES (1)"))
            assert await store.read(lambda db: db.execute("SELECT count(*) FROM t28t").fetchone()[0]) == 1
            assert proxy.reset_all() >= 2  # the writer's connection and a reader's
            assert await store.read(lambda db: db.execute("SELECT count(*) FROM t28t").fetchone()[0]) == 1
            assert proxy.reset_all() >= 1
            await store.write(lambda db: db.execute("INSERT INTO t28t VALUES (2)"))
            assert await store.read(lambda db: db.execute("SELECT count(*) FROM t28t").fetchone()[0]) == 2
        finally:
            store.close()
            nursery.cancel_scope.cancel()


# -- failover: a primary and a streaming standby --------------------------------------------------------

QUICK = '[memory.episodes]\nprovider_timeout = "1s"\nsummary = false\n'


@pytest.fixture
def trio_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
def pair() -> Iterator[tuple[Cluster, Cluster, str]]:
    """A primary with a database `memory`, its synchronous streaming standby, and the multi-host URL."""
    primary = Cluster()
    standby: Cluster | None = None
    try:
        primary.create_database("memory")
        standby = primary.standby(synchronous=True)
        yield primary, standby, primary.failover_url(standby, "memory")
    finally:
        if standby is not None:
            standby.close()
        primary.close()


def test_the_store_url_takes_multi_host_urls_and_refuses_standby_targets(tmp_path: Path) -> None:
    from memactors.errors import ConfigError

    good = "postgresql://memactors:pw28@db1:5432,db2:5433/memactors?target_session_attrs=read-write"
    assert load_config(write_config(tmp_path, store_url=good), env={"HOME": str(tmp_path)}).store.url == good
    for bad, says in [
        ("postgresql://memactors:pw28@db1:5432,db2:x/memactors", "port 'x'"),
        ("postgresql://memactors:pw28@db1,,db2/memactors", "empty host"),
        ("postgresql://memactors:pw28@db1,db2/memactors?target_session_attrs=prefer-standby", "primary only"),
        ("postgresql://memactors:pw28@db1,db2/memactors?target_session_attrs=any", "target_session_attrs=any"),
    ]:
        with pytest.raises(ConfigError) as refused:
            load_config(write_config(tmp_path, store_url=bad), env={"HOME": str(tmp_path)})
        assert "[store] url" in str(refused.value) and says in str(refused.value), str(refused.value)
        assert "pw28" not in str(refused.value)
        env = {"HOME": str(tmp_path), "MEMACTORS_STORE_URL": bad}
        with pytest.raises(ConfigError) as refused:
            load_config(write_config(tmp_path), env=env)
        assert "MEMACTORS_STORE_URL" in str(refused.value) and "pw28" not in str(refused.value)


async def test_during_a_failover_recall_degrades_within_provider_timeout_and_recovers(
        tmp_path: Path, pair: tuple[Cluster, Cluster, str], trio_clock: trio.testing.MockClock) -> None:
    primary, standby, url = pair
    home = tmp_path / "a"
    home.mkdir()
    config = write_config(home, QUICK, store_url=url)
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(home)}))
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        kept = await memory.ingest_run(run_record(run_id="kept", result_text="ledger rounding kept"))
        gone = await memory.ingest_run(run_record(run_id="gone", result_text="ledger rounding forgotten"))
        _, view = await as_run(memory, "api-fixer", "28", API)
        store = (await memory.status())["store"]
        assert store["primary"] == f"127.0.0.1:{primary.port}"

        await trio.to_thread.run_sync(primary.kill)
        answer, _ = await within(trio_clock, 1.0, lambda: memory.agent_recall(view, query="ledger"))
        assert answer.document.degraded == "store_unavailable"
        trio_clock.rate = 1.0
        with pytest.raises(StoreUnavailable):  # refused, not acknowledged, while there is no primary
            await memory.forget(gone["episode_id"])
        for _ in range(8):  # a canary recalling through the switch: more failed calls than the breaker's 5
            answer = await memory.agent_recall(view, query="ledger")
            assert answer.document.degraded is not None
        # The built-in provider failed only because the store did: no verdict on it.
        assert (await memory.status())["breaker"] == "closed"

        await trio.to_thread.run_sync(standby.promote)
        with trio.fail_after(60):  # the pools find the new primary by themselves: no restart
            while not (await memory.status())["store"]["reachable"]:  # noqa: ASYNC110 -- polls the status
                await trio.sleep(0.2)
        # The first recall once the store answers is served in full, not degraded for the breaker's 30 s.
        answer = await memory.agent_recall(view, query="ledger rounding")
        assert answer.document.degraded is None, answer.document.degraded
        # The operator's retry, on the new primary. Status reads through the read pool; the writer's
        # pool may find the new primary a moment later (its reconnect backoff), so the operator retries
        # what was refused until it is taken (CI saw one refusal at load), never longer than a minute.
        with trio.fail_after(60):
            while True:
                try:
                    forgot = await memory.forget(gone["episode_id"])
                    break
                except StoreUnavailable:
                    await trio.sleep(0.5)
        assert forgot["forgotten_at"]
        found = await memory.recall(query="ledger rounding", repo=API)
        ids = {e["episode_id"] for e in found["episodes"]}
        assert found["degraded"] is None and kept["episode_id"] in ids and gone["episode_id"] not in ids
        doctor = await memory.doctor()
        row = next(r for r in doctor["rows"] if r["name"] == "memory store")
        assert row["status"] == "pass" and f"primary 127.0.0.1:{standby.port}" in row["message"], row
        assert primary.password not in str(doctor)


async def _stream(daemon: Daemon, prefix: str, acked: dict[str, str], errors: list[str], stop: trio.Event) -> None:
    """IngestRun one record after another until `stop`; every acknowledged episode id goes in `acked`."""
    n = 0
    while not stop.is_set():
        try:
            async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
                while not stop.is_set():
                    record = run_record(run_id=f"{prefix}-{n}", result_text=f"ledger change {prefix} {n}")
                    n += 1
                    try:
                        out = await rpc.call(f"{SERVICE}/IngestRun", {"record": record})
                    except RpcError as exc:
                        errors.append(exc.code)  # UNAVAILABLE during the switch: nothing acknowledged
                        if exc.code != "UNAVAILABLE":
                            raise
                        await trio.sleep(0.05)
                        continue
                    acked[out["episode_id"]] = prefix
        except RpcError as exc:
            errors.append(exc.code)
            if daemon.proc.poll() is not None:
                return


async def _on_new_primary(url: str, ids: list[str]) -> dict[str, Any]:
    store = await open_store(url, daemon_id="test")
    try:
        def read(db: Any) -> dict[str, Any]:
            return {
                "episodes": {r[0] for r in db.execute("SELECT episode_id FROM episodes WHERE episode_id = ANY(?)",
                                                      [ids])},
                "docs": dict(db.execute("SELECT episode_id, count(*) FROM builtin_docs GROUP BY episode_id")),
                "pending": db.execute("SELECT count(*) FROM pending").fetchone()[0],
            }
        return await store.read(read)
    finally:
        store.close()


async def test_kill_9_of_the_primary_mid_ingest_loses_nothing_acknowledged(
        tmp_path: Path, pair: tuple[Cluster, Cluster, str]) -> None:
    primary, standby, url = pair
    a, b = daemon_on(tmp_path, "a", url, QUICK), daemon_on(tmp_path, "b", url, QUICK)
    acked: dict[str, str] = {}
    errors: list[str] = []
    try:
        token = await mint(a, "api-fixer", "f-1", API)
        before = await ingest_file(a, tmp_path, "forgotten-before")
        during = await ingest_file(b, tmp_path, "forgotten-during")
        assert before.returncode == 0 and during.returncode == 0, (before.stderr, during.stderr)
        forget_before, forget_during = (json.loads(x.stdout)[0]["episode_id"] for x in (before, during))
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for daemon, prefix in ((a, "a1"), (a, "a2"), (b, "b1"), (b, "b2")):
                nursery.start_soon(_stream, daemon, prefix, acked, errors, stop)
            with trio.fail_after(300):
                while len(acked) < 40:  # noqa: ASYNC110 -- both daemons are ingesting
                    await trio.sleep(0.05)
            forgot = await cli(b, "memory", "forget", forget_before, "--yes")
            assert forgot.returncode == 0, forgot.stderr  # acknowledged on the old primary
            await trio.to_thread.run_sync(primary.kill)  # kill -9, mid-ingest
            at_kill = dict(acked)
            # The switch: no primary. Recall degrades (REQ-9 cannot check the index), nothing crashes.
            text, degraded = await recall_text(a, token, "ledger rounding")
            assert degraded and "store_unavailable" in text and forget_before not in text, text
            refused = await cli(a, "memory", "forget", forget_during, "--yes")  # issued during the switch
            await trio.to_thread.run_sync(standby.promote)
            if refused.returncode != 0:  # refused (UNAVAILABLE), never half-done: the operator sends it again
                assert b"UNAVAILABLE" in refused.stderr, refused.stderr
                with trio.fail_after(120):
                    while (again := await cli(a, "memory", "forget", forget_during, "--yes")).returncode:
                        assert b"UNAVAILABLE" in again.stderr, again.stderr
                        await trio.sleep(0.2)
            # Both daemons resume on the new primary without a restart.
            def resumed() -> bool:
                return all(sum(1 for e, p in acked.items() if p == prefix and e not in at_kill) >= 3
                           for prefix in ("a1", "a2", "b1", "b2"))

            with trio.fail_after(300):
                while not resumed():  # noqa: ASYNC110 -- polls the streams
                    await trio.sleep(0.1)
            stop.set()
        assert "UNAVAILABLE" in errors  # the switch was answered, not hidden
        assert a.proc.poll() is None and b.proc.poll() is None
        ids = list(acked)
        with trio.fail_after(120):
            while (counts := await _on_new_primary(standby.url("memory"), ids))["pending"]:  # noqa: ASYNC110
                await trio.sleep(0.5)
        assert counts["episodes"] == set(ids)  # 0 lost: every acknowledged episode is on the new primary
        assert {e: counts["docs"].get(e) for e in ids} == dict.fromkeys(ids, 1)
        for daemon in (a, b):  # both forgets hold on the new primary, for every daemon's callers
            text, degraded = await recall_text(daemon, await mint(daemon, "api-fixer", f"f-{daemon.pid}", API),
                                               "ledger rounding")
            assert not degraded and forget_before not in text and forget_during not in text, text
            shown = json.loads((await cli(daemon, "memory", "episodes", forget_during, "--json")).stdout)
            assert shown["forgotten_at"] is not None
            doctor = await cli(daemon, "doctor")
            row = next(line for line in doctor.stdout.decode().splitlines() if "memory store" in line)
            assert f"primary 127.0.0.1:{standby.port}" in row and primary.password not in row, row
    finally:
        a.stop()
        b.stop()


async def test_after_a_switchover_the_daemon_writes_on_the_new_primary_only(
        tmp_path: Path, pair: tuple[Cluster, Cluster, str]) -> None:
    primary, standby, url = pair
    a = daemon_on(tmp_path, "a", url, QUICK)
    try:
        first = await ingest_file(a, tmp_path, "on-old")
        assert first.returncode == 0, first.stderr
        # Switchover: the primary stops cleanly (its standby has all of it), the standby is promoted,
        # and the old primary comes back as a standby of the new one (a demoted server).
        primary.admin("ALTER SYSTEM SET synchronous_standby_names = ''")
        await trio.to_thread.run_sync(primary.stop)
        await trio.to_thread.run_sync(standby.promote)
        await trio.to_thread.run_sync(primary.follow, standby)
        await trio.to_thread.run_sync(primary.start)
        assert primary.admin("SELECT pg_is_in_recovery()") == [(True,)]
        done = await ingest_file(a, tmp_path, "on-new")  # the first ingest after the switch: first try
        assert done.returncode == 0, (done.stdout, done.stderr)
        episode = json.loads(done.stdout)[0]["episode_id"]
        assert standby.admin(f"SELECT count(*) FROM episodes WHERE episode_id = '{episode}'", "memory") == [(1,)]
        doctor = await cli(a, "doctor")
        assert f"primary 127.0.0.1:{standby.port}" in doctor.stdout.decode()
        sessions = primary.admin("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'memactors %'")
        assert sessions == [(0,)]  # no reads on the standby either
    finally:
        a.stop()


async def test_a_writer_on_a_primary_made_read_only_moves_to_the_new_primary(
        pair: tuple[Cluster, Cluster, str]) -> None:
    primary, standby, url = pair
    store = await open_store(url, daemon_id="t")
    try:
        await store.write(lambda db: db.execute("CREATE TABLE t28r (n INT)"))
        primary.admin("ALTER SYSTEM SET synchronous_standby_names = ''")
        await trio.to_thread.run_sync(standby.promote)
        primary.admin("ALTER SYSTEM SET default_transaction_read_only = on")  # fenced: no more writes here
        primary.admin("SELECT pg_reload_conf()")
        with trio.fail_after(60):  # the postmaster has reloaded (and signalled every session) once a new one sees it
            while primary.admin("SHOW default_transaction_read_only") != [("on",)]:  # noqa: ASYNC110
                await trio.sleep(0.05)
        # The writer's session is still on the old primary: its next transaction is read-only, the INSERT is
        # refused, nothing of it committed; it is run again on a connection to the read-write server.
        await store.write(lambda db: db.execute("INSERT INTO t28r VALUES (1)"))
        assert standby.admin("SELECT count(*) FROM t28r", "memory") == [(1,)]
        assert primary.admin("SELECT count(*) FROM t28r", "memory") == [(0,)]
        assert store.primary == f"127.0.0.1:{standby.port}"
    finally:
        store.close()
