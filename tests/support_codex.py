"""The real Codex CLI for tests: where make installs it, and a run against the loopback fake API."""

from __future__ import annotations

import os
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
CODEX_BIN = REPO / ".cache" / "agents" / "node_modules" / ".bin" / "codex"
#: A model the pinned Codex knows (so it offers its freeform apply_patch tool); served by the fake.
FAKE_MODEL = "gpt-5.5"


def codex_bin() -> Path:
    """The pinned Codex binary; a missing one fails the test loudly, never skips it."""
    if not os.access(CODEX_BIN, os.X_OK):
        raise AssertionError(
            f"the Codex CLI is not installed at {CODEX_BIN}: run `make agents` (npm install of @openai/codex)")
    return CODEX_BIN


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
