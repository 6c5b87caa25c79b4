"""A resident Codex, configured the way a user connects one: `memactors install codex --project` (or the
snippet `memactors mcp-config --format codex` prints), then the real `codex exec` in the repository against
the loopback Responses fake. The agent calls `recall` as a tool — with the pinned Codex and a newer one —
and gets its repository's memory back through the gateway, as the run the installed token names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from fix_agents import (
    CODEX_VERSIONS,
    codex_bin,
    codex_env,
    fake_provider_args,
    gateway_calls,
    run_codex,
    seed,
)
from fix_daemon import daemon_process
from memactors.cli.install import run_id_for
from memactors.testing.fake_openai import McpToolCall, Message, ToolSearch, Turn, run_fake_openai
from support_runs import make_repo

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "codex"\n'
SCRIPT = [
    Turn([ToolSearch("memactors recall memory")]),
    Turn([McpToolCall("memactors", "recall", {"query": "ledger rounding"})]),
    Turn([Message("The ledger was fixed with Decimal quantize before.")]),
]




@pytest.mark.req12
@pytest.mark.parametrize("which", CODEX_VERSIONS)
async def test_a_codex_installed_in_the_project_calls_recall_as_a_tool(tmp_path: Path, which: str) -> None:
    codex = codex_bin(which)
    repo = make_repo(tmp_path / "api")
    async with run_fake_openai(SCRIPT) as fake:
        env = codex_env(tmp_path / "codex-home")
        with daemon_process(tmp_path, HARNESS, env=env) as daemon:
            seeded = await seed(daemon, tmp_path)
            installed = await trio.run_process(
                [sys.executable, "-m", "memactors.cli", "install", "codex", "--harness", "coder", "--project",
                 str(repo)], env={**daemon.env, "CODEX_HOME": env["CODEX_HOME"]}, capture_stdout=True,
                capture_stderr=True, check=False)
            assert installed.returncode == 0, installed.stderr.decode()
            # Codex reads a project's .codex/config.toml only once the project is trusted: install says how
            assert "codex exec --trust" in installed.stderr.decode()
            done = await run_codex([str(codex), "exec", "--json", "--trust", *fake_provider_args(fake.base_url),
                                    "--", "What do we know about the ledger rounding?"], cwd=repo, env=env)
            out = done.stdout.decode(errors="replace")
            assert done.returncode == 0, (out[-2000:], done.stderr.decode(errors="replace")[-2000:])
    calls = gateway_calls(daemon.state)  # the call log is written in batches: read it once the daemon has stopped
    [recalled] = fake.tool_outputs(2)
    assert "requires approval" not in recalled and '<memory-data kind="recall"' in recalled
    assert seeded in recalled and "Decimal quantize" in recalled
    assert calls == [(f"coder/{run_id_for('codex', repo.resolve())}", "recall", "ok")]
    [item] = [json.loads(line)["item"] for line in out.splitlines() if '"mcp_tool_call"' in line
              and '"item.completed"' in line]
    assert (item["server"], item["tool"], item["status"]) == ("memactors", "recall", "completed")


async def test_the_codex_snippet_mcp_config_prints_works_as_given(tmp_path: Path) -> None:
    codex = codex_bin()
    repo = make_repo(tmp_path / "api")
    async with run_fake_openai(SCRIPT) as fake:
        env = codex_env(tmp_path / "codex-home")
        with daemon_process(tmp_path, HARNESS, env=env) as daemon:
            seeded = await seed(daemon, tmp_path)
            printed = await daemon.acli("mcp-config", "coder", "--format", "codex", "--workdir", str(repo))
            assert printed.returncode == 0, printed.stderr
            (tmp_path / "codex-home" / "config.toml").write_text(printed.stdout, encoding="utf-8")
            done = await run_codex([str(codex), "exec", "--json", "--skip-git-repo-check",
                                    *fake_provider_args(fake.base_url), "--", "recall the ledger"], cwd=repo, env=env)
            assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    calls = gateway_calls(daemon.state)
    [recalled] = fake.tool_outputs(2)
    assert seeded in recalled and "requires approval" not in recalled
    [(caller, tool, outcome)] = calls
    assert caller.startswith("coder/resident-") and (tool, outcome) == ("recall", "ok")
