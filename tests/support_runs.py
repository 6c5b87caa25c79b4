"""Helpers for run tests: a real git repository, the stand-in agents, the daemon as a process and the CLI
as a subprocess."""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

AGENT = Path(__file__).resolve().parent / "data" / "agent_script.py"
REPO_KEY = "forge.example/acme/api"
#: The test command a scripted agent runs in its shell. Never a bare `python`/`python3`: Codex runs
#: commands through `bash -lc`, whose login profile picks the interpreter (Debian has no `python` at all:
#: exit 127), and a `python3` without pytest also exits 1 — the right status for the wrong reason. This
#: interpreter has pytest, so a failing test is the failure the agent sees.
PYTEST = f"{shlex.quote(sys.executable)} -m pytest -q"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


def make_repo(path: Path, *, failing_test: bool = False) -> Path:
    """A git repository with one commit, remote origin git@forge.example:acme/api.git, branch main."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "dev@example.invalid")
    git(path, "config", "user.name", "dev")
    git(path, "remote", "add", "origin", "git@forge.example:acme/api.git")
    (path / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n", encoding="utf-8")
    (path / "README.md").write_text("api\n", encoding="utf-8")
    if failing_test:
        (path / "test_ledger.py").write_text(
            "def test_rounding():\n    assert round(2.675, 2) == 2.68\n", encoding="utf-8")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "start")
    return path


def command_harness(name: str, *, workdir: Path, mode: str, out: Path, extra: str = "") -> str:
    """A [harness.<name>] table running the stand-in agent with the command adapter."""
    command = f"{sys.executable} {AGENT} {mode} {out} {{prompt}}"
    return (f'\n[harness.{name}]\nharness = "command"\nworkdir = "{workdir}"\n'
            f"command = '{command}'\nprompt = \"fix the ledger\"\n{extra}\n")


async def wait_for_file(path: Path) -> str:
    """Wait (bounded) for a file another process writes atomically; returns its text."""
    with trio.fail_after(30):
        while not await trio.Path(path).exists():  # noqa: ASYNC110 -- another process's state
            await trio.sleep(0.02)
    return await trio.Path(path).read_text(encoding="utf-8")


FAKE_CLAUDE = Path(__file__).resolve().parent / "data" / "fake_claude.py"


def fake_claude(directory: Path, mode: str, out: Path) -> Path:
    """An executable stand-in for ``claude`` (tests/data/fake_claude.py in MODE, writing to OUT): the
    path to put in a claude-code harness's ``command``. It records the argv it was started with."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / f"claude-{mode}"
    wrapper.write_text(f'#!/bin/sh\nFAKE_CLAUDE_ARGV0="$0" exec {sys.executable} {FAKE_CLAUDE} {mode} {out} "$@"\n',
                       encoding="utf-8")
    wrapper.chmod(0o755)
    return wrapper


ROOT = Path(__file__).resolve().parent.parent
CLAUDE = ROOT / ".cache" / "agents" / "node_modules" / ".bin" / "claude"


def claude_binary() -> Path:
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} is missing: run `make agents` (make test does) to install the pinned Claude Code")
    return CLAUDE


async def cli(env: dict[str, str], *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """The CLI as a subprocess, awaited in trio so loopback fakes in this test keep serving."""
    return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=env, stdin=stdin,
                                  capture_stdout=True, capture_stderr=True, check=False)


def base_env(tmp_path: Path, config: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(home), "MEMACTORS_LOG_LEVEL": "DEBUG"}


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def claude_env(tmp_path: Path, config: Path, base_url: str) -> dict[str, str]:
    env = base_env(tmp_path, config)
    env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="sk-fake-for-tests", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1")
    return env


#: The repository key of `make_history`'s repository.
KEY = "forge.example/acme/api"
#: A deploy token one of HISTORY's commit messages leaks: an import must redact it.
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


#: (message, {path: content}, author date): a ledger's history as its developers wrote it.
HISTORY = [
    ("Add the ledger with float amounts", {"ledger.py": "def total(xs):\n    return sum(xs)\n"},
     "2026-03-02T09:00:00+01:00"),
    ("Round ledger totals with Decimal quantize\n\nFloat rounding lost a cent on 2.675; quantize with "
     "ROUND_HALF_UP instead.\n\nCo-authored-by: Pat Example <pat@example.invalid>",
     {"ledger.py": "from decimal import Decimal\n", "test_ledger.py": "def test_rounding(): pass\n"},
     "2026-03-05T14:30:00-05:00"),
    (f"Pin the webhook retry clock (deploy token was {TOKEN})", {"webhooks/retry.py": "CLOCK = 1\n"},
     "2026-04-01T08:00:00Z"),
    ("Stream invoice exports to the CSV writer", {"exports/invoices.py": "def export(): ...\n",
                                                   "docs/exports.md": "# exports\n"},
     "2026-05-20T16:45:00Z"),
]


def make_history(path: Path) -> Path:
    """A git repository (remote origin in forge.example/acme/api, branch main) with HISTORY's commits."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "dev@example.invalid")
    git(path, "config", "user.name", "dev")
    git(path, "remote", "add", "origin", "git@forge.example:acme/api.git")
    for message, files, when in HISTORY:
        for name, content in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(content, encoding="utf-8")
        git(path, "add", "-A")
        env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", message], check=True, env=env)
    # a merge commit: not a commit of its own work, never imported
    git(path, "checkout", "-q", "-b", "side")
    (path / "side.txt").write_text("side\n", encoding="utf-8")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "Side work on the notifier")
    git(path, "checkout", "-q", "main")
    git(path, "merge", "-q", "--no-ff", "-m", "Merge branch side", "side")
    return path
