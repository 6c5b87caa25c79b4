"""PostgreSQL failover under a memactors daemon, on throwaway servers.

    .venv/bin/python bench/pg_failover.py                  # 3 failovers, 200 ingests per throughput run
    .venv/bin/python bench/pg_failover.py --rounds 5 --records 400 --json

What it measures, on one machine (printed), with `memactors.testing.postgres` (fsync on): a primary and a
streaming standby (`pg_basebackup -R`), one memory service on the libpq multi-host URL
(``target_session_attrs=read-write``), the built-in provider, `provider_timeout = 1s`:

* **failover**: ingests one after another and an agent's recall every 50 ms; the primary is killed -9,
  and the standby promoted `--promote-after` seconds later (what a failover manager's detection takes:
  set it to yours). Time from the primary's death to the first acknowledged ingest on the new primary,
  and from the promotion to it (memactors' own share); from the promotion to the first recall served in
  full (not degraded: the built-in provider's breaker must not hold it); the recalls answered during the switch, how many
  degraded (``store_unavailable``) and how many failed (none should: they degrade); the slowest of them.
* **throughput**: IngestRun with 8 concurrent callers on the primary, synchronous replication
  (``synchronous_standby_names = '*'``, ``synchronous_commit = on``) against asynchronous
  (``synchronous_commit = on``, no synchronous standby), records/s.

Medians over the rounds; docs/fleet.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from memactors.testing.postgres import Cluster

REPO = "forge.example/acme/api"


def record(run_id: str) -> dict[str, Any]:
    return {"harness": "api-fixer", "adapter": "claude-code", "run_id": run_id, "trace_id": f"t-{run_id}",
            "started_at": "2026-12-01T12:00:00Z", "ended_at": "2026-12-01T12:05:00Z", "duration_ms": 300000,
            "outcome": "succeeded", "reason": "completed", "result_text": f"ledger rounding change {run_id}",
            "spawned_process": True, "events": [],
            "sessions": [{"session_id": f"s-{run_id}", "cwd": "/srv/api", "repo": REPO, "git_branch": "main"}]}


def holder(home: Path, url: str) -> ConfigHolder:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "harness.toml"
    path.write_text(f'[store]\npath = "{home / "state"}"\nurl = "{url}"\n[memory]\nembeddings = false\n'
                    '[memory.episodes]\nprovider_timeout = "1s"\nsummary = false\n', encoding="utf-8")
    return ConfigHolder(lambda: load_config(path, env={"HOME": str(home)}))


async def view_for(memory: MemoryService) -> Any:
    await memory.report_presence(harness="api-fixer", run_id="bench", session_id="s-bench", repo=REPO, branch="main",
                                 paths=(), ttl_seconds=86400)
    token = (await memory.mint_run_token(harness="api-fixer", run_id="bench", workdir=""))["token"]
    return await memory.caller_view(token)


async def one_failover(home: Path, promote_after: float) -> dict[str, Any]:
    primary = Cluster(durable=True)
    standby = None
    try:
        primary.create_database("memory")
        standby = primary.standby(synchronous=True)
        url = primary.failover_url(standby, "memory")
        async with open_memory_service(holder(home, url)) as memory:
            view = await view_for(memory)
            for n in range(20):  # warm: every pool has its connections
                await memory.ingest_run(record(f"warm-{n}"))
            killed = dead = promoted = first_ack = first_full = None
            recalls: list[tuple[float, float, str]] = []  # (started, seconds, outcome)
            stop = trio.Event()
            acked, served = trio.Event(), trio.Event()

            async def ingest() -> None:
                nonlocal first_ack
                n = 0
                while not stop.is_set():
                    n += 1
                    sent = time.monotonic()
                    try:
                        await memory.ingest_run(record(f"r-{n}"))
                    except Exception:  # ok: UNAVAILABLE during the switch, nothing acknowledged
                        await trio.sleep(0.02)
                        continue
                    # the first ingest sent once the primary was gone (one in flight may have committed before)
                    if dead is not None and sent >= dead and first_ack is None:
                        first_ack = time.monotonic()
                        acked.set()
                        return

            async def recall() -> None:
                nonlocal first_full
                while not stop.is_set():
                    start = time.monotonic()
                    try:
                        answer = await memory.agent_recall(view, query="ledger rounding")
                        outcome = "degraded" if answer.document.degraded else "ok"
                    except Exception:  # ok: counted as failed
                        outcome = "failed"
                    recalls.append((start, time.monotonic() - start, outcome))
                    # the first recall served in full that was sent after the promotion
                    if outcome == "ok" and promoted is not None and start >= promoted and first_full is None:
                        first_full = time.monotonic()
                        served.set()
                        return
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ingest)
                nursery.start_soon(recall)
                await trio.sleep(0.5)
                killed = time.monotonic()
                await trio.to_thread.run_sync(primary.kill)
                dead = time.monotonic()
                await trio.sleep(promote_after)
                await trio.to_thread.run_sync(standby.promote)
                promoted = time.monotonic()
                with trio.fail_after(120):
                    await acked.wait()
                    await served.wait()
                stop.set()
        during = [r for r in recalls if killed <= r[0] <= (first_ack or 0)]
        return {"death_to_ack_s": first_ack - killed, "promote_to_ack_s": first_ack - promoted,  # type: ignore[operator]
                "promote_to_full_recall_s": first_full - promoted,  # type: ignore[operator]
                "recalls": len(during), "degraded": sum(r[2] == "degraded" for r in during),
                "failed": sum(r[2] == "failed" for r in during),
                "slowest_recall_s": max((r[1] for r in during), default=0.0)}
    finally:
        if standby is not None:
            standby.close()
        primary.close()


async def throughput(home: Path, records: int, synchronous: bool) -> float:
    primary = Cluster(durable=True)
    standby = None
    try:
        primary.create_database("memory")
        standby = primary.standby(synchronous=synchronous)
        if not synchronous:
            primary.admin("ALTER SYSTEM SET synchronous_commit = 'on'")
            primary.admin("SELECT pg_reload_conf()")
            standby.wait_streaming(primary)
        async with open_memory_service(holder(home, primary.failover_url(standby, "memory"))) as memory:
            for n in range(10):
                await memory.ingest_run(record(f"warm-{n}"))
            callers, each = 8, max(1, records // 8)
            start = time.monotonic()
            async with trio.open_nursery() as nursery:
                for c in range(callers):
                    async def caller(c: int = c) -> None:
                        for n in range(each):
                            await memory.ingest_run(record(f"t{c}-{n}"))
                    nursery.start_soon(caller)
            return callers * each / (time.monotonic() - start)
    finally:
        if standby is not None:
            standby.close()
        primary.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--promote-after", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {platform.platform()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cpus · "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} · Python {platform.python_version()}")
    rounds: list[dict[str, Any]] = []
    sync_rates: list[float] = []
    async_rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pg-failover-") as tmp:
        for r in range(args.rounds):
            rounds.append(await one_failover(Path(tmp) / f"f{r}", args.promote_after))
            sync_rates.append(await throughput(Path(tmp) / f"s{r}", args.records, synchronous=True))
            async_rates.append(await throughput(Path(tmp) / f"a{r}", args.records, synchronous=False))
            print(f"round {r + 1}: {json.dumps(rounds[-1])} sync {sync_rates[-1]:.0f}/s async {async_rates[-1]:.0f}/s")
    median = {k: statistics.median(float(x[k]) for x in rounds) for k in rounds[0]}
    summary = {"rounds": args.rounds, "promote_after_s": args.promote_after, "failover_median": median,
               "ingest_per_s_sync_median": statistics.median(sync_rates),
               "ingest_per_s_async_median": statistics.median(async_rates)}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"primary death -> first acknowledged ingest on the new primary: {median['death_to_ack_s']:.2f} s "
          f"(promotion after {args.promote_after:.1f} s; from the promotion: {median['promote_to_ack_s']:.2f} s)")
    print(f"promotion -> first recall served in full: {median['promote_to_full_recall_s']:.2f} s "
          f"(slowest round {max(r['promote_to_full_recall_s'] for r in rounds):.2f} s)")
    print(f"recalls during the switch: {median['recalls']:.0f}, degraded {median['degraded']:.0f}, failed "
          f"{median['failed']:.0f}, slowest {median['slowest_recall_s']:.2f} s (provider_timeout 1 s)")
    print(f"ingest, 8 callers: synchronous replication {summary['ingest_per_s_sync_median']:.0f}/s, "
          f"asynchronous {summary['ingest_per_s_async_median']:.0f}/s")


if __name__ == "__main__":
    trio.run(main)
