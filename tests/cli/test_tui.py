"""The TUI (REQ-19): its state machine without a terminal, and the real program in a real
terminal under tmux against a running daemon (send-keys / capture-pane)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fix_daemon import daemon_in_process, start_daemon
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from memactors.service import open_memory_service
from memactors.tui import ESC, HELP_MAIN, HELP_OVERLAY, HarnessEntry, Load, TuiState
from support import example, run_record, wait_ready
from support_console import tmux, wait_for, wait_for_change

HARNESS = '[harness.api-fixer]\nharness = "claude-code"\nprompt = "fix it"\nmemory_briefing = true\n'
SERVICE = "harness.v1.MemoryService"


@pytest.mark.req19
async def test_req19_the_tui_preview_shows_degraded_state(make_holder) -> None:  # type: ignore[no-untyped-def]
    """The provider is down (its command cannot start): the overlay still shows the deterministic
    sections and marks episodes provider_unavailable."""
    down = '[memory]\nprovider = "gone"\n[mcp.gone]\ncommand = "/nonexistent/memory-provider"\n'
    async with open_memory_service(make_holder(down + HARNESS)) as memory:
        # The session starts "connecting" and turns "down" once its spawn fails: wait for the state the
        # overlay is asserted to show (this raced under load when it read the status straight away).
        await wait_ready(memory, "down")
        await memory.ingest_run(example("run-42-api-fixer.json"))
        await memory.add_fact(scope="project:forge.example/acme/api", text="ledger tests need -race",
                              confidence=0.9)
        app = TuiState([HarnessEntry("api-fixer", "claude-code", True)])
        wanted = app.key("B")
        assert wanted == Load("api-fixer")
        app.loaded(await memory.get_briefing("api-fixer"), await memory.status())
        text = "\n".join(app.lines())
        assert "provider gone: unreachable since" in text  # its real state, not "breaker closed"
        assert "cannot start /nonexistent/memory-provider" in text and "breaker" not in text
        assert "provider_unavailable" in text
        assert "memory_briefing: yes" in text
        for section in ("collisions", "recent_runs", "facts", "episodes"):
            assert section in text
        assert "ledger tests need -race" in text  # the deterministic facts section is there
        assert app.key("r") == Load("api-fixer")  # recompute asks for a fresh GetBriefing
        app.key(ESC)
        assert app.overlay is None and app.loading is None
        assert "> api-fixer" in "\n".join(app.lines())


def test_navigation_help_line_and_quit() -> None:
    app = TuiState([HarnessEntry("a", "codex", False), HarnessEntry("b", "claude-code", True)])
    assert app.help_line() == HELP_MAIN
    app.key("down")
    assert app.selected == 1
    app.key("j")
    assert app.selected == 1
    app.key("up")
    assert app.selected == 0
    assert app.key("r") == Load()  # refresh the lists
    assert app.key("B") == Load("a")
    assert app.help_line() == HELP_OVERLAY and app.lines()[0] == "loading the briefing for a…"
    app.failed("daemon not reachable")
    assert app.lines()[0] == "error: daemon not reachable"
    app.key(ESC)
    assert not app.in_overlay
    app.key("q")
    assert app.quit


def test_an_answer_arriving_after_esc_does_not_reopen_the_overlay() -> None:
    app = TuiState([HarnessEntry("a", "codex", False)])
    app.key("B")
    app.key(ESC)
    app.loaded({"harness": "a", "document": "x"}, {"state": "ready"})
    assert not app.in_overlay


def test_without_harness_tables_the_list_shows_harnesses_seen_in_episodes() -> None:
    app = TuiState([])
    assert app.harness_lines()[0].startswith("(no [harness.*] configured")
    app.refreshed({"state": "ready", "provider": "builtin", "pending": {"records": 2, "forgets": 0}},
                  {"episodes": [{"harness": "billing-bot", "run_id": "7"}, {"harness": "api-fixer", "run_id": "42"}],
                   "total": 2})
    assert [h.name for h in app.harnesses] == ["api-fixer", "billing-bot"]
    lines = app.harness_lines()
    assert lines[0] == "> api-fixer  (seen)" and "[harness.<name>] table" in "\n".join(lines)
    assert "pending 2 records, 0 forgets" in app.header()
    assert app.key("B") == Load("api-fixer")  # the daemon's answer then says a table is needed


def test_the_header_shows_provider_state_and_pending_work_or_the_daemon_error() -> None:
    app = TuiState([])
    assert "connecting" in app.header()
    app.refreshed({"provider": "mem0", "state": "degraded", "breaker": "open",
                   "pending": {"records": 3, "forgets": 1, "record_failed": 1, "forget_failed": 0}}, None)
    assert app.header() == ("memactors · provider mem0: degraded · breaker open · pending 3 records, 1 forgets"
                            " · failed 1/0")
    app.unreachable("daemon not reachable at ws://127.0.0.1:1/harness.v1 (OSError)")
    assert "daemon not reachable" in app.header()


# -- the real program in a real terminal ------------------------------------------------------------------------



def unwrap(shown: str) -> str:
    """The overlay's text with the box, the scroll bar and the line breaks taken out."""
    rows = [line.strip("│█ ").strip() for line in shown.splitlines()]
    return " ".join(" ".join(rows).split())


