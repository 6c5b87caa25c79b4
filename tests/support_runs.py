"""Helpers for run tests: a real git repository fixture and the stand-in agent script."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

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
