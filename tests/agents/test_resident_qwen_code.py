"""A resident Qwen Code after `memactors install qwen-code --project`: the real CLI (pinned, from npm) in an
interactive session on a pseudo-terminal, in the project it was installed for, against a loopback fake of
the OpenAI-compatible Chat Completions API. Nothing is prepended to its session (REQ-15), the gateway's
instructions reach the model, it calls `recall` as an MCP tool and gets its memory back, and when the user
quits, its SessionEnd hook makes the session an episode with its edit, its failed test and its real
duration. `uninstall` leaves `cmp`-identical files. The daemon as a process, memactors' CLI as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio

from fix_agents import (
    FACT,
    QWEN_BIN,
    QWEN_VERSION,
    add_fact,
    agent_bin,
    assert_the_failed_test_episode,
    gateway_calls,
    interactive,
    qwen_user,
    version,
)
from fix_daemon import daemon_process
from memactors.cli.install import run_id_for
from memactors.gateway import INSTRUCTIONS
from memactors.testing.fake_chat import Call, Reply, Step, run_fake_chat
from support_runs import PYTEST, make_repo

pytestmark = pytest.mark.slow

#: The user's own project settings, in a layout json.dumps would not write (CRLF, inline objects), at Qwen
#: Code's settings version (an older file it migrates, rewriting it itself): uninstall gives these bytes back.
OWN_SETTINGS = '{\r\n    "model": {"name": "fake-chat"},\r\n    "hooks": {"Stop": [{"hooks": [{"type": "command", ' \
               '"command": "true"}]}]},\r\n    "$version": 4\r\n}'


@pytest.mark.req15
async def test_an_installed_qwen_code_session_recalls_and_is_recorded_when_the_user_quits(tmp_path: Path) -> None:
    qwen = agent_bin(QWEN_BIN)
    assert version(qwen) == QWEN_VERSION
    repo = make_repo(tmp_path / "api", failing_test=True)
    settings = repo / ".qwen" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(OWN_SETTINGS, encoding="utf-8")
    before = tmp_path / "before"
    shutil.copytree(repo, before)
    script = [Step([Call("mcp__memactors__recall|memactors__recall|recall", {"query": "ledger rounding"})]),
              Step([Call("write_file", {"file_path": str(repo / "NOTES.md"), "content": "round with Decimal\n"})]),
              Step([Call("run_shell_command", {"command": f"{PYTEST} test_ledger.py", "description": "the test"})]),
              Step([Reply("Left NOTES.md; test_rounding still fails.")])]
    async with run_fake_chat(script) as fake:
        env = {**os.environ, **qwen_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, f'[harness.coder]\nharness = "qwen-code"\nworkdir = "{repo}"\n',
                            env=env) as daemon:
            await add_fact(daemon)
            done = daemon.cli("install", "qwen-code", "--harness", "coder", "--project", str(repo))
            assert done.returncode == 0, done.stderr
            installed = json.loads(settings.read_text(encoding="utf-8"))
            assert installed["model"] == {"name": "fake-chat"}  # the user's own keys kept
            assert set(installed["hooks"]) == {"Stop", "SessionEnd"}  # recording; no briefing pushed
            # MCP discovery finishes before the first prompt goes out: without it, Qwen Code's first request
            # (the -i prompt here, a quick typist's there) can carry neither the tools nor the instructions
            assert installed["env"] == {"QWEN_CODE_LEGACY_MCP_BLOCKING": "1"}
            assert "hook qwen-code session-end" in installed["hooks"]["SessionEnd"][-1]["hooks"][0]["command"]
            status, screen = await trio.to_thread.run_sync(lambda: interactive(
                [str(qwen), "--yolo", "-i", "Fix the ledger rounding test."], cwd=repo, env={**daemon.env, **env},
                done_when=b"still fails"))
            assert status == 0, screen[-3000:].decode(errors="replace")
            # the hook delivers from a detached child (Qwen Code gives it 2 s at exit): wait for the episode
            with trio.fail_after(120):  # a hang guard, not a timing assertion
                while True:
                    listed = json.loads(daemon.cli("memory", "episodes", "--harness", "coder",
                                                  "--json").stdout)
                    if listed["episodes"]:
                        break
                    await trio.sleep(0.2)  # another process's state
            [row] = listed["episodes"]
            episode = json.loads(daemon.cli("memory", "episodes", row["episode_id"], "--json").stdout)[
                "episode"]
            removed = daemon.cli("uninstall", "qwen-code", "--harness", "coder", "--project", str(repo))
            assert removed.returncode == 0, removed.stderr
    first = json.dumps(fake.agent_requests()[0].body)
    # REQ-15: nothing prepended; the gateway's instructions are what tells the agent to read its briefing
    assert FACT not in first and "harness-memory" not in first
    assert json.dumps(INSTRUCTIONS)[1:-1] in first
    # the recall went through the gateway as this resident's run, and its answer reached the model
    assert FACT in " ".join(fake.agent_requests()[1].tool_results()), fake.agent_requests()[0].tool_names()
    run = run_id_for("qwen-code", repo)
    assert gateway_calls(daemon.state) == [(f"coder/{run}", "recall", "ok")]
    # the SessionEnd hook recorded what the session did
    assert_the_failed_test_episode(episode, adapter="qwen-code", run_id=None)
    assert "still fails" in episode["result_excerpt"]
    assert episode["duration_ms"] > 0
    # uninstall gave the user's settings back byte for byte (CRLF and all)
    assert settings.read_bytes() == (before / ".qwen" / "settings.json").read_bytes()
