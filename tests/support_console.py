"""The web console's tests' daemon: a real `memactors serve` with `[console] enabled`, two
configured harnesses in two repositories, and episodes ingested over the operator RPC, one of them an
XSS payload."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from fix_daemon import Daemon, start_daemon
from memactors.rpc.wsclient import call_once
from support import run_record
from support_runs import command_harness, make_repo

SERVICE = "harness.v1.MemoryService/"
API = "forge.example/acme/api"
WEB = "forge.example/acme/web"
#: What an agent wrote as its result in the web repository: script, if it ever ran, would set the title.
XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">ledger rounding'

CONSOLE_CONFIG = (
    '[console]\nenabled = true\nlisten = "127.0.0.1:0"\n'
    '[harness.api-fixer]\nharness = "claude-code"\nmemory_briefing = true\n'
    '[harness.web-fixer]\nharness = "claude-code"\nmemory_briefing = true\n'
)


def rpc(daemon: Daemon, method: str, tier: str = "control", **params: Any) -> Any:
    return call_once(daemon.info["operator"], daemon.token(tier), SERVICE + method, params)


def seed(daemon: Daemon) -> dict[str, str]:
    """Ingest the test episodes; wait (polling Status) until the provider holds all of them. Returns
    episode ids by name."""
    records = {
        "api": run_record(run_id="1", result_text="fixed the ledger rounding in the api"),
        "api2": run_record(run_id="2", outcome="failed", reason="exit_nonzero",
                           result_text="could not reproduce the ledger rounding"),
        "web": run_record(harness="web-fixer", run_id="3", result_text=XSS,
                          sessions=[{"session_id": "s3", "cwd": "/srv/web", "repo": WEB, "git_branch": "main"}]),
    }
    for record in records.values():
        rpc(daemon, "IngestRun", record=record)
    deadline = time.monotonic() + 120  # a hang guard on a loaded machine, not a timing under test
    while True:
        status = rpc(daemon, "Status", "read")
        if status["pending"]["records"] == 0 and (status["counts"] or {}).get("indexed_ids", 0) >= len(records):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    listed = rpc(daemon, "ListEpisodes", "read", limit=100)["episodes"]
    by_run = {row["run_id"]: row["episode_id"] for row in listed}
    return {name: by_run[record["run_id"]] for name, record in records.items()}


def console_daemon(tmp_path: Path, *, runs: bool = False, **options: Any) -> Daemon:
    """The daemon with the console on; with ``runs``, also harness ``long``, whose one-shot runs the
    stand-in agent in ``sleep`` mode (it waits until stopped) with the command adapter."""
    extra = CONSOLE_CONFIG
    if runs:
        repo = make_repo(tmp_path / "repo")
        extra += command_harness("long", workdir=repo, mode="sleep", out=tmp_path / "out")
    return start_daemon(tmp_path, extra_config=extra, **options)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html[:2000]
    return match.group(1)


@asynccontextmanager
async def tmux(tmp_path: Path, command: list[str], env: dict[str, str]) -> AsyncIterator[list[str]]:
    """A tmux server of our own (its own socket, so parallel tests never share one) running `command`
    in an 80×20 window; yields the tmux argv prefix for send-keys / capture-pane."""
    base = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    env_args = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
    await trio.run_process([*base, "new-session", "-d", "-x", "80", "-y", "20", *env_args, *command])
    try:
        yield base
    finally:
        await trio.run_process([*base, "kill-server"], check=False)


async def screen(base: list[str]) -> str:
    done = await trio.run_process([*base, "capture-pane", "-p"], capture_stdout=True)
    return done.stdout.decode()


async def wait_for(base: list[str], text: str, *, present: bool = True) -> str:
    """Wait until `text` is (or is no longer) on the screen: the state, not a delay."""
    with trio.fail_after(60):
        while True:
            shown = await screen(base)
            if (text in shown) == present:
                return shown
            await trio.sleep(0.1)


async def wait_for_change(base: list[str], before: str) -> str:
    """Wait until the screen shows something other than `before` (a key's effect): the state, not a delay."""
    with trio.fail_after(60):
        while True:
            shown = await screen(base)
            if shown != before:
                return shown
            await trio.sleep(0.1)
