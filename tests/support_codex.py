"""Agents for tests: the real Codex CLI where make installs it, a git repository. (The daemon as a process:
fix_daemon.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
CODEX_BIN = REPO / ".cache" / "agents" / "node_modules" / ".bin" / "codex"
#: The newer Codex `make agents` installs beside the pinned one (Makefile CODEX_NEXT_VERSION).
CODEX_NEXT_BIN = REPO / ".cache" / "agents" / "codex-next" / "node_modules" / ".bin" / "codex"
#: Which Codex a parametrized test runs: the pinned one and the newer one.
CODEX_VERSIONS = ("pinned", "next")
#: A model the pinned Codex knows (so it offers its freeform apply_patch tool); served by the fake.
FAKE_MODEL = "gpt-5.5"


def codex_bin(which: str = "pinned") -> Path:
    """The pinned (or the newer, ``next``) Codex binary; a missing one fails the test loudly, never skips it."""
    path = CODEX_BIN if which == "pinned" else CODEX_NEXT_BIN
    if not os.access(path, os.X_OK):
        raise AssertionError(
            f"the Codex CLI is not installed at {path}: run `make agents` (npm install of @openai/codex)")
    return path


def codex_version(path: Path) -> tuple[int, ...]:
    """``codex --version`` as numbers (``codex-cli 0.171.0`` → (0, 171, 0))."""
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    return tuple(int(part) for part in out.split()[-1].split("."))


def fake_provider_args(base_url: str) -> list[str]:
    """``-c`` overrides that point Codex at the fake Responses API, as a new user would write them."""
    provider = f'{{name="fake",base_url="{base_url}",wire_api="responses",env_key="FAKE_KEY"}}'
    return ["-c", "model_provider=fake", "-c", f"model_providers.fake={provider}", "-c", f"model={FAKE_MODEL}"]


def codex_env(codex_home: Path) -> dict[str, str]:
    """The environment for a Codex run: its own CODEX_HOME (an existing directory) and the fake's key."""
    codex_home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "CODEX_HOME": str(codex_home), "FAKE_KEY": "sk-fake-key"}


async def run_codex(argv: list[str], *, cwd: Path, env: dict[str, str]) -> trio.CompletedProcess[bytes]:
    """Run a Codex command to completion with stdin closed (exec appends piped stdin to the prompt)."""
    return await trio.run_process(argv, cwd=cwd, env=env, stdin=b"", capture_stdout=True, capture_stderr=True,
                                  check=False)


def git_repo(path: Path, remote: str = "git@forge.example:acme/ledger.git", branch: str = "fix/flaky") -> Path:
    """A git repository with an origin remote on ``branch`` (no commit needed for its repository key)."""
    path.mkdir(parents=True, exist_ok=True)
    for argv in (["git", "init", "-q", "-b", branch], ["git", "remote", "add", "origin", remote]):
        subprocess.run(argv, cwd=path, check=True, capture_output=True)
    return path
