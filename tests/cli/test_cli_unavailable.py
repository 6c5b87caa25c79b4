"""No batch lost to one bad record, and no traceback when the daemon is down or goes away.

* `runs ingest a.json big.json b.json`: a record over the size bound is rejected by name, the others are
  recorded, and a batch of large valid records is split into frames the daemon accepts (it used to lose
  the whole batch of up to 200 records with a traceback).
* Every command that connects to the daemon, run as a subprocess against a daemon that is not there, and
  against one that accepts the websocket and then drops it: one line on stderr, exit 3, no traceback
  (`runs ingest` printed an ExceptionGroup traceback and exited 1).
* `runs ingest` while the daemon is killed with SIGKILL: exit 3 and a line saying where it stopped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from fix_daemon import daemon_process, start_daemon
from memactors import cli
from memactors._limits import MAX_RECORD_BYTES, record_size
from memactors.agents import spool
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import MAX_MESSAGE_SIZE
from support import run_record, write_config

SERVICE = "harness.v1.MemoryService"
HARNESS = '[harness.api-fixer]\nharness = "claude-code"\nprompt = "triage"\n'
TRANSCRIPT = Path(__file__).resolve().parents[1] / "data" / "claude_transcript_session.jsonl"


def run_cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)


def env_for(tmp_path: Path, config: Path) -> dict[str, str]:
    return {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}


def write(path: Path, record: dict[str, Any]) -> str:
    path.write_text(json.dumps(record), encoding="utf-8")
    return str(path)


def rpc(state: Path, method: str, params: dict[str, Any]) -> Any:
    async def go() -> Any:
        info = json.loads((state / "daemon.json").read_text())
        token = (state / "operator-control.token").read_text().strip()
        async with connect_rpc(info["operator"], token) as client:
            return await client.call(f"{SERVICE}/{method}", params)

    return trio.run(go)


# -- a batch keeps every good record ---------------------------------------------------------------------

@pytest.mark.slow
def test_an_oversized_record_is_rejected_by_name_and_the_rest_of_the_batch_is_recorded(tmp_path: Path) -> None:
    """a.json, huge.json (5 MB: more than a whole RPC frame), big.json (1.5 MB: over the 1 MiB bound),
    six valid records of ~1 MB of non-ASCII text each (6 MB together: more than one frame), b.json."""
    files = tmp_path / "records"
    files.mkdir()
    paths = [write(files / "a.json", run_record(run_id="a")),
             write(files / "huge.json", run_record(run_id="huge", result_text="x" * 5_000_000)),
             write(files / "big.json", run_record(run_id="big", result_text="x" * 1_500_000))]
    heavy = [write(files / f"heavy{i}.json", run_record(run_id=f"heavy{i}", result_text="é" * 500_000))
             for i in range(6)]
    paths += [*heavy, write(files / "b.json", run_record(run_id="b"))]
    assert 6 * 1_000_000 > MAX_MESSAGE_SIZE  # the valid ones do not fit in one frame together
    with daemon_process(tmp_path) as daemon:
        done = run_cli(daemon.env, "runs", "ingest", *paths)
        assert done.returncode == cli.runs.EXIT_FAILED, done.stderr  # 1: a record was rejected
        assert "Traceback" not in done.stderr
        assert done.stdout.strip() == "10 record(s): 8 recorded, 0 duplicate, 0 skipped, 2 rejected"
        sizes = [record_size(json.loads(Path(p).read_text())) for p in paths[1:3]]
        *rejected, rate = done.stderr.strip().splitlines()
        assert rejected == [
            f"rejected {p}: {p}: run record is {n} bytes; the limit is {MAX_RECORD_BYTES} bytes (1 MiB)"
            for p, n in zip(paths[1:3], sizes, strict=True)]
        assert re.fullmatch(r"10 record\(s\) in [\d.]+ s: \d+ records/s", rate), rate
        listed = rpc(daemon.state, "ListEpisodes", {"limit": 100})
        runs = {e["run_id"] for e in listed["episodes"]}
        assert runs == {"a", "b", *(f"heavy{i}" for i in range(6))}
        # Every call stayed within the frame: no connection was closed for a message too big.
        assert "MESSAGE_TOO_BIG" not in daemon.log_text() and "1009" not in done.stderr


@pytest.mark.slow
def test_ingest_runs_answers_each_record_and_records_the_good_ones(tmp_path: Path) -> None:
    """The IngestRuns handler itself: a record that is not an object, one over the bound, one missing a
    required field and one with a lone surrogate in its text each get their own answer; the rest are
    recorded, in one call."""
    with daemon_process(tmp_path) as daemon:
        missing = run_record(run_id="missing")
        del missing["ended_at"]
        answer = rpc(daemon.state, "IngestRuns", {"records": [
            {"record": run_record(run_id="one"), "source": "one.json"},
            {"record": "not an object", "source": "text.json"},
            {"record": run_record(run_id="over", result_text="y" * (MAX_RECORD_BYTES + 1)), "source": "over.json"},
            {"record": missing, "source": "missing.json"},
            {"record": run_record(run_id="odd", result_text="half a pair \ud800 of surrogates"), "source": "odd.json"},
            {"record": run_record(run_id="two"), "source": "two.json"},
        ]})["results"]
    outcomes = [r["outcome"] for r in answer]
    assert outcomes == ["recorded", "rejected", "rejected", "rejected", "recorded", "recorded"], answer
    assert answer[1]["error"]["code"] == "INVALID_ARGUMENT" and "records[1].record" in answer[1]["error"]["message"]
    assert "over.json: run record is" in answer[2]["error"]["message"]
    assert "ended_at" in answer[3]["error"]["message"]


# -- a daemon that is down, or drops the connection ----------------------------------------------------

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@asynccontextmanager
async def dropping_daemon(state: Path, *, reset: bool) -> AsyncIterator[None]:
    """A listener that answers the websocket handshake as the daemon does, then drops the connection as
    soon as the first request frame arrives: with a TCP reset (`reset`, what a killed process with unread
    data gives) or a plain close. daemon.json and the token files point the CLI at it."""

    async def handler(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            head += chunk
        found = re.search(rb"(?i)sec-websocket-key:\s*(\S+)", head)
        assert found is not None
        accept = base64.b64encode(hashlib.sha1(found.group(1) + GUID).digest())
        await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        await stream.receive_some(2)  # a request frame is arriving
        if reset:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        point_the_cli_at(state, listeners[0].socket.getsockname()[1])
        yield
        nursery.cancel_scope.cancel()


def point_the_cli_at(state: Path, port: int) -> None:
    """Token files and a daemon.json naming `port`, as a daemon would leave them."""
    state.mkdir(parents=True, exist_ok=True)
    for tier in ("read", "control"):
        (state / f"operator-{tier}.token").write_text(f"{tier}-token-0123456789\n")
    (state / "daemon.json").write_text(json.dumps({"operator": f"ws://127.0.0.1:{port}/harness.v1",
                                                   "gateway": "http://127.0.0.1:1/mcp"}))


def connecting_commands(tmp_path: Path) -> dict[str, tuple[list[str], str | None]]:
    """Every CLI command that talks to the daemon, as argv and stdin."""
    record = write(tmp_path / "r.json", run_record())
    (tmp_path / "proj").mkdir(exist_ok=True)
    hook = json.dumps({"session_id": "s-1", "transcript_path": str(TRANSCRIPT), "cwd": str(tmp_path)})
    ep = "ep_00000000000000000000"
    history = tmp_path / "history"  # `import` reads its sources, then sends what it found
    if not history.exists():
        subprocess.run(["git", "init", "-q", str(history)], check=True)
        subprocess.run(["git", "-C", str(history), "-c", "user.name=dev", "-c", "user.email=dev@example.invalid",
                        "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    sessions = tmp_path / "claude-projects" / "p"
    sessions.mkdir(parents=True, exist_ok=True)
    (sessions / "s-1.jsonl").write_text(TRANSCRIPT.read_text(encoding="utf-8").replace("{CWD}", str(history)),
                                        encoding="utf-8")
    rollouts = tmp_path / "codex-sessions" / "2026" / "11" / "30"
    rollouts.mkdir(parents=True, exist_ok=True)
    (rollouts / "rollout-2026-11-30T10-00-00-c1.jsonl").write_text("\n".join(json.dumps(line) for line in (
        {"timestamp": "2026-11-30T10:00:00.000Z", "type": "session_meta", "payload": {"id": "c-1", "cwd": str(history)}},
        {"timestamp": "2026-11-30T10:01:00.000Z", "type": "event_msg",
         "payload": {"type": "agent_message", "message": "done"}})) + "\n", encoding="utf-8")
    gemini = tmp_path / "gemini-session.jsonl"  # a Gemini CLI session file
    gemini.write_text("\n".join(json.dumps(line) for line in (
        {"sessionId": "g-1", "startTime": "2026-11-30T10:00:00.000Z", "kind": "main"},
        {"id": "m1", "timestamp": "2026-11-30T10:01:00.000Z", "type": "gemini", "content": "done"})) + "\n",
        encoding="utf-8")
    return {
        "memory status": (["memory", "status"], None),
        "memory episodes": (["memory", "episodes"], None),
        "memory episodes <id>": (["memory", "episodes", ep], None),
        "memory recall": (["memory", "recall", "ledger", "--repo", "forge.example/acme/api"], None),
        "memory briefing": (["memory", "briefing", "api-fixer"], None),
        "memory forget": (["memory", "forget", ep, "--yes"], None),
        "memory provider check": (["memory", "provider", "check"], None),
        "memory reindex": (["memory", "reindex"], None),
        "runs ingest": (["runs", "ingest", record], None),
        "runs ingest -": (["runs", "ingest", "-"], json.dumps(run_record(run_id="stdin"))),
        "demo": (["demo"], None),
        "run": (["run", "api-fixer"], None),
        "run --wait": (["run", "api-fixer", "--wait"], None),
        "runs list": (["runs", "list"], None),
        "runs show": (["runs", "show", "r1"], None),
        "runs wait": (["runs", "wait", "r1"], None),
        "runs cancel": (["runs", "cancel", "r1"], None),
        "runs logs": (["runs", "logs", "r1"], None),
        "runs logs --follow": (["runs", "logs", "r1", "--follow"], None),
        "facts add": (["facts", "add", "a fact", "--scope", "fleet", "--confidence", "0.5"], None),
        "pr link": (["pr", "link", "forge.example/acme/api", "main", "https://forge.example/acme/api/pull/1"], None),
        "presence report": (["presence", "report", "api-fixer", "--run", "1", "--session", "s",
                             "--repo", "forge.example/acme/api"], None),
        "vote": (["vote", "f_1", "--run", "1", "--harness", "api-fixer", "--stance", "support"], None),
        "token mint": (["token", "mint", "api-fixer"], None),
        "mcp-config": (["mcp-config", "api-fixer"], None),
        "hook claude-code session-end": (["hook", "claude-code", "session-end", "--harness", "api-fixer"], hook),
        "hook claude-code session-start": (["hook", "claude-code", "session-start", "--harness", "api-fixer",
                                            "--project", str(tmp_path / "proj")], json.dumps({"source": "startup"})),
        "hook codex session-end": (["hook", "codex", "session-end", "--harness", "api-fixer"], json.dumps({
            "session_id": "c-1", "transcript_path": str(rollouts / "rollout-2026-11-30T10-00-00-c1.jsonl"),
            "cwd": str(history)})),
        "hook codex session-start": (["hook", "codex", "session-start", "--harness", "api-fixer", "--project",
                                      str(tmp_path / "proj")], json.dumps({"source": "startup"})),
        "hook gemini-cli session-end": (["hook", "gemini-cli", "session-end", "--harness", "api-fixer"], json.dumps({
            "session_id": "g-1", "transcript_path": str(gemini), "cwd": str(history)})),
        "hook gemini-cli session-start": (["hook", "gemini-cli", "session-start", "--harness", "api-fixer",
                                           "--project", str(tmp_path / "proj")], json.dumps({"source": "startup"})),
        "hook opencode session-end": (["hook", "opencode", "session-end", "--harness", "api-fixer"], json.dumps({
            "session_id": "ses_1", "directory": str(history), "started_at": 1796219270782, "parts": [
                {"type": "text", "text": "done"}]})),
        "hook opencode session-start": (["hook", "opencode", "session-start", "--harness", "api-fixer", "--project",
                                         str(tmp_path / "proj")], json.dumps({"source": "startup"})),
        "hook qwen-code session-end": (["hook", "qwen-code", "session-end", "--harness", "api-fixer"], json.dumps({
            "session_id": "q-1", "transcript_path": str(gemini), "cwd": str(history)})),
        "hook qwen-code session-start": (["hook", "qwen-code", "session-start", "--harness", "api-fixer",
                                          "--project", str(tmp_path / "proj")], json.dumps({"source": "startup"})),
        "hook pi session-end": (["hook", "pi", "session-end", "--harness", "api-fixer"], json.dumps({
            "session_file": str(gemini), "cwd": str(history)})),
        "hook pi tool": (["hook", "pi", "tool", "--harness", "api-fixer", "--project", str(tmp_path / "proj"),
                          "recall"], json.dumps({"query": "ledger"})),
        "install": (["install", "claude-code", "--harness", "api-fixer", "--project", str(tmp_path / "proj")], None),
        "uninstall": (["uninstall", "claude-code", "--harness", "api-fixer", "--project", str(tmp_path / "proj")],
                      None),
        "spool send": (["spool", "send"], None),
        "describe": (["describe", "api-fixer"], None),
        "describe --json": (["describe", "api-fixer", "--json"], None),
        "import git": (["import", "git", "--repo", str(history)], None),
        "import claude-code": (["import", "claude-code", "--dir", str(sessions.parent)], None),
        "import codex": (["import", "codex", "--dir", str(tmp_path / "codex-sessions")], None),
    }


#: Commands whose documented answer to an unreachable daemon is not exit 3 (still one line, no traceback):
#: the session hook spools the session and exits 0 (a failed hook would alarm the user), the session-start
#: hook starts the session at once without a briefing, `uninstall` cleans the files and says the
#: token lapses at its expiry.
DOWN_ANSWERS = {"hook claude-code session-end": (0, "spooled"),
                "hook claude-code session-start": (0, "no briefing at session start"), "uninstall": (0, ""),
                "hook codex session-end": (0, "spooled"), "hook codex session-start": (0, "no briefing at session start"),
                "hook gemini-cli session-end": (0, "spooled"),
                "hook gemini-cli session-start": (0, "no briefing at session start"),
                "hook opencode session-end": (0, "spooled"),
                "hook opencode session-start": (0, "no briefing at session start"),
                # Qwen Code's session end is delivered (here: spooled) by a detached child: the hook says nothing
                "hook qwen-code session-end": (0, ""),
                "hook qwen-code session-start": (0, "no briefing at session start"),
                "hook pi session-end": (0, "spooled"),
                # pi's tool call fails as a tool call does, naming why (no install here: no gateway to ask)
                "hook pi tool": (1, "has no gateway")}

#: Commands that need no daemon (or, the TUI, keep running and retry: see its own test below). `store
#: migrate` works on a stopped daemon's store (tests/store/test_store_migrate.py); `store export|import|backup|restore`
#: read or write the store itself (tests/store/test_store_export.py, tests/store/test_store_backup.py); `service` writes
#: a service manager's file (tests/cli/test_service_cli.py).
OFFLINE = {"serve", "completion", "memory provider schema", "provider serve-builtin", "tui", "store migrate",
           "store export", "store import", "store backup", "store restore", "store check",
           "service install", "service uninstall", "service status"}


def test_the_table_covers_every_command_that_connects(tmp_path: Path) -> None:
    """A new command joins `connecting_commands` (or OFFLINE), so the tests below cover it too."""
    parser = cli.build_parser()

    def leaves(p: Any, prefix: str) -> list[str]:
        subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            return [prefix]
        return [name for a in subs for verb, child in a.choices.items()
                for name in leaves(child, f"{prefix} {verb}".strip())]

    covered = {name.split(" <")[0].split(" -")[0] for name in connecting_commands(tmp_path)}
    missing = set(leaves(parser, "")) - covered - OFFLINE - {"doctor"}
    assert not missing, f"add these commands to connecting_commands(): {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["not running", "reset", "closed"])
async def test_no_command_prints_a_traceback_when_the_daemon_is_down_or_drops_the_connection(
        tmp_path: Path, how: str) -> None:
    config = write_config(tmp_path, HARNESS)
    env = env_for(tmp_path, config)
    state = tmp_path / "state"
    commands = connecting_commands(tmp_path)
    # A session spooled earlier, so `spool send` has something to send (and keeps it: exit 3).
    spool.append(state, {"record": run_record(run_id="spooled"), "source": "spooled", "spooled_at": "x"})

    async def check_all() -> None:
        results: dict[str, subprocess.CompletedProcess[str]] = {}

        async def one(name: str, argv: list[str], stdin: str | None) -> None:
            results[name] = await trio.to_thread.run_sync(lambda: run_cli(env, *argv, stdin=stdin))

        limiter = trio.CapacityLimiter(2)  # a 2-core machine: two CLIs at a time

        async def bounded(name: str, argv: list[str], stdin: str | None) -> None:
            async with limiter:
                await one(name, argv, stdin)

        async with trio.open_nursery() as nursery:
            for name, (argv, stdin) in commands.items():
                nursery.start_soon(bounded, name, argv, stdin)
        for name, done in results.items():
            assert "Traceback" not in done.stderr, f"{name}:\n{done.stderr}"
            status, says = DOWN_ANSWERS.get(name, (cli.EXIT_UNAVAILABLE, "UNAVAILABLE"))
            assert done.returncode == status, f"{name} exited {done.returncode}:\n{done.stderr}"
            assert says in done.stderr, f"{name}:\n{done.stderr}"
        doctor = await trio.to_thread.run_sync(lambda: run_cli(env, "doctor"))
        assert doctor.returncode == 1 and "Traceback" not in doctor.stderr  # a FAIL row "daemon", by design
        assert doctor.stdout.startswith("FAIL  daemon")

    if how == "not running":
        with socket.socket() as sock:  # a port nothing listens on once closed
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        point_the_cli_at(state, port)
        await check_all()
    else:
        async with dropping_daemon(state, reset=how == "reset"):
            await check_all()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux missing: `make test` installs it")
async def test_the_tui_shows_a_dropped_daemon_and_quits_cleanly(tmp_path: Path) -> None:
    """The TUI keeps running when the daemon goes away (it retries every 5 s), shows why in its header,
    and `q` still quits with status 0 and nothing on stderr."""
    from support_console import tmux, wait_for

    config = write_config(tmp_path, HARNESS)
    async with dropping_daemon(tmp_path / "state", reset=True):
        env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", ""), "TERM": "xterm-256color"}
        err, status = tmp_path / "tui.err", tmp_path / "tui.status"
        command = ["sh", "-c", f'"{sys.executable}" -m memactors.cli tui --config "{config}" 2>"{err}"; '
                               f'echo $? >"{status}"']
        async with tmux(tmp_path, command, env) as base:
            shown = await wait_for(base, "memactors · daemon: ")  # the header says why
            assert "api-fixer" in shown
            await trio.run_process([*base, "send-keys", "q"])
            with trio.fail_after(60):
                while not status.exists() or not status.read_text().strip():  # noqa: ASYNC110
                    await trio.sleep(0.1)
    assert status.read_text().strip() == "0"
    assert "Traceback" not in err.read_text()


@pytest.mark.slow
def test_runs_ingest_says_where_it_stopped_when_the_daemon_is_killed(tmp_path: Path) -> None:
    """The kill test that found 199 of 640 runs with a traceback: SIGKILL the daemon while `runs ingest`
    sends 3,000 records. Exit 3, one line for why and one for how far it got; no traceback."""
    files = tmp_path / "records"
    files.mkdir()
    for i in range(3000):
        write(files / f"{i:05}.json", run_record(run_id=f"k{i}"))
    daemon = start_daemon(tmp_path)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "runs", "ingest", str(files)],
                                env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while "runs ingested" not in daemon.log_text():  # the first batch is in: kill it mid-stream
            assert time.monotonic() < deadline and proc.poll() is None, "the first batch never arrived"
            time.sleep(0.02)
        os.kill(daemon.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        daemon.stop()
    assert "Traceback" not in err, err
    assert proc.returncode == cli.EXIT_UNAVAILABLE, err
    assert err.startswith("memactors: UNAVAILABLE: ")
    assert re.search(r"memactors: stopped after \d+ record\(s\): \d+ recorded", err), err
    assert out == ""
