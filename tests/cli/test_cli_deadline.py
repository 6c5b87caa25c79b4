"""No command hangs forever: every CLI connection attempt has one total deadline, handshake
included. Against a listener that accepts and closes, and one that accepts and never answers, `runs
ingest` and `import git` (the trio client) and `memory status` (the standard-library client) end with
exit 3 and one line; a listener that closes is told apart at once ("broke off"), not after 30 s.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fix_agents import git_repo
from support import example, write_config


@contextmanager
def _listener(behaviour: str) -> Iterator[int]:
    """A loopback listener that accepts every connection and then closes it (``close``) or holds it
    without ever answering (``silent``); yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if behaviour == "close":
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()
        for conn in held:
            conn.close()


def _env(tmp_path: Path, port: int) -> dict[str, str]:
    config = write_config(tmp_path)
    text = config.read_text(encoding="utf-8").replace('[operator]\nlisten = "127.0.0.1:0"',
                                                      f'[operator]\nlisten = "127.0.0.1:{port}"')
    config.write_text(text, encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    for tier in ("read", "control"):
        token = state / f"operator-{tier}.token"
        token.write_text(f"{tier}-token-for-a-daemon-that-is-not-there\n", encoding="utf-8")
        os.chmod(token, 0o600)
    return {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}


@pytest.mark.parametrize("behaviour", ["close", "silent"])
@pytest.mark.parametrize("command", ["ingest", "status", "import git"])
def test_a_cli_command_against_a_listener_that_breaks_the_handshake_exits_3_with_one_line(
        tmp_path: Path, behaviour: str, command: str) -> None:
    record = tmp_path / "run.json"
    record.write_text(json.dumps(example("run-42-api-fixer.json")), encoding="utf-8")
    args = {"ingest": ["runs", "ingest", str(record)], "status": ["memory", "status"],
            "import git": ["import", "git", "--repo", str(git_repo(tmp_path / "repo"))]}[command]
    with _listener(behaviour) as port:
        # timeout: a hang guard only (`runs ingest` once never ended here)
        done = subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=_env(tmp_path, port),
                              capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    if behaviour == "close":
        # A peer that hangs up is the answer at once (`runs ingest` and `import git` waited out
        # their 30 s connect deadline for it; the standard-library client never did).
        assert "broke off" in lines[0] and "within 30 s" not in lines[0], lines[0]
