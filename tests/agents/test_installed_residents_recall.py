"""`memactors install gemini-cli|opencode` for residents, then the real CLI headless in the place
it was installed for: the agent calls `recall` through the gateway as the installed token's run and gets its
memory document back; `uninstall` removes the entry and leaves the user's own settings as they were."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from fix_agents import (
    OPENCODE_BIN,
    OPENCODE_MODEL,
    agent_bin,
    gateway_calls,
    opencode_user,
    seed,
)
from fix_daemon import daemon_process
from memactors.cli.install import run_id_for
from memactors.testing.fake_openai import FunctionCall, Message, run_fake_openai
from memactors.testing.fake_openai import Turn as OpenAITurn
from support_runs import make_repo

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "gemini-cli"\n'




async def run_agent(argv: list[str], *, cwd: Path, env: dict[str, str]) -> trio.CompletedProcess[bytes]:
    return await trio.run_process(argv, cwd=cwd, env={**env, "PWD": str(cwd)}, stdin=b"", capture_stdout=True,
                                  capture_stderr=True, check=False)


async def test_opencode_installed_for_the_user_recalls_headless_and_uninstall_removes_it(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    script = [OpenAITurn([FunctionCall("memactors_recall", {"query": "ledger rounding"})]),
              OpenAITurn([Message("The ledger was fixed with Decimal quantize before.")])]
    async with run_fake_openai(script) as fake:
        env = {**os.environ, **opencode_user(tmp_path, fake.base_url)}
        config = tmp_path / ".config" / "opencode" / "opencode.json"
        own = json.loads(config.read_text(encoding="utf-8"))
        harness = f'[harness.coder]\nharness = "opencode"\nworkdir = "{repo}"\n'
        with daemon_process(tmp_path, harness, env=env) as daemon:
            seeded = await seed(daemon, tmp_path)
            done = daemon.cli("install", "opencode", "--briefing-at-start", "--harness", "coder", "--user", "--json")
            assert done.returncode == 0, done.stderr
            installed = json.loads(config.read_text(encoding="utf-8"))
            assert installed["provider"] == own["provider"]
            ours = installed["mcp"]["memactors"]
            assert (ours["type"], ours["url"], ours["oauth"]) == ("remote", daemon.gateway, False)
            agent = await run_agent([str(agent_bin(OPENCODE_BIN)), "run", "--format", "json", "--title", "resident",
                                     "--model", OPENCODE_MODEL, "What do we know?"], cwd=repo, env=daemon.env)
            assert agent.returncode == 0, agent.stderr.decode(errors="replace")[-3000:]
            gone = daemon.cli("uninstall", "opencode", "--harness", "coder", "--user")
            assert gone.returncode == 0, gone.stderr
    calls = gateway_calls(daemon.state)
    [recalled] = fake.tool_outputs(1)
    assert seeded in recalled and "Decimal quantize" in recalled, agent.stdout.decode(errors="replace")[-2000:]
    run = f"coder/{run_id_for('opencode', None)}"
    assert calls == [(run, "briefing", "ok"), (run, "recall", "ok")]  # the plugin briefs the session first
    assert json.loads(config.read_text(encoding="utf-8")) == own
