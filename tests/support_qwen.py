"""Qwen Code for the tests: the pinned binary, the user's own settings pointing it at the loopback Chat
Completions fake, and an interactive session driven through a pseudo-terminal (Qwen Code 0.24 runs its
SessionEnd hook only when an interactive session ends, as a user typing /quit ends it)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import time
from pathlib import Path

from support_agents import BIN

QWEN_BIN = BIN / "qwen"
QWEN_VERSION = "0.24.4"
QWEN_MODEL = "fake-chat"


def qwen_user(home: Path, base_url: str) -> dict[str, str]:
    """``~/.qwen/settings.json`` choosing the OpenAI-compatible auth, and the variables pointing the CLI at
    the fake (what a user of a self-hosted OpenAI-compatible model sets)."""
    (home / ".qwen").mkdir(parents=True, exist_ok=True)
    settings = home / ".qwen" / "settings.json"
    if not settings.exists():
        settings.write_text(json.dumps({"security": {"auth": {"selectedType": "openai"}}}, indent=2) + "\n",
                            encoding="utf-8")
    return {"HOME": str(home), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-fake", "OPENAI_MODEL": QWEN_MODEL,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1", "TERM": "xterm-256color"}


def interactive(argv: list[str], *, cwd: Path, env: dict[str, str], done_when: bytes,
                limit: float = 240.0) -> tuple[int, bytes]:
    """Run ``argv`` on a pseudo-terminal; once its screen shows ``done_when``, type ``/quit`` and wait for it to
    exit. Returns (exit status, everything it printed). A hang guard, never a timing assertion: past
    ``limit`` seconds the process is killed and the status is -9."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: become the agent
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    out, quit_sent, status = b"", False, None
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                out += data
            if not quit_sent and done_when in out:
                time.sleep(0.5)  # ok: let the prompt line redraw before typing, as a user would
                os.write(fd, b"/quit\r")
                quit_sent = True
            finished, code = os.waitpid(pid, os.WNOHANG)
            if finished:
                status = os.waitstatus_to_exitcode(code)
                break
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = -9
    finally:
        os.close(fd)
    return status if status is not None else -9, out
