"""A resident Claude Code session, the way a user connects one: the real `claude` CLI against the loopback
fake Anthropic API, with the `.mcp.json` that `memactors mcp-config` printed and the SessionEnd hook in
its settings; the daemon as a process (REQ-15)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
import trio

from fix_agents import claude_bin, claude_env, claude_p
from fix_daemon import daemon_process
from memactors.testing.fake_anthropic import Script, Text, ToolUse, run_fake_anthropic
from support_runs import PYTEST, REPO_KEY, make_repo

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "claude-code"\n'


async def test_a_resident_claude_session_uses_its_mcp_json_and_is_recorded_by_its_session_end_hook(
        tmp_path: Path) -> None:
    claude = claude_bin()
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = Script(turns=(
        ToolUse("mcp__memactors__recall", {"query": "ledger rounding"}),
        ToolUse("Write", {"file_path": str(repo / "NOTES.md"), "content": "rounding is binary floating point\n"}),
        ToolUse("Bash", {"command": f"{PYTEST} test_ledger.py", "description": "run the ledger test"}),
        Text("Left NOTES.md; test_rounding still fails."),
    ))
    home = tmp_path / "home"
    home.mkdir()
    async with run_fake_anthropic(script) as fake:
        with daemon_process(tmp_path, HARNESS) as daemon:
            fact = await daemon.acli("facts", "add", "ledger amounts round with Decimal", "--scope", f"project:{REPO_KEY}",
                              "--confidence", "0.9")
            assert fact.returncode == 0, fact.stderr
            # 1. the user pastes what mcp-config printed, and adds the hook to the project's settings
            printed = await daemon.acli("mcp-config", "coder", "--run", "resident-1", "--workdir", str(repo))
            assert printed.returncode == 0, printed.stderr
            (repo / ".mcp.json").write_text(printed.stdout, encoding="utf-8")
            hook_log = tmp_path / "hook.log"
            hook = (f"{sys.executable} -m memactors.cli hook claude-code session-end --harness coder"
                    f" > {hook_log} 2>&1")
            # SessionEnd hooks share a 1.5 s budget unless one declares a timeout (raised up to 60 s)
            (repo / ".claude").mkdir()
            (repo / ".claude" / "settings.json").write_text(json.dumps(
                {"hooks": {"SessionEnd": [{"hooks": [{"type": "command", "command": hook, "timeout": 30}]}]}}),
                encoding="utf-8")
            # 2. the user runs claude in the repository (headless here, so it can run in a test)
            env = {**daemon.env, "HOME": str(home), "ANTHROPIC_BASE_URL": fake.base_url,
                   "ANTHROPIC_API_KEY": "sk-ant-fake", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}
            done = await trio.run_process(
                [str(claude), "-p", "Fix the ledger rounding test.", "--output-format", "stream-json", "--verbose",
                 "--mcp-config", str(repo / ".mcp.json"),
                 "--allowedTools", "mcp__memactors__recall", "Write", "Bash", "--permission-mode", "acceptEdits"],
                cwd=repo, env=env, stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
            out = done.stdout.decode(errors="replace")
            assert done.returncode == 0, (out[-3000:], done.stderr.decode(errors="replace")[-3000:])
            [init] = [json.loads(line) for line in out.splitlines()
                      if line.startswith('{"type":"system","subtype":"init"')]
            session_id = init["session_id"]
            listed = await daemon.acli("memory", "episodes", "--harness", "coder", "--json")
            assert listed.returncode == 0, listed.stderr
            [row] = json.loads(listed.stdout)["episodes"]
            assert row["run_id"] == session_id, hook_log.read_text(encoding="utf-8")
            shown = await daemon.acli("memory", "episodes", row["episode_id"], "--json")
            episode = json.loads(shown.stdout)["episode"]
    # the call log is written in batches: read it once the daemon has stopped (a clean stop writes it all)
    db = sqlite3.connect(daemon.state / "memactors.db")
    try:
        calls = db.execute("SELECT caller, tool FROM call_log WHERE server = 'gateway'").fetchall()
        provider_calls = db.execute("SELECT DISTINCT caller FROM call_log WHERE tool = 'memory_recall'").fetchall()
        exposed = db.execute("SELECT run_id, harness, surface FROM exposures").fetchall()
    finally:
        db.close()
    # the session's recall went through the gateway as the resident run its token was minted for
    assert calls == [("coder/resident-1", "recall")]
    assert provider_calls == [("daemon",)]  # REQ-18: the provider call serving it is the daemon's own row
    assert exposed == [("resident-1", "coder", "recall")]
    [recalled] = fake.agent_requests()[1].tool_results()
    assert "ledger amounts round with Decimal" in json.dumps(recalled)
    # REQ-15: nothing was typed into the resident: its first message is the user's prompt (after Claude
    # Code's own context), with no briefing fence and none of the facts the briefing would carry
    first = fake.agent_requests()[0].first_user_text()
    assert first.rstrip().endswith("Fix the ledger rounding test.")
    assert "<memory-data" not in first and "Decimal" not in first
    # and the SessionEnd hook recorded what the session really did
    assert episode["adapter"] == "claude-code" and episode["repo"] == REPO_KEY and episode["branch"] == "main"
    assert episode["files_touched"] == ["NOTES.md"]
    assert episode["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
    assert episode["outcome"] == "failed" and "still fails" in episode["result_excerpt"]


@pytest.mark.req15
async def test_a_claude_code_installed_in_the_project_recalls_headless_and_its_sessions_are_recorded_even_with_the_daemon_down(  # noqa: E501
        tmp_path: Path) -> None:
    claude = claude_bin()
    repo = make_repo(tmp_path / "api", failing_test=True)
    home = tmp_path / "home"
    home.mkdir()
    script = Script(turns=(ToolUse("mcp__memactors__recall", {"query": "ledger rounding"}),
                           Text("Amounts round with Decimal here; nothing else to do.")))
    async with run_fake_anthropic(script) as fake:
        with daemon_process(tmp_path, HARNESS) as daemon:
            fact = await daemon.acli("facts", "add", "ledger amounts round with Decimal", "--scope",
                                     f"project:{REPO_KEY}", "--confidence", "0.9")
            assert fact.returncode == 0, fact.stderr
            installed = await trio.run_process(
                [sys.executable, "-m", "memactors.cli", "install", "claude-code", "--harness", "coder", "--project",
                 str(repo)], env={**daemon.env, "HOME": str(home)}, capture_stdout=True, capture_stderr=True,
                check=False)
            assert installed.returncode == 0, installed.stderr.decode()
            events = await claude_p(claude, "What do we know about ledger rounding?", cwd=repo,
                                    env=claude_env(home, daemon.env, fake.base_url))
            [init] = [e for e in events if e.get("type") == "system" and e.get("subtype") == "init"]
            listed = await daemon.acli("memory", "episodes", "--harness", "coder", "--json")
            [row] = json.loads(listed.stdout)["episodes"]
    # the project's .mcp.json gave the session the gateway, and settings.local.json let it call recall
    assert {"name": "memactors", "status": "connected", "source": "project"} in [
        {k: s.get(k) for k in ("name", "status", "source")} for s in init["mcp_servers"]]
    [recalled] = fake.agent_requests()[1].tool_results()
    assert "ledger amounts round with Decimal" in json.dumps(recalled)
    assert "requested permissions" not in json.dumps(recalled)
    # REQ-15: the session's first message is the user's prompt alone
    first = fake.agent_requests()[0].first_user_text()
    assert first.rstrip().endswith("What do we know about ledger rounding?") and "<memory-data" not in first
    # the SessionEnd hook install wrote recorded the session
    assert row["run_id"] == init["session_id"]

    # the daemon is down when the next session ends: the hook spools it, and the restarted daemon sends it
    async with run_fake_anthropic(Script(turns=(Text("Offline: nothing recalled."),))) as offline:
        events = await claude_p(claude, "Say hello.", cwd=repo, env=claude_env(home, daemon.env, offline.base_url))
    [init2] = [e for e in events if e.get("type") == "system" and e.get("subtype") == "init"]
    spooled = daemon.state / "session-spool.jsonl"
    assert json.loads(spooled.read_text(encoding="utf-8"))["record"]["run_id"] == init2["session_id"]
    with daemon_process(tmp_path, HARNESS) as restarted:
        with trio.fail_after(60):
            while True:
                listed = await restarted.acli("memory", "episodes", "--harness", "coder", "--json")
                runs = {e["run_id"] for e in json.loads(listed.stdout)["episodes"]}
                if init2["session_id"] in runs:
                    break
                await trio.sleep(0.1)
    assert runs == {init["session_id"], init2["session_id"]} and not spooled.exists()


@pytest.mark.req15
async def test_an_installed_claude_code_session_gets_no_briefing_pushed_and_pulls_it_with_the_briefing_tool(
        tmp_path: Path) -> None:
    """Scenario 15.1 with the real `claude -p`: after `install claude-code --project` (no --briefing-at-start)
    the session's first model request carries no briefing and no fact of it, only the gateway's instructions
    to read it; the agent then pulls it with the `briefing` tool and gets the repository's fact."""
    from memactors.gateway import INSTRUCTIONS

    claude = claude_bin()
    repo = make_repo(tmp_path / "api")
    home = tmp_path / "home"
    home.mkdir()
    fact = "ledger amounts round with Decimal, never float"
    script = Script(turns=(ToolUse("mcp__memactors__briefing", {}), Text("Read the briefing.")))
    async with run_fake_anthropic(script) as fake:
        with daemon_process(tmp_path, HARNESS) as daemon:
            added = await daemon.acli("facts", "add", fact, "--scope", f"project:{REPO_KEY}", "--confidence", "0.9")
            assert added.returncode == 0, added.stderr
            installed = await trio.run_process(
                [sys.executable, "-m", "memactors.cli", "install", "claude-code", "--harness", "coder", "--project",
                 str(repo), "--json"], env={**daemon.env, "HOME": str(home)}, capture_stdout=True,
                capture_stderr=True, check=False)
            assert installed.returncode == 0, installed.stderr.decode()
            assert json.loads(installed.stdout)["briefing_at_start"] is False
            settings = json.loads((repo / ".claude" / "settings.local.json").read_text(encoding="utf-8"))
            assert set(settings["hooks"]) == {"SessionEnd"}  # recording stays; nothing pushes the briefing
            await claude_p(claude, "Fix the ledger rounding.", cwd=repo, env=claude_env(home, daemon.env,
                                                                                      fake.base_url))
    db = sqlite3.connect(daemon.state / "memactors.db")
    try:
        calls = db.execute("SELECT tool FROM call_log WHERE server = 'gateway'").fetchall()
    finally:
        db.close()
    first = fake.agent_requests()[0].body
    # nothing was prepended: no fence, no fact, no hook context in the first request...
    assert fact not in json.dumps(first) and "harness-memory\\\" field" not in json.dumps(first)
    assert "SessionStart hook additional context" not in json.dumps(first)
    # ...but the server's instructions, telling the agent to read its briefing, are in its context
    assert json.dumps(INSTRUCTIONS)[1:-1] in json.dumps(first)
    # the agent asked, and the briefing came back as the tool's answer, fenced, with the fact
    [pulled] = fake.agent_requests()[1].tool_results()
    assert fact in json.dumps(pulled) and "<memory-data" in json.dumps(pulled)
    assert calls == [("briefing",)]
