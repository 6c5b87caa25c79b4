"""How it is checked: two daemon processes on one PostgreSQL store, each with its own state
directory and ports, through the CLI and the gateway (docs/fleet.md).

* ingest on A, recall on B finds it (the first recall after A's answer) in the right scope, nothing in another;
* a `memactors run` on A shows up in B's briefing (recent runs, episodes); presence on A is a collision on B;
* kill -9 A during concurrent ingest on A and B: every acknowledged episode is there afterwards, each
  recorded to the provider once;
* PostgreSQL stopped for 10 s under traffic: both daemons stay up, `/readyz` fails and `doctor` FAILs
  naming the store, nothing acknowledged is lost, both resume;
* a forget on B removes the episode for A's callers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from fix_daemon import Daemon, start_daemon
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.store.engines import open_store
from memactors.testing.postgres import Cluster
from support import run_record, write_config
from support_readside import API, BILLING, gateway_client
from support_runs import command_harness, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

SERVICE = "harness.v1.MemoryService"


def host(tmp_path: Path, name: str, url: str, extra: str = "") -> Path:
    """Host `name`'s home: its own config (state directory, ports 0) on the shared store."""
    home = tmp_path / name
    home.mkdir(parents=True, exist_ok=True)
    return write_config(home, extra, store_url=url)


def daemon_on(tmp_path: Path, name: str, url: str, extra: str = "") -> Daemon:
    return start_daemon(tmp_path / name, config=host(tmp_path, name, url, extra))


