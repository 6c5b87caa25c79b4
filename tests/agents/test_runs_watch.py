"""Runs you can watch and stop, as a user does it: the daemon as a process, the CLI as a
subprocess, a real agent (Claude Code against the loopback Anthropic fake, or the stand-in agent).

`runs list/show/wait/cancel/logs`, Ctrl-C on `run --wait` (without a terminal and on one), a launch that
fails with its stderr tail, the per-harness caps stopping a looping agent, and runs kept across a
daemon restart.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from fix_daemon import serving_env as daemon
from memactors.cli._core import SERVICE
from memactors.rpc.wsclient import WsRpcError, call_once
from memactors.testing.fake_anthropic import Script, ToolUse, run_fake_anthropic
from support import write_config
from support_runs import (
    base_env,
    claude_binary,
    claude_env,
    cli,
    command_harness,
    fake_claude,
    make_repo,
    rows,
    wait_for_file,
)

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "memactors.cli"]
WAIT = "python3 -c 'import time; time.sleep(600)'"


def alive(pid: int) -> bool:
    """The process runs (a zombie, killed but not yet reaped by an init that does not reap, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return True
    return "\nState:\tZ" not in status


async def json_of(env: dict[str, str], *args: str) -> Any:
    done = await cli(env, *args, "--json")
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


@asynccontextmanager
async def background(env: dict[str, str], *args: str, **kwargs: Any) -> AsyncIterator[trio.Process]:
    """The CLI as a process left running (its stdout a pipe), killed if the test leaves it running."""
    proc = await trio.lowlevel.open_process([*CLI, *args], env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, **kwargs)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def read_until(stream: Any, marker: bytes, seen: bytearray) -> None:
    """Read a process's pipe into ``seen`` until ``marker`` appears (bounded)."""
    with trio.fail_after(60):
        while marker not in seen:
            chunk = await stream.receive_some(65536)
            assert chunk, f"EOF before {marker!r}: {bytes(seen)[-2000:]!r}"
            seen += chunk


async def read_all(stream: Any, seen: bytearray) -> bytes:
    with trio.fail_after(60):
        while chunk := await stream.receive_some(65536):
            seen += chunk
    return bytes(seen)


def _long_harness(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a daemon whose harness ``long`` runs the stand-in agent in ``sleep`` mode (it
    writes its pid to OUT/pid, then waits to be stopped), and OUT."""
    out = tmp_path / "out"
    repo = make_repo(tmp_path / "api")
    config = write_config(tmp_path, command_harness("long", workdir=repo, mode="sleep", out=out))
    return base_env(tmp_path, config), out


async def test_runs_list_show_wait_cancel_logs_with_a_real_claude_run_and_after_a_restart(tmp_path: Path) -> None:
    """A real `claude` run that sits in a long shell command: it is listed running with its pid, its
    events stream to `runs logs --follow`, `runs cancel` stops it (SIGTERM to its group), `runs wait`
    returns with its outcome, it is recorded as an episode, and after a daemon restart it is still
    listed, shown and its log read."""
    claude = claude_binary()
    repo = make_repo(tmp_path / "api")
    # (Claude Code blocks a bare `sleep 600`; a program that waits is a long command like any build.)
    script = Script((ToolUse("Bash", {"command": WAIT, "description": "Wait for the build"}),))
    config = write_config(tmp_path, f"""
[harness.sleeper]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt = "Wait for the build."
allowed_tools = ["Bash(python3:*)"]
""")
    state, log = tmp_path / "state", tmp_path / "daemon.log"
    async with run_fake_anthropic(script) as fake:
        env = claude_env(tmp_path, config, fake.base_url)
        with daemon(env, state, log):
            started = await cli(env, "run", "sleeper")
            assert started.returncode == 0, started.stderr
            run_id = started.stdout.split()[1].decode()
            async with background(env, "runs", "logs", run_id, "--follow") as follow, \
                    background(env, "runs", "wait", run_id, "--json") as waiter:
                followed = bytearray()
                await read_until(follow.stdout, b"tool    Bash", followed)

                listed = await json_of(env, "runs", "list")
                [row] = [r for r in listed["runs"] if r["run_id"] == run_id]
                assert (row["harness"], row["state"], row["adapter"]) == ("sleeper", "running", "claude-code")
                assert alive(row["pid"])
                assert [r["run_id"] for r in (await json_of(env, "runs", "list", "--state", "running"))["runs"]] \
                    == [run_id]
                assert (await json_of(env, "runs", "list", "--state", "ended"))["runs"] == []
                shown = await json_of(env, "runs", "show", run_id)
                assert (shown["state"], shown["pid"], shown["outcome"]) == ("running", row["pid"], None)
                text = await cli(env, "runs", "show", run_id)
                assert f"pid {row['pid']}".encode() in text.stdout and b"state       running" in text.stdout

                cancelled = await cli(env, "runs", "cancel", run_id)
                assert cancelled.returncode == 0, cancelled.stderr
                assert f"run {run_id}: cancelled (operator_cancel), ep_".encode() in cancelled.stdout

                waited = bytearray()
                await read_all(waiter.stdout, waited)
                assert await waiter.wait() == 13  # cancelled
                assert json.loads(waited)["outcome"] == "cancelled"
                await read_all(follow.stdout, followed)
                assert await follow.wait() == 0  # --follow ends with the run
            assert not alive(row["pid"])
            lines = followed.decode()
            assert "session " in lines and "tool    Bash" in lines and "daemon  cancel asked: stopping" in lines

            ended = await json_of(env, "runs", "show", run_id)
            assert (ended["state"], ended["outcome"], ended["reason"], ended["stopped_by"]) == (
                "ended", "cancelled", "operator_cancel", "cancel")
            episode = await json_of(env, "memory", "episodes", ended["episode_id"])
            assert episode["episode"]["outcome"] == "cancelled"
            again = await cli(env, "runs", "cancel", run_id)
            assert again.returncode == 0 and b"had already ended" in again.stderr

        # A new daemon process: the ended run is in the store.
        with daemon(env, state, log):
            listed = await json_of(env, "runs", "list", "--harness", "sleeper")
            assert [(r["run_id"], r["state"], r["outcome"]) for r in listed["runs"]] == [(run_id, "ended", "cancelled")]
            assert (await json_of(env, "runs", "show", run_id))["episode_id"] == ended["episode_id"]
            logs = await cli(env, "runs", "logs", run_id, "--json")
            kinds = [json.loads(line)["kind"] for line in logs.stdout.splitlines()]
            assert "tool" in kinds and "daemon" in kinds
            missing = await cli(env, "runs", "show", "r-no-such-run")
            assert missing.returncode == 4 and b"no run r-no-such-run" in missing.stderr


async def test_ctrl_c_on_run_wait_without_a_terminal_says_how_to_reattach_and_cancel(tmp_path: Path) -> None:
    env, out = _long_harness(tmp_path)
    with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
        async with background(env, "run", "long", "--wait", stdin=subprocess.DEVNULL) as waiting:
            agent = int(await wait_for_file(out / "pid"))
            started = bytearray()
            await read_until(waiting.stdout, b"started", started)
            run_id = started.split()[1].decode()
            waiting.send_signal(signal.SIGINT)
            assert await waiting.wait() == 130
            err = bytearray()
            message = (await read_all(waiting.stderr, err)).decode()
        assert f"run {run_id} of long is still running (pid {agent})" in message
        assert f"memactors runs wait {run_id} --harness long" in message
        assert f"memactors runs cancel {run_id} --harness long" in message
        assert alive(agent)  # Ctrl-C on the CLI is not a cancel: the daemon still supervises the agent
        assert (await json_of(env, "runs", "show", run_id))["state"] == "running"
        state = tmp_path / "state"
        url = json.loads((state / "daemon.json").read_text(encoding="utf-8"))["operator"]
        read_token = (state / "operator-read.token").read_text(encoding="utf-8")
        with pytest.raises(WsRpcError) as denied:  # cancel is a control-tier call
            await trio.to_thread.run_sync(lambda: call_once(url, read_token, f"{SERVICE}/CancelRun",
                                                            {"run_id": run_id}))
        assert denied.value.code == "PERMISSION_DENIED" and alive(agent)
        done = await cli(env, "runs", "cancel", run_id, "--harness", "long")
        assert done.returncode == 0 and b"cancelled (operator_cancel)" in done.stdout
        assert not alive(agent)


async def test_ctrl_c_on_run_wait_on_a_terminal_asks_and_cancels_on_yes(tmp_path: Path) -> None:
    env, out = _long_harness(tmp_path)
    with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
        controller, terminal = pty.openpty()
        try:
            async with background(env, "run", "long", "--wait", stdin=terminal) as waiting:
                os.close(terminal)
                terminal = -1
                agent = int(await wait_for_file(out / "pid"))
                started = bytearray()
                await read_until(waiting.stdout, b"started", started)
                waiting.send_signal(signal.SIGINT)
                asked = bytearray()
                await read_until(waiting.stderr, b"[y/N]", asked)
                assert b"Cancel run " in asked and b"Otherwise it keeps running." in asked
                os.write(controller, b"y\n")
                assert await waiting.wait() == 13  # cancelled
                said = bytearray()
                await read_all(waiting.stdout, said)
            assert b"cancelled (operator_cancel)" in said
            assert not alive(agent)
        finally:
            os.close(controller)
            if terminal >= 0:
                os.close(terminal)


async def test_a_bad_flag_to_the_real_claude_is_launch_failed_with_its_stderr_tail(tmp_path: Path) -> None:
    claude = claude_binary()
    repo = make_repo(tmp_path / "api")
    config = write_config(tmp_path, f"""
[harness.typo]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt = "Fix it."
extra_args = ["--no-such-flag"]
""")
    env = claude_env(tmp_path, config, "http://127.0.0.1:9")  # never reached: the CLI refuses its argv
    state = tmp_path / "state"
    with daemon(env, state, tmp_path / "daemon.log"):
        done = await cli(env, "run", "typo", "--wait")
        assert done.returncode == 1, done.stderr
        assert b": failed (launch_failed)" in done.stdout
        assert b"the agent produced no output; its stderr (last 4 KiB, redacted):" in done.stderr
        assert b"unknown option '--no-such-flag'" in done.stderr
        run_id = done.stdout.split()[1].decode()
        shown = await json_of(env, "runs", "show", run_id)
        assert (shown["outcome"], shown["reason"], shown["exit_code"]) == ("failed", "launch_failed", 1)
        assert "unknown option '--no-such-flag'" in shown["stderr_tail"]
        text = await cli(env, "runs", "show", run_id)
        assert b"stderr      (last 4 KiB, redacted)" in text.stdout and b"--no-such-flag" in text.stdout
    # The tail is kept with the run, never in its episode (REQ-5).
    [(episode_id,)] = rows(state / "memactors.db", "SELECT episode_id FROM episodes WHERE run_id = ?", run_id)
    body = rows(state / "memactors.db", "SELECT b.body FROM episodes e JOIN episode_bodies b ON b.id = e.body_id"
                " WHERE e.episode_id = ?", episode_id)[0][0]
    assert "no-such-flag" not in body and json.loads(body)["reason"] == "launch_failed"


@pytest.mark.parametrize(("cap", "value"), [("max_turns", "3"), ("max_cost_usd", "0.002")])
async def test_a_cap_stops_a_looping_real_claude(tmp_path: Path, cap: str, value: str) -> None:
    """A scripted agent that never finishes (the fake answers every turn with another shell command):
    the cap, passed to claude as --max-turns / --max-budget-usd, stops it after a few model requests
    (a loop like this made 1,096 requests in 3 minutes before caps); the outcome's reason says so."""
    claude = claude_binary()
    repo = make_repo(tmp_path / "api")
    script = Script((ToolUse("Bash", {"command": "echo again", "description": "Try again"}),), loop=True)
    config = write_config(tmp_path, f"""
[harness.looper]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt = "Loop."
allowed_tools = ["Bash(echo:*)"]
{cap} = {value}
""")
    async with run_fake_anthropic(script) as fake:
        env = claude_env(tmp_path, config, fake.base_url)
        with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
            done = await cli(env, "run", "looper", "--wait", "--json")
            assert done.returncode == 1, done.stderr  # failed: the agent stopped itself at the cap
            run = json.loads(done.stdout)
            assert (run["outcome"], run["reason"], run["cap"]) == ("failed", "budget_exceeded", cap)
            shown = await json_of(env, "runs", "show", run["run_id"])
            assert shown[cap] == float(value) and shown["turns"] <= 3
        assert 1 <= len(fake.agent_requests()) <= 3


@pytest.mark.parametrize(("cap", "value", "why"), [
    ("max_turns", "3", "4 turns passed max_turns = 3"),
    ("max_cost_usd", "0.025", "reported cost $0.03 passed max_cost_usd = 0.025"),
])
async def test_the_daemon_stops_an_agent_that_passes_its_cap_anyway(tmp_path: Path, cap: str, value: str,
                                                                   why: str) -> None:
    """A claude that ignores --max-turns / --max-budget-usd (tests/data/fake_claude.py loop): the daemon
    reads the turns and cost it reports and stops it there: cancelled / budget_exceeded, the cap named."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    claude = fake_claude(tmp_path / "bin", "loop", out)
    config = write_config(tmp_path, f"""
[harness.stubborn]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt = "Loop."
{cap} = {value}
""")
    env = base_env(tmp_path, config)
    with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
        done = await cli(env, "run", "stubborn", "--wait", "--json")
        assert done.returncode == 13, done.stderr  # cancelled
        run = json.loads(done.stdout)
        assert (run["outcome"], run["reason"], run["cap"]) == ("cancelled", "budget_exceeded", cap)
        logs = await cli(env, "runs", "logs", run["run_id"])
        assert f"{why}: stopping the run".encode() in logs.stdout
    argv = json.loads((out / "argv-0.json").read_text(encoding="utf-8"))
    flag = {"max_turns": "--max-turns", "max_cost_usd": "--max-budget-usd"}[cap]
    assert argv[argv.index(flag) + 1] == value  # the cap was passed to the CLI too
    assert not alive(int((out / "pid").read_text(encoding="utf-8")))


async def test_a_run_left_running_by_a_killed_daemon_is_ended_and_its_agent_stopped_at_restart(
        tmp_path: Path) -> None:
    """kill -9 of the daemon leaves its agent running (a session of its own). The next daemon finds the
    run still `running` in the store: it kills that agent (its environment proves the pid is still
    that run's) and marks the run crashed, so nothing runs unwatched and `runs list` tells the truth."""
    env, out = _long_harness(tmp_path)
    state, log = tmp_path / "state", tmp_path / "daemon.log"
    with daemon(env, state, log) as proc:
        started = await cli(env, "run", "long")
        run_id = started.stdout.split()[1].decode()
        agent = int(await wait_for_file(out / "pid"))
        proc.kill()
        proc.wait(timeout=30)
    assert alive(agent)
    with daemon(env, state, log):
        shown = await json_of(env, "runs", "show", run_id)
        assert not alive(agent)
    assert (shown["state"], shown["outcome"], shown["reason"]) == ("ended", "crashed", "internal_error")
    assert shown["error"] == "the daemon stopped while the run was running (its agent: killed)"
    assert not list((state / "runs").glob("mcp-*.json"))  # the dead daemon's MCP config file is gone
