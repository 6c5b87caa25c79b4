"""Fault injection: kill -9 the daemon and a stdio provider during concurrent ingest.

Two phases, both on real processes and a real SQLite file:

1. **Daemon kill -9.** Start `memactors serve` (built-in provider), run concurrent `IngestRun` clients
   over the operator RPC, SIGKILL the daemon after a random moment, start it again; repeat. A run is
   *acknowledged* when the daemon answered its IngestRun. At the end every acknowledged run must be in
   the store (`lost` must be 0), and `PRAGMA integrity_check` plus FTS5 `integrity-check` on every FTS
   table must pass (`integrity failures` must be 0).
2. **Provider kill -9.** The embedded service over the fault provider as a stdio subprocess, with
   concurrent ingest; SIGKILL the provider, measure the *recovery time* from the kill until a recall is
   served undegraded and a record is accepted again by the respawned process; repeat. At the end every
   acknowledged episode must be stored and delivered to the provider (`lost` must be 0).

    .venv/bin/python bench/fault_injection.py            # 40 daemon cycles, 15 provider cycles
    .venv/bin/python bench/fault_injection.py --quick    # 5 and 3, for CI

Prints cycles, acknowledged, lost, integrity failures, recovery times and the machine it ran on.
Exits 1 when anything was lost or an integrity check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlean
import trio

from memactors.config import ConfigHolder, load_config
from memactors.logs import configure_logging
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.service import DB_NAME, open_memory_service

SERVICE = "harness.v1.MemoryService"
REPO = "forge.example/acme/api"
FTS_TABLES = ("builtin_fts", "facts_fts")


def record(n: int, harness: str = "bench") -> dict[str, Any]:
    minute, second = divmod(n % 3600, 60)
    stamp = f"2026-11-28T{9 + n // 3600 % 10:02d}:{minute:02d}:{second:02d}Z"
    return {
        "harness": harness, "adapter": "claude-code", "run_id": str(n), "trace_id": f"t-{n}",
        "started_at": stamp, "ended_at": stamp, "duration_ms": 1000, "outcome": "succeeded",
        "reason": "completed", "result_text": f"fixed ledger rounding case {n}", "spawned_process": True,
        "sessions": [{"session_id": f"s{n}", "cwd": "/srv/api", "repo": REPO, "git_branch": "main"}],
        "events": [],
    }


def machine() -> str:
    return (f"machine: cpus={os.cpu_count()} python={platform.python_version()} "
            f"platform={platform.platform()}")


# ----------------------------------------------------------------------------------- daemon kill -9


def _daemon_config(root: Path) -> Path:
    path = root / "harness.toml"
    path.write_text(
        f'[store]\npath = "{root / "state"}"\n'
        '[operator]\nlisten = "127.0.0.1:0"\n[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
        '[memory.episodes]\nsummary = false\n', encoding="utf-8")
    return path


def _start_daemon(root: Path, config: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    state = root / "state"
    (state / "daemon.json").unlink(missing_ok=True)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root), "MEMACTORS_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            info = json.loads((state / "daemon.json").read_text(encoding="utf-8"))
            if info.get("pid") == proc.pid:
                return proc, info
        except (FileNotFoundError, ValueError):
            pass
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited with {proc.returncode} at start")
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("daemon did not start within 60 s")


async def _ingest_until_killed(url: str, token: str, next_id: list[int], acknowledged: set[str],
                               clients: int) -> None:
    async def client() -> None:
        try:
            async with connect_rpc(url, token) as rpc:
                while True:
                    n = next_id[0]
                    next_id[0] += 1
                    result = await rpc.call(f"{SERVICE}/IngestRun", {"record": record(n)})
                    if result.get("outcome") in ("recorded", "queued", "duplicate"):
                        acknowledged.add(str(n))
        except RpcError:
            return  # the daemon died under us: whatever was not answered was not acknowledged

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)


def _check_store(db_path: Path, acknowledged: set[str]) -> tuple[int, int]:
    """(lost, integrity failures) of the store file."""
    conn = sqlean.connect(str(db_path))
    try:
        stored = {row[0] for row in conn.execute("SELECT run_id FROM runs WHERE harness = 'bench'")}
        episodes = {row[0] for row in conn.execute("SELECT run_id FROM episodes WHERE harness = 'bench'")}
        lost = len(acknowledged - (stored & episodes))
        failures = 0
        if conn.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
            failures += 1
        for table in FTS_TABLES:
            try:
                conn.execute(f"INSERT INTO {table}({table}) VALUES('integrity-check')")
            except sqlean.DatabaseError:
                failures += 1
        return lost, failures
    finally:
        conn.close()


async def daemon_phase(cycles: int, clients: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="memactors-fault-"))
    config = _daemon_config(root)
    acknowledged: set[str] = set()
    next_id = [1]
    for _ in range(cycles):
        proc, info = await trio.to_thread.run_sync(_start_daemon, root, config)
        token = (root / "state" / "operator-control.token").read_text(encoding="utf-8").strip()
        with trio.move_on_after(random.uniform(0.3, 1.5)):
            await _ingest_until_killed(info["operator"], token, next_id, acknowledged, clients)
        proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(proc.wait)
    # One clean start and stop: the daemon must come up on whatever the last kill left.
    proc, _info = await trio.to_thread.run_sync(_start_daemon, root, config)
    proc.send_signal(signal.SIGTERM)
    clean_exit = await trio.to_thread.run_sync(proc.wait)
    lost, failures = _check_store(root / "state" / DB_NAME, acknowledged)
    return {"cycles": cycles, "acknowledged": len(acknowledged), "attempted": next_id[0] - 1, "lost": lost,
            "integrity_failures": failures, "clean_exit": clean_exit}


# --------------------------------------------------------------------------------- provider kill -9


def _provider_config(root: Path, *, spare: bool = True) -> Path:
    pidfile, state = root / "provider.pid", root / "provider-state.json"
    from memactors.testing import fault_provider_params

    params = fault_provider_params(state_file=state, pid_file=pidfile)
    path = root / "harness.toml"
    path.write_text(
        f'[store]\npath = "{root / "state"}"\n'
        '[memory]\nprovider = "fault"\n[memory.episodes]\nprovider_timeout = "2s"\nsummary = false\n'
        f"[mcp.fault]\ncommand = {json.dumps(params.command)}\nargs = {json.dumps(list(params.args))}\n"
        f"spare_process = {'true' if spare else 'false'}\n",
        encoding="utf-8")
    return path


def _pid(root: Path) -> int | None:
    try:
        return int((root / "provider.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


async def provider_phase(cycles: int, clients: int, pace: float, gap: float | None = None,
                         spare: bool = True) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="memactors-fault-"))
    config = _provider_config(root, spare=spare)
    holder = await trio.to_thread.run_sync(ConfigHolder, lambda: load_config(config, env={"HOME": str(root)}))
    acknowledged: set[str] = set()
    recoveries: list[float] = []
    after_respawn: list[float] = []
    async with open_memory_service(holder) as memory:
        with trio.fail_after(60):
            while memory.session.status().state != "ready":  # noqa: ASYNC110 -- the bench's own wait
                await trio.sleep(0.01)
        next_id = [100_000]

        async def client(stop: trio.Event) -> None:
            while not stop.is_set():
                n = next_id[0]
                next_id[0] += 1
                result = await memory.ingest_run(record(n, harness="bench-p"))
                if result.get("outcome") in ("recorded", "queued"):
                    acknowledged.add(result["episode_id"])
                await trio.sleep(pace)

        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client, stop)
            for _ in range(cycles):
                await trio.sleep(random.uniform(0.3, 1.0) if gap is None else gap)
                pid = _pid(root)
                if pid is None:
                    continue
                killed_at = trio.current_time()
                os.kill(pid, signal.SIGKILL)
                ready_at = None
                with trio.fail_after(120):
                    while True:  # recovered: a new process, a recall served undegraded
                        if _pid(root) not in (None, pid) and memory.session.status().state == "ready":
                            ready_at = ready_at or trio.current_time()
                            answer = await memory.recall(query="ledger", repo=REPO)
                            if not answer.get("degraded"):
                                break
                        await trio.sleep(0.01)  # noqa: ASYNC110 -- the bench's own wait
                recoveries.append(trio.current_time() - killed_at)
                after_respawn.append(trio.current_time() - ready_at)
            stop.set()
        with trio.fail_after(300):  # retries deliver whatever waited out a dead provider
            while (await memory.status())["pending"]["records"]:  # noqa: ASYNC110 -- polls the service
                await trio.sleep(0.2)
        stored = set(await memory.store.read(lambda db: [r[0] for r in db.execute(
            "SELECT episode_id FROM episodes WHERE harness = 'bench-p'")]))
        delivered = set(json.loads((root / "provider-state.json").read_text())["items"])
    return {"cycles": len(recoveries), "acknowledged": len(acknowledged),
            "lost": len(acknowledged - stored) + len(acknowledged - delivered), "recoveries": recoveries,
            "after_respawn": after_respawn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few cycles (CI): 5 daemon, 3 provider")
    parser.add_argument("--daemon-cycles", type=int, default=40)
    parser.add_argument("--provider-cycles", type=int, default=15)
    parser.add_argument("--clients", type=int, default=4, help="concurrent ingest clients")
    parser.add_argument("--pace", type=float, default=0.05,
                        help="seconds each provider-phase client waits between runs (0 saturates the loop)")
    parser.add_argument("--gap", type=float, default=None,
                        help="seconds from a provider's recovery to the next kill (default: random 0.3-1.0); a"
                             " gap longer than the provider's start-up lets the spare process warm up")
    parser.add_argument("--provider-only", action="store_true", help="skip the daemon kill -9 phase")
    parser.add_argument("--no-spare", action="store_true",
                        help="`spare_process = false` for the provider (how it was before the spare process):"
                             " the replacement is started when the old one is found dead")
    args = parser.parse_args(argv)
    if args.quick:
        args.daemon_cycles, args.provider_cycles = 5, 3
    configure_logging(os.environ.get("MEMACTORS_LOG_LEVEL", "ERROR"))

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        daemon = ({"cycles": 0, "attempted": 0, "acknowledged": 0, "lost": 0, "integrity_failures": 0,
                   "clean_exit": None} if args.provider_only else await daemon_phase(args.daemon_cycles, args.clients))
        return daemon, await provider_phase(args.provider_cycles, args.clients, args.pace, args.gap,
                                              spare=not args.no_spare)

    daemon, provider = trio.run(run)
    print(machine())
    print(f"daemon kill -9:   cycles={daemon['cycles']} attempted={daemon['attempted']} "
          f"acknowledged={daemon['acknowledged']} lost={daemon['lost']} "
          f"integrity_failures={daemon['integrity_failures']} clean_restart_exit={daemon['clean_exit']}")
    rec = provider["recoveries"]
    post = provider["after_respawn"]
    timing = (f"recovery_s(kill→serving) median={statistics.median(rec):.2f} max={max(rec):.2f} "
              f"respawn→serving_s median={statistics.median(post):.2f} max={max(post):.2f}"
              if rec else "recovery_s n/a")
    print(f"provider kill -9: cycles={provider['cycles']} acknowledged={provider['acknowledged']} "
          f"lost={provider['lost']} {timing}")
    ok = daemon["lost"] == 0 and daemon["integrity_failures"] == 0 and provider["lost"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
