"""A resident Gemini CLI after `memactors install gemini-cli`: the real CLI (pinned) headless, `gemini -p`
in the project it was installed for, against a loopback fake of the Gemini API. It starts with its briefing
(the SessionStart hook), calls `recall` as an MCP tool and gets its memory back, and its session becomes an
episode with its edit and its failed test (the SessionEnd hook); with the daemon down it starts at once with
nothing and its session is spooled, then sent. `uninstall` leaves `cmp`-identical files. The daemon as a
process, memactors' CLI as a subprocess."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from fix_agents import (
    FACT,
    GEMINI_BIN,
    GEMINI_MODEL,
    add_fact,
    agent_bin,
    assert_the_failed_test_episode,
    gateway_calls,
    gemini_user,
    left_while_down,
    seed,
    the_only_episode,
)
from fix_daemon import daemon_process
from memactors.cli.install import run_id_for
from memactors.gateway import INSTRUCTIONS
from memactors.testing.fake_gemini import FunctionCall, McpToolCall, Text, Turn, run_fake_gemini
from support_runs import PYTEST, make_repo

pytestmark = pytest.mark.slow

#: The user's own settings, in a layout json.dumps would not write: uninstall must give these bytes back.
OWN_SETTINGS = '{\n    "model": {"name": "gemini-2.5-flash"},\n    "hooks": {"AfterTool": [{"hooks": [{"type": "command", ' \
               '"command": "true"}]}]}\n}'


def harness(repo: Path) -> str:
    return f'[harness.coder]\nharness = "gemini-cli"\nworkdir = "{repo}"\nmemory_briefing = true\n'


def trust(home: Path, folder: Path) -> None:
    """Trust ``folder`` as Gemini CLI's trust dialog does (``~/.gemini/trustedFolders.json``): it reads a
    project's settings only in a trusted folder, and 0.61's --skip-trust comes too late for them."""
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(folder): "TRUST_FOLDER"}), encoding="utf-8")


async def gemini_p(prompt: str, *, cwd: Path, env: dict[str, str], flags: tuple[str, ...] = ()) -> dict:
    """A headless session (`gemini -p`, tools approved by --approval-mode yolo, as a user scripting it would)."""
    done = await trio.run_process([str(agent_bin(GEMINI_BIN)), *flags, "--model", GEMINI_MODEL, "--approval-mode",
                                   "yolo", "--output-format", "json", "-p", prompt], cwd=cwd, env={**env, "PWD": str(cwd)},
                                  stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return json.loads(done.stdout)


def script() -> list[Turn]:
    return [Turn([McpToolCall("memactors", "recall", {"query": "ledger rounding"})]),
            Turn([FunctionCall("run_shell_command", {"command": f"{PYTEST} test_ledger.py",
                                                     "description": "run the ledger test"})]),
            Turn([FunctionCall("write_file", {"file_path": "NOTES.md", "content": "round with Decimal\n"})]),
            Turn([Text("Left NOTES.md; test_rounding still fails (2.675 is not representable).")])]


async def test_gemini_cli_installed_in_a_project_starts_briefed_recalls_and_its_session_becomes_an_episode(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    settings = repo / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(OWN_SETTINGS, encoding="utf-8")
    async with run_fake_gemini(script()) as fake:
        env = {**os.environ, **gemini_user(tmp_path, fake.base_url)}
        trust(tmp_path, repo)
        with daemon_process(tmp_path, harness(repo), env=env) as daemon:
            await add_fact(daemon)
            seeded = await seed(daemon, tmp_path)
            done = daemon.cli("install", "gemini-cli", "--briefing-at-start", "--harness", "coder", "--project", str(repo))
            assert done.returncode == 0, done.stderr
            assert "GEMINI_CLI_TRUST_WORKSPACE" in done.stderr  # the note on trusting the folder
            installed = json.loads(settings.read_text(encoding="utf-8"))
            hooks = {event: group[-1]["hooks"][0] for event, group in installed["hooks"].items()}
            assert "hook gemini-cli session-start" in hooks["SessionStart"]["command"]
            assert "hook gemini-cli session-end" in hooks["SessionEnd"]["command"]
            assert installed["hooks"]["AfterTool"] == json.loads(OWN_SETTINGS)["hooks"]["AfterTool"]
            assert not any("Bearer" in h["command"] for h in hooks.values())  # the token is read from the file
            answer = await gemini_p("What do we know about the ledger rounding?", cwd=repo, env=daemon.env)
            full = await the_only_episode(daemon)
            gone = daemon.cli("uninstall", "gemini-cli", "--harness", "coder", "--project", str(repo))
            assert gone.returncode == 0, gone.stderr
        calls = gateway_calls(daemon.state)
    # the session started with its briefing: the SessionStart hook's context before the prompt, fenced
    agent = fake.agent_requests()
    prompt = agent[0].first_user_text()
    # the gateway's MCP instructions (read your briefing first) reach the model too (REQ-15's pull)
    assert INSTRUCTIONS[:60] in json.dumps(agent[0].body) and "Before you start work, read your briefing once" in json.dumps(agent[0].body)
    assert FACT in prompt and 'source="harness-memory" field="briefing"' in prompt
    assert prompt.index(FACT) < prompt.index("What do we know about the ledger rounding?")
    # the model called recall as an MCP tool and got the earlier episode back
    [recalled] = agent[1].function_responses()
    document = json.dumps(recalled["response"])
    assert seeded in document and "Decimal quantize" in document
    run = f"coder/{run_id_for('gemini-cli', repo)}"
    assert calls == [(run, "briefing", "ok"), (run, "recall", "ok")]
    # the session became an episode: its edit, its failed test with its exit status, its answer
    assert_the_failed_test_episode(full, adapter="gemini-cli", run_id=answer["session_id"])
    assert "2.675 is not representable" in full["result_excerpt"]
    # uninstall: the user's settings back byte for byte
    assert settings.read_bytes() == OWN_SETTINGS.encode()


async def test_gemini_cli_for_the_user_with_the_daemon_down_starts_at_once_unbriefed_and_is_spooled_then_sent(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    async with run_fake_gemini([Turn([FunctionCall("run_shell_command", {"command": f"{PYTEST} test_ledger.py"})]),
                                Turn([Text("Offline, and the test fails.")])]) as fake:
        env = {**os.environ, **gemini_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, harness(repo), env=env) as daemon:
            done = daemon.cli("install", "gemini-cli", "--briefing-at-start", "--harness", "coder", "--user")
            assert done.returncode == 0, done.stderr
        # the user's settings: --skip-trust is enough for them (it is not for a project's)
        answer = await gemini_p("Run the ledger test.", cwd=repo, env=daemon.env, flags=("--skip-trust",))
    # no briefing, no memory tools reached, and the session waited for neither
    assert "harness-memory" not in json.dumps(fake.agent_requests()[0].body)
    failed_to_start, spooled = left_while_down(tmp_path / "state")
    assert failed_to_start == ["coder"]
    assert spooled["run_id"] == answer["session_id"] and spooled["reason"] == "verify_failed"
    # the daemon sends what was spooled when it starts
    with daemon_process(tmp_path, harness(repo)) as restarted:
        listed = await restarted.acli("memory", "episodes", "--harness", "coder", "--json")
    [episode] = json.loads(listed.stdout)["episodes"]
    assert episode["run_id"] == answer["session_id"]