async def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI as the user runs it on that host (its config, its daemon)."""
    return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=daemon.env,
                                  capture_stdout=True, capture_stderr=True, check=False)


async def mint(daemon: Daemon, harness: str, run_id: str, repo: str, branch: str = "main",
               paths: tuple[str, ...] = ()) -> str:
    """A run token on `daemon` for a run working in `repo` (it reports live presence there)."""
    async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
        await rpc.call(f"{SERVICE}/ReportPresence", {
            "harness": harness, "run_id": run_id, "session_id": f"s-{run_id}", "repo": repo, "branch": branch,
            "paths": list(paths), "ttl_seconds": 86400})
        return str((await rpc.call(f"{SERVICE}/MintRunToken", {"harness": harness, "run_id": run_id}))["token"])


async def episode_on(daemon: Daemon, episode_id: str) -> dict[str, Any]:
    return dict(json.loads((await cli(daemon, "memory", "episodes", episode_id, "--json")).stdout))


async def recall_text(daemon: Daemon, token: str, query: str) -> str:
    async with gateway_client(daemon.info["gateway"], token) as client:
        result = await client.call_tool("recall", {"query": query})
    return "\n".join(c.text for c in result.content if hasattr(c, "text"))



def _stop(*daemons: Daemon) -> None:
    for d in daemons:
        d.stop()


async def test_ingest_on_a_is_recalled_on_b_in_its_scope_and_nowhere_else(tmp_path: Path, pg_url: str) -> None:
    a, b = daemon_on(tmp_path, "a", pg_url), daemon_on(tmp_path, "b", pg_url)
    try:
        api_token = await mint(b, "api-fixer", "b-1", API)
        billing_token = await mint(b, "billing-bot", "b-2", BILLING)
        record = tmp_path / "run.json"
        record.write_text(json.dumps(run_record(run_id="a-1", result_text="fixed the flaky ledger rounding")))
        done = await cli(a, "runs", "ingest", str(record), "--json")
        assert done.returncode == 0, done.stderr
        (result,) = json.loads(done.stdout)
        episode_id = result["episode_id"]
        # Committed before A answered: the very first recall on B finds it (no waiting, no polling).
        found = await recall_text(b, api_token, "ledger rounding")
        assert episode_id in found and "fixed the flaky ledger rounding" in found
        elsewhere = await recall_text(b, billing_token, "ledger rounding")
        assert episode_id not in elsewhere and "ledger rounding" not in elsewhere
        status = json.loads((await cli(b, "memory", "status", "--json")).stdout)
        assert status["store"]["engine"] == "postgresql" and status["counts"]["live_episodes"] == 1
        ids = {status["store"]["daemon_id"], json.loads((await cli(a, "memory", "status", "--json")).stdout)[
            "store"]["daemon_id"]}
        assert len(ids) == 2  # each host its own daemon_id, from its own state directory
        assert (tmp_path / "b" / "state" / "daemon_id").read_text().strip() == status["store"]["daemon_id"]
    finally:
        _stop(a, b)


async def test_a_run_on_a_shows_up_in_bs_briefing_and_presence_is_fleet_wide(
        tmp_path: Path, pg_url: str) -> None:
    repo = make_repo(tmp_path / "api")
    harness = command_harness("fixer", workdir=repo, mode="write", out=tmp_path / "out")
    a, b = daemon_on(tmp_path, "a", pg_url, harness), daemon_on(tmp_path, "b", pg_url, harness)
    try:
        ran = await cli(a, "run", "fixer", "--wait", "--json")
        assert ran.returncode == 0, ran.stderr
        result = json.loads(ran.stdout)
        # B sees A's episode as soon as A committed it; it is served once A's provider holds it (its
        # index row): the run's own record attempt, or A's retry loop when that ran out of time.
        with trio.fail_after(60):
            while "index" not in await episode_on(b, result["episode_id"]):  # noqa: ASYNC110 -- polls B
                await trio.sleep(0.2)
        shown = await cli(b, "memory", "briefing", "fixer", "--json")
        assert shown.returncode == 0, shown.stderr
        briefing = json.loads(shown.stdout)
        sections = {s["name"]: s for s in briefing["structured"]["sections"]}
        # A's episode is the briefing's episode (REQ-14's one-line provenance names its run), shown once:
        # recent_runs does not repeat it
        assert [i["provenance"]["run"] for i in sections["episodes"]["items"]] == [result["run_id"]]
        assert all(i["provenance"].get("run") != result["run_id"] for i in sections["recent_runs"]["items"])
        recalled = await cli(b, "memory", "recall", "--as", "fixer", "notes", "--json")
        assert [e["episode_id"] for e in json.loads(recalled.stdout)["episodes"]] == [result["episode_id"]]
        # A session live on A is a collision for a run on B on the same branch.
        await mint(a, "fixer", "live-on-a", "forge.example/acme/api", paths=("src/ledger.py",))
        b_token = await mint(b, "other", "live-on-b", "forge.example/acme/api", paths=("src/ledger.py",))
        async with gateway_client(b.info["gateway"], b_token) as client:
            text = "\n".join(c.text for c in (await client.call_tool("briefing", {})).content if hasattr(c, "text"))
        assert "## collisions" in text and "live-on-a" in text
    finally:
        _stop(a, b)


async def _ingest_stream(daemon: Daemon, prefix: str, count: int, acked: dict[str, str],
                         errors: list[str], started: trio.Event | None = None) -> None:
    """IngestRun `count` records one after another; every acknowledged episode id goes in `acked`."""
    try:
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            for n in range(count):
                record = run_record(run_id=f"{prefix}-{n}", result_text=f"ledger change {prefix} {n}")
                try:
                    out = await rpc.call(f"{SERVICE}/IngestRun", {"record": record})
                except RpcError as exc:
                    errors.append(exc.code)
                    if daemon.proc.poll() is not None or "closed" in str(exc).lower():
                        return  # the daemon went away (kill -9)
                    await trio.sleep(0.05)  # UNAVAILABLE while the store is down: nothing acknowledged
                    continue
                acked[out["episode_id"]] = out["outcome"]
                if started is not None and n >= 4:  # this stream's fifth acknowledgement
                    started.set()
    except RpcError as exc:  # the daemon went away (kill -9): what it acknowledged is what counts
        errors.append(exc.code)


async def _store_counts(url: str, episode_ids: list[str]) -> dict[str, Any]:
    store = await open_store(url, daemon_id="test")
    try:
        def read(db: Any) -> dict[str, Any]:
            return {
                "episodes": {r[0] for r in db.execute("SELECT episode_id FROM episodes WHERE episode_id = ANY(?)",
                                                      [episode_ids])},
                "docs": dict(db.execute("SELECT episode_id, count(*) FROM builtin_docs GROUP BY episode_id")),
                "index": dict(db.execute("SELECT episode_id, count(*) FROM memory_index GROUP BY episode_id")),
                "pending": db.execute("SELECT count(*) FROM pending").fetchone()[0],
            }
        return await store.read(read)
    finally:
        store.close()


async def test_kill_9_during_concurrent_ingest_loses_nothing_acknowledged(tmp_path: Path, pg_url: str) -> None:
    timeout = '[memory.episodes]\nprovider_timeout = "500ms"\nsummary = false\n'
    a, b = daemon_on(tmp_path, "a", pg_url, timeout), daemon_on(tmp_path, "b", pg_url, timeout)
    acked: dict[str, str] = {}
    errors: list[str] = []
    try:
        started = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_ingest_stream, a, "a1", 400, acked, errors, started)
            nursery.start_soon(_ingest_stream, a, "a2", 400, acked, errors)
            nursery.start_soon(_ingest_stream, b, "b1", 40, acked, errors)
            nursery.start_soon(_ingest_stream, b, "b2", 40, acked, errors)
            await started.wait()
            a.proc.kill()  # kill -9, mid-stream
            await trio.to_thread.run_sync(a.proc.wait)
        ids = list(acked)
        assert len(ids) >= 85, (len(ids), errors)  # B's 80 and A's first ones
        # B takes over what A had claimed once the claims run out; nothing stays pending.
        with trio.fail_after(90):
            while (counts := await _store_counts(pg_url, ids))["pending"]:  # noqa: ASYNC110 -- polls the store
                await trio.sleep(0.5)
        assert counts["episodes"] == set(ids)  # every acknowledged episode is there
        assert {e: counts["docs"].get(e) for e in ids} == dict.fromkeys(ids, 1)  # recorded to the provider once
        assert {e: counts["index"].get(e) for e in ids} == dict.fromkeys(ids, 1)
        assert b.proc.poll() is None
    finally:
        _stop(a, b)


async def test_postgresql_stopped_for_10_s_under_traffic(tmp_path: Path) -> None:
    cluster = Cluster()
    url = cluster.create_database("memory")
    quick = '[memory.episodes]\nprovider_timeout = "1s"\nsummary = false\n'
    a, b = daemon_on(tmp_path, "a", url, quick), daemon_on(tmp_path, "b", url, quick)
    acked: dict[str, str] = {}
    errors: list[str] = []
    try:
        async def traffic(daemon: Daemon, prefix: str, stop: trio.Event) -> None:
            n = 0
            while not stop.is_set():
                await _ingest_stream(daemon, f"{prefix}{n}", 5, acked, errors)
                n += 1

        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(traffic, a, "a", stop)
            nursery.start_soon(traffic, b, "b", stop)
            await trio.sleep(1.0)
            await trio.to_thread.run_sync(cluster.stop)
            before_outage = len(acked)
            await trio.sleep(3.0)
            # during the outage: /readyz fails, doctor FAILs naming host and database, never the password
            async with httpx2.AsyncClient() as http:
                ready = await http.get(a.info["metrics"].replace("/metrics", "/readyz"))
            assert ready.status_code == 503 and "store" in ready.text
            doctor = await cli(b, "doctor")
            assert doctor.returncode != 0
            assert f"127.0.0.1:{cluster.port}/memory" in doctor.stdout.decode() + doctor.stderr.decode()
            assert cluster.password.encode() not in doctor.stdout + doctor.stderr
            await trio.sleep(7.0)
            await trio.to_thread.run_sync(cluster.start)
            with trio.fail_after(60):
                while len(acked) < before_outage + 20:  # noqa: ASYNC110 -- both resume, without a restart
                    await trio.sleep(0.2)
            stop.set()
        assert a.proc.poll() is None and b.proc.poll() is None  # both stayed up
        assert "UNAVAILABLE" in errors  # the outage was answered, not hidden
        with trio.fail_after(60):
            while (counts := await _store_counts(url, list(acked)))["pending"]:  # noqa: ASYNC110 -- polls the store
                await trio.sleep(0.5)
        assert counts["episodes"] == set(acked)  # nothing acknowledged is lost
        assert {e: counts["docs"].get(e) for e in acked} == dict.fromkeys(acked, 1)
        for d in (a, b):
            assert cluster.password not in d.log_text()
        ready_again = await cli(a, "memory", "status", "--json")
        assert json.loads(ready_again.stdout)["store"]["reachable"]
    finally:
        _stop(a, b)
        cluster.close()


async def test_a_forget_on_b_removes_the_episode_for_as_callers(tmp_path: Path, pg_url: str) -> None:
    a, b = daemon_on(tmp_path, "a", pg_url), daemon_on(tmp_path, "b", pg_url)
    try:
        token = await mint(a, "api-fixer", "a-9", API)
        async with connect_rpc(a.info["operator"], a.token("control")) as rpc:
            out = await rpc.call(f"{SERVICE}/IngestRun", {"record": run_record(
                run_id="to-forget", result_text="the ledger rounding secret fix")})
        episode_id = out["episode_id"]
        assert episode_id in await recall_text(a, token, "ledger rounding")
        forgot = await cli(b, "memory", "forget", episode_id, "--yes")
        assert forgot.returncode == 0, forgot.stderr
        after = await recall_text(a, token, "ledger rounding")
        assert episode_id not in after and "secret fix" not in after
        shown = await cli(a, "memory", "episodes", episode_id, "--json")
        assert json.loads(shown.stdout)["forgotten_at"] is not None
    finally:
        _stop(a, b)


def test_fleet_tests_use_the_real_server() -> None:
    """The fleet tests never skip: without PostgreSQL's server binaries they fail, naming the package."""
    from memactors.testing.postgres import server_bindir

    assert (server_bindir() / "postgres").exists()
    assert os.access(server_bindir() / "initdb", os.X_OK)


def test_a_daemon_whose_store_cannot_be_reached_at_start_exits_with_one_line(tmp_path: Path) -> None:
    """It cannot check or migrate the schema, so it does not start: one line naming the store (never its
    password), no traceback, exit 75 for a service manager to retry."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://memactors:not-shown-pw@127.0.0.1:{port}/memory"
    daemon = start_daemon(tmp_path, config=host(tmp_path, "x", url), wait=False)
    try:
        code = daemon.proc.wait(timeout=60)
    finally:
        daemon.stop()
    log = daemon.log_text()
    assert code == 75, log[-2000:]
    assert "Traceback" not in log and "not-shown-pw" not in log
    assert [line for line in log.splitlines() if "cannot start" in line and f"127.0.0.1:{port}/memory" in line]
