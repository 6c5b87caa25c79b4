"""Read-side latency with a dead provider (SPEC-0030 REQ-13): recall and a memory_briefing spawn.

Starts the embedded memory service over the fault provider as a real stdio subprocess, records a few
runs and facts, then kills the provider (SIGKILL) or freezes it (SIGSTOP) and times, over many calls,
`recall` for a harness run and `prepare_spawn` for a `memory_briefing = true` one-shot. Every call
must come back degraded (never an error) within `provider_timeout` plus a small margin.

    .venv/bin/python bench/read_side_faults.py --calls 200 --timeout 2s

Prints, per fault and path, the median, p99 and max latency in milliseconds against provider_timeout,
and the machine it ran on. With a frozen provider the first calls wait for the deadline until five
timeouts open the breaker; after that calls are refused at once, which is the point of the breaker.
A killed provider is restarted by the provider session (reconnect with backoff), so once it is back,
calls are answered normally again: "degraded" counts only the calls made while it was gone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import trio

from memactors.actors.spawn import prepare_spawn
from memactors.config import ConfigHolder, load_config
from memactors.logs import configure_logging
from memactors.service import open_memory_service

API = "forge.example/acme/api"


def _config(root: Path, timeout: str) -> Path:
    pidfile = root / "provider.pid"
    args = ["-c", (
        "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
        " from memactors.testing.fault_provider import main; main(sys.argv[2:])"
    ), str(pidfile)]
    (root / "prompt.md").write_text("Triage the open issues.\n")
    path = root / "harness.toml"
    path.write_text(
        f'[store]\npath = "{root / "state"}"\n'
        '[memory]\nprovider = "fault"\n'
        f'[memory.episodes]\nprovider_timeout = "{timeout}"\nsummary = false\n'
        f"[mcp.fault]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps(args)}\n"
        f'[harness.nightly]\nharness = "claude-code"\nprompt_file = "{root / "prompt.md"}"\n'
        "memory_briefing = true\n"
    )
    return path


def _stats(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"median {statistics.median(ms):8.2f}  p99 {p99:8.2f}  max {ms[-1]:8.2f} ms"


async def _run(fault: str, calls: int, provider_timeout: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = _config(root, provider_timeout)
        holder = ConfigHolder(lambda: load_config(path))
        out: list[str] = []
        async with open_memory_service(holder) as memory:
            with trio.fail_after(20):
                while (await memory.status())["state"] != "ready":  # noqa: ASYNC110 -- polls the actor
                    await trio.sleep(0.02)
            limit = memory.config.episodes.provider_timeout
            for i in range(5):
                await memory.ingest_run({
                    "harness": "nightly", "adapter": "claude-code", "run_id": f"r{i}", "trace_id": f"t{i}",
                    "started_at": f"2026-11-2{i}T09:00:00Z", "ended_at": f"2026-11-2{i}T09:10:00Z",
                    "duration_ms": 600000, "outcome": "succeeded", "reason": "completed",
                    "result_text": f"ledger run {i}", "spawned_process": True,
                    "sessions": [{"session_id": "s", "cwd": "/srv/api", "repo": API, "git_branch": "main"}],
                    "events": [{"kind": "edit", "session_id": "s", "at": "2026-11-20T09:05:00Z",
                                "path": "internal/ledger/post.go"}]})
            for i in range(10):
                await memory.add_fact(scope=f"project:{API}", text=f"ledger fact {i}", confidence=0.5 + i / 40)
            await memory.report_presence(harness="nightly", run_id="live", session_id="s", repo=API, branch="main",
                                         paths=(), ttl_seconds=86400)
            token = (await memory.mint_run_token(harness="nightly", run_id="live", workdir=str(root)))["token"]
            view = await memory.caller_view(token)
            pid = int((root / "provider.pid").read_text())
            os.kill(pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
            try:
                recall, spawn, degraded = [], [], 0
                for _ in range(calls):
                    start = trio.current_time()
                    answer = await memory.agent_recall(view, query="ledger", paths=("internal/ledger",))
                    recall.append(trio.current_time() - start)
                    degraded += answer.outcome == "degraded"
                for i in range(calls):
                    # The run's repository comes from its live presence, as for a run already working.
                    await memory.report_presence(harness="nightly", run_id=f"spawn-{i}", session_id="s", repo=API,
                                                 branch="main", paths=(), ttl_seconds=86400)
                    start = trio.current_time()
                    plan = await prepare_spawn(memory, harness="nightly", run_id=f"spawn-{i}", workdir=str(root),
                                               base_argv=["claude", "-p"])
                    spawn.append(trio.current_time() - start)
                    degraded += plan.degraded == "provider_unavailable"
                over = sum(1 for s in recall + spawn if s > limit + 0.1)
                out.append(f"{fault:<7} recall        n={calls}  {_stats(recall)}")
                out.append(f"{fault:<7} prepare_spawn n={calls}  {_stats(spawn)}")
                out.append(f"{fault:<7} provider_timeout {limit * 1000:.0f} ms; degraded {degraded}/{2 * calls};"
                           f" over timeout+100ms: {over}")
            finally:
                if fault == "frozen":
                    os.kill(pid, signal.SIGCONT)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--timeout", default="2s", help="provider_timeout (default 2s)")
    parser.add_argument("--fault", choices=["killed", "frozen", "both"], default="both")
    ns = parser.parse_args()
    configure_logging("ERROR")
    print(f"machine: {platform.platform()} · {platform.processor() or platform.machine()} · "
          f"{os.cpu_count()} cpus · Python {platform.python_version()}")
    for fault in (["killed", "frozen"] if ns.fault == "both" else [ns.fault]):
        for line in trio.run(_run, fault, ns.calls, ns.timeout):
            print(line, flush=True)


if __name__ == "__main__":
    main()