@pytest.mark.slow
@pytest.mark.req19
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux missing: `make test` installs it")
async def test_req19_the_tui_in_a_real_terminal_lists_scrolls_and_wraps_the_briefing(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path, HARNESS) as (config, listening):
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "control")) as rpc:
            await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})
            await rpc.call(f"{SERVICE}/IngestRun", {"record": run_record(run_id="7", harness="billing-bot")})
            # A briefing taller than the terminal, with lines wider than it. The facts differ in a few
            # words each, so they are not near-duplicates a briefing shows once.
            topics = ("ledger reconciliation", "invoice export", "currency conversion", "payout batching",
                      "refund audit", "webhook retry")
            for i, topic in enumerate(topics):
                await rpc.call(f"{SERVICE}/AddFact", {
                    "scope": "project:forge.example/acme/api", "confidence": 0.9,
                    "text": f"fact {i}: the {topic} tests need the race detector and a fixed clock "
                            f"because rounding differs across time zones ({i})"})
        env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", ""), "TERM": "xterm-256color"}
        command = [sys.executable, "-m", "memactors.cli", "tui", "--config", str(config)]
        async with tmux(tmp_path, command, env) as base:
            main = await wait_for(base, "billing-bot")
            assert "> api-fixer" in main and "provider builtin: ready" in main
            # Each episode with its gist: what the run said, not only its ids.
            await wait_for(base, "fixed the ledger rounding")
            assert main.rstrip().splitlines()[-1].startswith("↑/↓ select  B briefing")
            await trio.run_process([*base, "send-keys", "B"])
            top = await wait_for(base, "Briefing preview: api-fixer")
            assert "memory_briefing: yes" in top
            assert "</memory-data" not in top  # too long for 20 rows: the end is below
            await trio.run_process([*base, "send-keys", "End"])
            end = await wait_for(base, "</memory-data")
            assert "Briefing preview: api-fixer" not in end  # scrolled
            for shown in (top, end):
                assert all(len(line) <= 80 for line in shown.splitlines())
            # A fact wider than the terminal is wrapped onto the next rows, not cut (the facts are just
            # above the end: the episodes come last). Scrolled up a row at a time until one is whole on
            # the screen; which two of the six facts fit is decided by their (random) ids: any of them.
            wrapped = "the race detector and a fixed clock because rounding differs across time zones"
            up = end
            while not (re.search(r"fact \d: the", up) and wrapped in unwrap(up)):  # a cut fact never is
                await trio.run_process([*base, "send-keys", "Up"])
                up = await wait_for_change(base, up)
            await trio.run_process([*base, "send-keys", "Home"])
            await wait_for(base, "Briefing preview: api-fixer")
            await trio.run_process([*base, "send-keys", "Escape"])
            await wait_for(base, "Briefing preview", present=False)
            await trio.run_process([*base, "send-keys", "q"])
            with trio.fail_after(60):
                while (await trio.run_process([*base, "has-session"], check=False,  # noqa: ASYNC110
                                              capture_stderr=True)).returncode == 0:
                    await trio.sleep(0.1)  # the session ends when the TUI exits


@pytest.mark.slow
@pytest.mark.req13
@pytest.mark.req19
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux missing: `make test` installs it")
async def test_req19_a_provider_down_for_minutes_is_shown_unreachable_since_not_breaker_closed(
        tmp_path: Path) -> None:
    """`memory status`, doctor and the TUI said "breaker closed" for a provider that had been
    down for more than 5 minutes (a provider that is down is refused before the breaker, which never
    opens). The daemon as a process, its provider's command missing; doctor's five minutes shortened to
    one second (the only change; `fix_daemon` constants). Every surface that showed the breaker
    says since when the provider is unreachable and its last error instead: `memory status` and
    `doctor` as subprocesses, the TUI in a real terminal under tmux."""
    down = '[memory]\nprovider = "gone"\n[mcp.gone]\ncommand = "/nonexistent/memory-provider"\n'
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(
        tmp_path, extra_config=down + HARNESS, constants={"memactors.doctor.UNREACHABLE_FAIL_SECONDS": 1.0}))
    env = {**daemon.env, "PATH": os.environ.get("PATH", ""), "TERM": "xterm-256color"}

    async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=env,
                                      capture_stdout=True, capture_stderr=True, check=False)

    try:
        with trio.fail_after(120):  # a hang guard: down at the first failed spawn, then past doctor's limit
            while True:
                st = json.loads((await cli("memory", "status", "--json")).stdout)
                if st["state"] == "down" and st["state_for_seconds"] > 1.5:
                    break
                await trio.sleep(0.2)
        assert st["breaker"] == "closed"  # what it was: the breaker never saw a call
        assert st["condition"].startswith(f"unreachable since {st['state_since']} (")
        assert "last error: cannot start /nonexistent/memory-provider" in st["condition"]

        status = await cli("memory", "status")
        assert status.returncode == 10  # provider down
        line = next(x for x in status.stdout.decode().splitlines() if x.startswith("state "))
        assert "unreachable since" in line and "cannot start /nonexistent/memory-provider" in line, line
        assert "breaker" not in status.stdout.decode()

        doctor = (await cli("doctor")).stdout.decode()
        provider_row = next(x for x in doctor.splitlines() if re.match(r"^\w+ +memory provider  ", x))
        assert "state unreachable since" in provider_row and "breaker" not in provider_row, doctor
        assert re.search(r"^FAIL +memory provider reachability +gone has been unreachable", doctor, re.M), doctor

        command = [sys.executable, "-m", "memactors.cli", "tui"]
        async with tmux(tmp_path, command, env) as base:
            main = await wait_for(base, "provider gone: unreachable since")
            assert "breaker" not in main.splitlines()[0], main
            await trio.run_process([*base, "send-keys", "B"])
            overlay = unwrap(await wait_for(base, "Briefing preview: api-fixer"))
            assert "provider gone: unreachable since" in overlay and "last error: cannot start" in overlay, overlay
            await trio.run_process([*base, "send-keys", "Escape"])
            await wait_for(base, "Briefing preview", present=False)
            await trio.run_process([*base, "send-keys", "q"])
    finally:
        await trio.to_thread.run_sync(daemon.stop)
