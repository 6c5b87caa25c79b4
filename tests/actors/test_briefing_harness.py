"""A briefing's episodes are picked for its harness (REQ-14's query names it), through the
surfaces users touch: the gateway's briefing tool with a run token and a real MCP client over HTTP
(both store engines), and `memactors memory briefing <harness>` as a subprocess against the daemon as a
process.

Two harnesses work in one repository: api-fixer on the ledger, api-docs on the documentation, their
runs interleaved in time, so the repository's newest runs are a mix of both. Each harness's briefing
shows its own newest runs, never the other's, and the two differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp.types as t
import pytest
import trio

from fix_daemon import daemon_process
from memactors.config import ConfigHolder
from support import run_record, serving, write_config
from support_briefing import COMPACT, REPO, episode_blocks
from support_readside import as_run, fixed_clock, gateway_client
from support_runs import command_harness, make_repo

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike: each engine's briefing_order

#: (harness, files, subject) of each run, oldest first: the fixer's and the docs writer's work alternate.
WORK = (
    ("api-fixer", ("src/ledger/post.py", "tests/test_ledger.py"), "Fix rounding of ledger totals"),
    ("api-docs", ("docs/ledger.md", "README.md"), "Document the ledger rounding rule"),
    ("api-fixer", ("src/ledger/post.py", "src/ledger/currency.py"), "Use Decimal for currency conversion"),
    ("api-docs", ("docs/webhooks.md",), "Describe the webhook retry schedule"),
    ("api-fixer", ("src/ledger/post.py",), "Post entries in one transaction"),
    ("api-docs", ("docs/ledger.md",), "Explain posting in the ledger guide"),
    ("api-fixer", ("src/ledger/currency.py", "tests/test_ledger.py"), "Cache the exchange rates per day"),
    ("api-docs", ("README.md", "docs/index.md"), "Link the guides from the README"),
    ("api-fixer", ("src/ledger/post.py", "tests/test_ledger.py"), "Reject entries that do not balance"),
    ("api-docs", ("docs/ledger.md",), "Add a worked example to the ledger guide"),
)
HARNESSES = ("api-fixer", "api-docs")
#: The widest briefing, so its episodes share (1000 characters) holds several whole items (REQ-14: an
#: item is placed whole or dropped whole) and the picks' order can be read.
WIDE = "briefing_max_chars = 4000\n"
CONFIG = "".join(f'[harness.{h}]\nharness = "claude-code"\n{WIDE}' for h in HARNESSES)


def runs() -> list[dict[str, Any]]:
    out = []
    for i, (harness, files, subject) in enumerate(WORK):
        at = f"2026-11-{10 + i:02d}T09:00:00Z"
        out.append(run_record(
            harness=harness, run_id=f"r{i:02d}-{harness}", trace_id=f"4bf92f3577b34da6a3ce929d0e0e{i:04x}",
            started_at=at, ended_at=f"2026-11-{10 + i:02d}T09:10:00Z", duration_ms=600000,
            outcome="succeeded", reason="completed",
            result_text=f"{subject}.\n\nThe change touched {', '.join(files)} and its tests pass.",
            events=[{"kind": "edit", "session_id": "s1", "at": at, "path": f} for f in files],
            sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": REPO, "git_branch": "main"}]))
    return out


def newest_of(harness: str, n: int = 3) -> list[str]:
    return [r["run_id"] for r in runs() if r["harness"] == harness][::-1][:n]


def shown_runs(document: str) -> list[tuple[str, str]]:
    """(run id, harness) of each episode a briefing shows, from its provenance lines."""
    out = []
    for line, _text in episode_blocks(document):
        m = COMPACT.match(line)
        assert m, line
        out.append((m.group(1), m.group(2)))
    return out


def check_picks(picks: dict[str, list[tuple[str, str]]]) -> None:
    """Each harness sees at least two episodes, all its own runs, its newest first (the others are
    its recent runs that touched the files it edits most); the harnesses' picks differ."""
    for harness, shown in picks.items():
        assert len(shown) >= 2, (harness, shown)
        assert {h for _, h in shown} == {harness}, (harness, shown)
        ids = [r for r, _ in shown]
        assert ids[0] == newest_of(harness)[0] and len(set(ids)) == len(ids), (harness, ids)
    assert picks["api-fixer"] != picks["api-docs"]


def text_of(result: t.CallToolResult) -> str:
    assert not result.is_error, result
    return "".join(c.text for c in result.content if isinstance(c, t.TextContent))


@pytest.mark.req14
async def test_req14_each_harness_briefing_shows_its_own_recent_runs(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    """Once both harnesses got the same two episodes (the repository's newest, whoever ran
    them); the briefing tool now gives each harness its own newest runs on the branch."""
    checkout = make_repo(tmp_path / "api")  # origin forge.example:acme/api, branch main: the run's place
    async with serving(make_holder(CONFIG), wall_clock=fixed_clock) as (service, url):
        for record in runs():
            await service.ingest_run(record)
        picks = {}
        for i, harness in enumerate(HARNESSES):
            token, view = await as_run(service, harness, f"10{i}", None, workdir=str(checkout))
            assert view.repo == REPO
            async with gateway_client(url, token) as client:
                picks[harness] = shown_runs(text_of(await client.call_tool("briefing", {})))
    check_picks(picks)


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=env, capture_stdout=True,
                                  capture_stderr=True, check=False)


@pytest.mark.slow
@pytest.mark.req14
async def test_memory_briefing_of_two_harnesses_shows_each_its_own_runs(tmp_path: Path) -> None:
    """`memactors memory briefing <harness>` (the operator's preview) of two harnesses of one repository,
    the daemon a process and the records ingested with `memactors runs ingest`. On the embedded store only
    (no `engine` fixture): the gateway test above covers PostgreSQL's ordering; this one is the CLI's."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    config = write_config(tmp_path, "".join(command_harness(h, workdir=repo, mode="briefing", out=out, extra=WIDE)
                                            for h in HARNESSES))
    records = tmp_path / "records"
    records.mkdir()
    for record in runs():
        (records / f"{record['run_id']}.json").write_text(json.dumps(record), encoding="utf-8")
    with daemon_process(tmp_path, config=config) as daemon:
        ingested = await cli(daemon.env, "runs", "ingest", str(records))
        assert ingested.returncode == 0, ingested.stderr
        picks = {}
        for harness in HARNESSES:
            done = await cli(daemon.env, "memory", "briefing", harness)
            assert done.returncode == 0, done.stderr
            picks[harness] = shown_runs(done.stdout.decode())
    check_picks(picks)
