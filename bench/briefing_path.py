"""What a briefing costs now that it shows episodes: the gateway's briefing tool beside its parts.

    .venv/bin/python bench/briefing_path.py                 # 2,000 runs in one repository, 200 briefings
    .venv/bin/python bench/briefing_path.py --runs 200 --calls 50
    .venv/bin/python bench/briefing_path.py --empty-every 0   # no empty runs

A store of run records that look like real runs (a subject line and a few sentences, 2-4 files, some
failed with verify failures, one in five (`--empty-every`) an empty run that exited at once) in one repository, 8
near-duplicate and 12 distinct facts, the built-in provider. Every call recomputes the briefing
(`refresh: true`), so nothing is served from the per-run cache. Timed, interleaved call by call:

* **gateway**: MCP `tools/call briefing {refresh: true}` over streamable HTTP with a run token
  (`mcp.Client`), the path an agent takes;
* **agent**: `MemoryService.agent_briefing(refresh=True)` in this process (what the gateway's handler
  calls), with the provider asked for 3 candidates (as before briefings showed episodes), 9 and 20 (the contract's
  most), and how many episodes each shows;
* **anchors**: the provider's `memory_recall` for the briefing's query alone (limit 3, 9, 20), through
  the daemon's provider session, and `fit_briefing` alone composing the same sections (pure code).

It prints the machine first, then medians and p99s in milliseconds and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import mcp
import trio
from mcp.client.streamable_http import streamable_http_client

from memactors import documents
from memactors.actors import briefing as briefing_actor
from memactors.actors.provider_session import provider_call
from memactors.config import ConfigHolder, load_config
from memactors.documents import Section, fit_briefing
from memactors.gateway import start_gateway
from memactors.logs import configure_logging
from memactors.service import open_memory_service

REPO = "forge.example/acme/api"
#: Candidates asked of the provider for the briefing's 3 slots: as before briefings showed episodes, a few more, the most.
CANDIDATES = (3, 9, 20)
SUBJECTS = (
    "Fix rounding of ledger totals when posting multi-currency entries",
    "Add retry with jitter to the webhook dispatcher",
    "Migrate session storage from pickle to JSON",
    "Speed up the invoice export by batching its queries",
    "Escape quotes in customer names in the CSV export",
    "Document the ledger rounding rule and the TZ requirement of its tests",
)
BODY = ("The previous code {v} on large tenants, so the change {w} and adds a regression test. "
        "Verified with the full suite; the flaky case passed fifty runs in a row afterwards.")
FILES = ("src/ledger/post.py", "src/ledger/currency.py", "src/webhooks/dispatch.py", "src/auth/session.py",
         "src/billing/export.py", "src/billing/csv_out.py", "docs/ledger.md", "tests/test_ledger.py")


def record(i: int, empty_every: int) -> dict[str, Any]:
    day, minute = divmod(i, 1440)
    at = f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}T{minute // 60:02d}:{minute % 60:02d}:00Z"
    base = {"harness": "api-fixer", "adapter": "claude-code", "run_id": f"r{i:06d}", "trace_id": f"t{i}",
            "started_at": at, "ended_at": at, "duration_ms": 600000, "spawned_process": True,
            "sessions": [{"session_id": "s", "cwd": "/srv/api", "repo": REPO, "git_branch": "main"}]}
    if empty_every and i % empty_every == empty_every - 1:  # an agent CLI that exited at once
        return {**base, "outcome": "failed", "reason": "exit_nonzero", "result_text": "", "events": []}
    failed = i % 7 == 3
    files = [FILES[(i + k) % len(FILES)] for k in range(2 + i % 3)]
    events = [{"kind": "edit", "session_id": "s", "at": at, "path": f} for f in files]
    if failed:
        events.append({"kind": "verify", "session_id": "s", "at": at, "ok": False, "error_class": "AssertionError"})
    text = SUBJECTS[i % len(SUBJECTS)] + f" (step {i}).\n\n" + BODY.format(
        v=("timed out", "drifted by a cent", "broke")[i % 3], w=("batches the queries", "uses Decimal")[i % 2])
    return {**base, "outcome": "failed" if failed else "succeeded", "reason": "verify_failed" if failed
            else "completed", "result_text": text, "events": events}


def stats(xs: list[float]) -> tuple[float, float]:
    ms = sorted(x * 1000 for x in xs)
    return statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]


async def timed(fn: Callable[[], Awaitable[Any]], into: list[float]) -> Any:
    start = time.perf_counter()
    out = await fn()
    into.append(time.perf_counter() - start)
    return out


async def run(n_runs: int, calls: int, empty_every: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "harness.toml"
        path.write_text(f'[store]\npath = "{root / "state"}"\n[gateway]\nlisten = "127.0.0.1:0"\n'
                        '[operator]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                        '[memory.episodes]\nsummary = false\n[harness.api-fixer]\nharness = "claude-code"\n',
                        encoding="utf-8")
        holder = ConfigHolder(lambda: load_config(path, env={"HOME": tmp}))
        async with open_memory_service(holder) as memory, trio.open_nursery() as nursery:
            with trio.fail_after(30):
                while (await memory.status())["state"] != "ready":  # noqa: ASYNC110 -- polls the actor
                    await trio.sleep(0.02)
            for start in range(0, n_runs, 500):
                done = await memory.ingest_runs([{"record": record(i, empty_every)} for i in range(start, min(n_runs, start + 500))])
                refused = [r for r in done["results"] if r["outcome"] == "rejected"]
                assert not refused, refused[0]
            for i in range(8):
                await memory.add_fact(scope=f"project:{REPO}", confidence=0.6 + i / 40, text=(
                    "The ledger tests need TZ=UTC and a fixed clock; run them with make test-ledger before "
                    + ("pushing", "every push", "a push", "you push", "pushing.", "pushing!", "Pushing", "push")[i]))
            for i in range(12):
                await memory.add_fact(scope=f"project:{REPO}", confidence=0.5,
                                      text=f"Distinct fact {i}: {SUBJECTS[i % 6].lower()} needs care in area {i}")
            await memory.report_presence(harness="api-fixer", run_id="live", session_id="s", repo=REPO,
                                         branch="main", paths=(), ttl_seconds=86400)
            token = (await memory.mint_run_token(harness="api-fixer", run_id="live"))["token"]
            view = await memory.caller_view(token)
            url = await start_gateway(memory, nursery)
            query = f"{REPO} main api-fixer"
            default = briefing_actor.BRIEFING_CANDIDATES
            shown = await memory.agent_briefing(view, delivery="tool", refresh=True)
            sections = [(s, n, share) for s, (_, n, share) in zip(shown.document.sections,
                                                                   documents.BRIEFING_LAYOUT, strict=True)]
            times: dict[str, list[float]] = {"gateway": []}
            shows: dict[str, int] = {}
            for n in CANDIDATES:
                times[f"agent ({n} candidates)"] = []
            for n in CANDIDATES:
                times[f"provider limit {n}"] = []
            times["fit_briefing"] = []
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx2.AsyncClient(headers=headers, timeout=None) as http, \
                    mcp.Client(streamable_http_client(url, http_client=http)) as client:
                for _ in range(calls):
                    await timed(lambda: client.call_tool("briefing", {"refresh": True}), times["gateway"])
                    for n in CANDIDATES:
                        briefing_actor.BRIEFING_CANDIDATES = n
                        answer = await timed(lambda: memory.agent_briefing(view, delivery="tool", refresh=True),
                                             times[f"agent ({n} candidates)"])
                        shows[f"agent ({n} candidates)"] = answer.items["episodes"]
                        await timed(lambda n=n: provider_call(  # type: ignore[misc]
                            memory.session.address, "memory_recall",
                            {"query": query, "scope": [f"project:{REPO}"], "limit": n}, caller="daemon"),
                            times[f"provider limit {n}"])
                    documents.BRIEFING_CANDIDATES = default

                    async def compose() -> Any:
                        return fit_briefing([(Section(s.name, s.items, s.dropped, s.note), n, share)
                                             for s, n, share in sections], max_chars=2000,
                                            nonce="0123456789abcdef")

                    await timed(compose, times["fit_briefing"])
            nursery.cancel_scope.cancel()
        empties = n_runs // empty_every if empty_every else 0
        out = [f"store: {n_runs} runs ({empties} empty) in one repository, 20 facts; {calls} briefings each",
               f"the briefing shows: {dict(shown.items)}, {len(shown.text)} characters"]
        base = stats(times["fit_briefing"])[0]
        for name, xs in times.items():
            med, p99 = stats(xs)
            shown_here = f"   episodes shown {shows[name]}" if name in shows else ""
            out.append(f"{name:<22} median {med:8.3f}  p99 {p99:8.3f} ms   {med / base:8.1f}× fit_briefing"
                       + shown_here)
        few = stats(times[f"agent ({CANDIDATES[0]} candidates)"])[0]
        for n in CANDIDATES[1:]:
            out.append(f"{n} candidates / {CANDIDATES[0]} (agent path): "
                       f"{stats(times[f'agent ({n} candidates)'])[0] / few:.2f}×")
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--empty-every", type=int, default=5, help="every Nth run is empty (0: none)")
    ns = parser.parse_args()
    configure_logging("ERROR")
    load = os.getloadavg()
    print(f"machine: {platform.platform()} · {platform.processor() or platform.machine()} · "
          f"{os.cpu_count()} cpus · load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} · Python {platform.python_version()}")
    for line in trio.run(run, ns.runs, ns.calls, ns.empty_every):
        print(line, flush=True)


if __name__ == "__main__":
    main()
