"""Agents for tests: the real Codex CLI where make installs it, the daemon as a process, a git repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from support import write_config

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


# -- the daemon as a process, and the CLI as a subprocess ----------------------------------------------

@attrs.frozen
class Completed:
    """A finished CLI call: exit status and decoded output."""

    returncode: int
    stdout: str
    stderr: str


@attrs.frozen
class Daemon:
    """A running ``memactors serve``: its environment (HARNESS_CONFIG set), URLs, and its log file."""

    env: dict[str, str]
    gateway: str
    operator: str
    log: Path
    state: Path

    @staticmethod
    def cli_argv() -> list[str]:
        return [sys.executable, "-m", "memactors.cli"]

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``memactors <args>`` against this daemon as a user would (from a synchronous test)."""
        return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=self.env, input=stdin,
                              capture_output=True, text=True, timeout=120, check=False)

    async def acli(self, *args: str) -> Completed:
        """The same from an async test, without blocking its loop (a fake API may be serving in it)."""
        done = await trio.run_process([*self.cli_argv(), *args], env=self.env, stdin=b"", capture_stdout=True,
                                      capture_stderr=True, check=False)
        return Completed(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


@contextmanager
def daemon_process(tmp_path: Path, extra_config: str = "", env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """Start ``memactors serve`` on port-0 listeners; ready once it has announced its addresses.

    Its log goes to a file (a pipe nobody drains would stall it); it is stopped with SIGINT and must
    exit 0 without a traceback.
    """
    config = write_config(tmp_path, extra_config)
    env = {**(os.environ if env is None else env), "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    log = tmp_path / "daemon.log"
    with log.open("w", encoding="utf-8") as err:
        proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        assert proc.stdout is not None
        urls: dict[str, str] = {}
        for line in proc.stdout:  # blocks until the daemon prints its next line: no polling
            name, _, url = line.strip().rpartition(" ")
            if name.startswith(("operator", "gateway")):
                urls[name.split()[0]] = url
            if line.startswith("Ctrl-C stops it."):
                break
        else:
            raise AssertionError(f"the daemon exited before it was ready: {log.read_text(encoding='utf-8')[-3000:]}")
        yield Daemon(env=env, gateway=urls["gateway"], operator=urls["operator"], log=log, state=tmp_path / "state")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text(encoding="utf-8")[-3000:]
    assert "Traceback" not in log.read_text(encoding="utf-8")


def git_repo(path: Path, remote: str = "git@forge.example:acme/ledger.git", branch: str = "fix/flaky") -> Path:
    """A git repository with an origin remote on ``branch`` (no commit needed for its repository key)."""
    path.mkdir(parents=True, exist_ok=True)
    for argv in (["git", "init", "-q", "-b", branch], ["git", "remote", "add", "origin", remote]):
        subprocess.run(argv, cwd=path, check=True, capture_output=True)
    return path
