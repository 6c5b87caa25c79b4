"""`memactors run` with the real Gemini CLI (pinned) against a loopback fake of the Gemini API.

The daemon as a process spawns `gemini --output-format stream-json … --prompt <briefing + prompt>`; the
gateway reaches Gemini CLI as an MCP server through the run's settings file; the model (scripted) calls
`recall`, runs the failing test, writes a file and answers; the gemini-cli adapter reads the stream, and
the episode says what the agent really did."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fix_agents import (
    GEMINI_BIN,
    GEMINI_MODEL,
    GEMINI_VERSION,
    agent_bin,
    assert_the_failed_test_run_was_recorded,
    gemini_user,
    run_to_its_episode,
    secure_dir,
    seed,
    version,
)
from fix_daemon import daemon_process
from memactors.adapters import LaunchRequest
from memactors.adapters.gemini_cli import GeminiCliAdapter, GeminiCliParser
from memactors.testing.fake_gemini import FunctionCall, McpToolCall, Text, Turn, run_fake_gemini
from support import SEED_TEXT
from support_runs import PYTEST, make_repo

AT = "2026-12-02T08:00:00Z"
PROMPT = "Fix the ledger rounding test."


def gemini_harness(name: str, *, workdir: Path, extra: str = "") -> str:
    return (f'\n[harness.{name}]\nharness = "gemini-cli"\nworkdir = "{workdir}"\ncommand = "{agent_bin(GEMINI_BIN)}"\n'
            f'model = "{GEMINI_MODEL}"\npermission_mode = "yolo"\nprompt = "{PROMPT}"\nmemory_briefing = true\n{extra}')


def test_make_installs_the_pinned_gemini_cli() -> None:
    assert version(agent_bin(GEMINI_BIN)) == GEMINI_VERSION


def test_gemini_launch_names_the_run_settings_and_puts_the_prompt_last() -> None:
    request = LaunchRequest(harness="g", run_id="r1", workdir="/w", prompt="fix it", command=None, model="m",
                            permission_mode="yolo", mcp_config_path="/state/runs/mcp-1.json",
                            gateway_url="http://127.0.0.1:1/mcp", run_token="tok-secret")
    spec = GeminiCliAdapter().launch(request)
    assert spec.argv[:5] == ("gemini", "--output-format", "stream-json", "--debug", "--skip-trust")
    assert spec.argv[-2:] == ("--prompt", "fix it")
    assert "mcp_memactors_recall,mcp_memactors_briefing" in spec.argv
    assert spec.env == {"GEMINI_CLI_SYSTEM_SETTINGS_PATH": "/state/runs/mcp-1.json"}
    assert not any("tok-secret" in a for a in spec.argv)
    # a prompt starting with "-" stays one element yargs cannot read as a flag
    dashed = GeminiCliAdapter().launch(LaunchRequest(harness="g", run_id="r1", workdir="/w", prompt="-x", command=None))
    assert dashed.argv[-1] == "--prompt=-x"


def test_gemini_parser_reads_exit_codes_edits_and_the_joined_answer() -> None:
    lines = [
        {"type": "init", "session_id": "s-1", "model": "gemini-2.5-flash"},
        {"type": "message", "role": "user", "content": "the prompt, never kept"},
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "a", "parameters": {"command": "pytest -q"}},
        {"type": "tool_result", "tool_id": "a", "status": "success",
         "output": "Output: 1 failed\nExit Code: 1\nProcess Group PGID: 7"},
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "b", "parameters": {"command": "pytest -q"}},
        {"type": "tool_result", "tool_id": "b", "status": "success", "output": "Output: 1 passed\nProcess Group PGID: 8"},
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "c", "parameters": {"command": "pytest -q"}},
        {"type": "tool_result", "tool_id": "c", "status": "success",
         "output": "Command was automatically cancelled because it exceeded the timeout"},
        {"type": "tool_use", "tool_name": "write_file", "tool_id": "d", "parameters": {"file_path": "a.txt"}},
        {"type": "tool_result", "tool_id": "d", "status": "success"},
        {"type": "tool_use", "tool_name": "replace", "tool_id": "e", "parameters": {"file_path": "b.txt"}},
        {"type": "tool_result", "tool_id": "e", "status": "error", "error": {"message": "no match"}},
        {"type": "message", "role": "assistant", "content": "Half ", "delta": True},
        {"type": "message", "role": "assistant", "content": "done.", "delta": True},
        {"type": "result", "status": "success", "stats": {"input_tokens": 300, "output_tokens": 60,
                                                          "total_tokens": 360, "duration_ms": 99,
                                                          "models": {"gemini-fake-1": {}}}},
    ]
    parser = GeminiCliParser()
    for line in [*map(json.dumps, lines), "[DEBUG] not json"]:
        parser.feed(line, at=AT)
    t = parser.transcript
    assert (t.session_id, t.model, t.result_ok, t.result_text, t.texts) == ("s-1", "gemini-fake-1", True, "Half done.", 1)
    assert [c.exit_code for c in t.commands] == [1, 0, None]
    assert [e.path for e in t.edits] == ["a.txt"]
    assert parser.usage == {"input_tokens": 300, "output_tokens": 60, "total_tokens": 360}
    assert t.duration_ms == 99 and t.cost_usd is None
    assert t.turns == 6  # each model answer (a tool call, or the text) after a tool result


@pytest.mark.slow
@pytest.mark.req16
async def test_a_gemini_cli_run_calls_recall_and_becomes_an_episode_with_its_edit_and_failed_test() -> None:
    with secure_dir("gemini-run") as tmp_path:
        await _gemini_run(tmp_path)


async def _gemini_run(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = [
        Turn([McpToolCall("memactors", "recall", {"query": "ledger rounding"})]),
        Turn([FunctionCall("run_shell_command", {"command": f"{PYTEST} test_ledger.py",
                                                 "description": "run the ledger test"})]),
        Turn([FunctionCall("write_file", {"file_path": "NOTES.md", "content": "rounding is binary floating point\n"})]),
        Turn([Text("Left NOTES.md; test_rounding still fails (2.675 is not representable).")]),
    ]
    async with run_fake_gemini(script) as fake:
        env = {**os.environ, **gemini_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, gemini_harness("gem-fixer", workdir=repo), env=env) as daemon:
            seeded = await seed(daemon, tmp_path, SEED_TEXT)
            done = await run_to_its_episode(daemon, "gem-fixer", logs=True)
    # the run, its episode, and its recall through the gateway as this run
    assert_the_failed_test_run_was_recorded(done, daemon.state, harness="gem-fixer", adapter="gemini-cli")
    events, log = done.events, done.log
    assert done.episode["branch"] == "main"
    assert (repo / "NOTES.md").read_text(encoding="utf-8") == "rounding is binary floating point\n"
    # the memory document came back to the model
    agent = fake.agent_requests()
    [recalled] = agent[1].function_responses()
    document = json.dumps(recalled["response"])
    assert document.count('<memory-data kind=\\"recall\\"') == 1 and seeded in document, document[:2000]
    assert "Decimal quantize" in document
    # REQ-16: the fenced briefing precedes the configured prompt in the first user message
    prompt = agent[0].first_user_text()
    assert prompt.index('<memory-data kind="briefing"') < prompt.index(PROMPT)
    assert PROMPT not in log
    # `runs logs`: the session, the recall tool, the failed test with its exit status, the edit, the answer
    kinds = [(e["kind"], e.get("name") or e.get("path") or e.get("exit_code")) for e in events]
    assert ("tool", "mcp_memactors_recall") in kinds and ("edit", "NOTES.md") in kinds
    assert any(e["kind"] == "command" and e["exit_code"] == 1 and "test_ledger.py" in e["command"] for e in events)
    assert events[0]["kind"] == "session" and events[0]["model"] == GEMINI_MODEL
    assert any(e["kind"] == "result" and e["ok"] is True for e in events)


@pytest.mark.slow
async def test_a_gemini_cli_run_whose_settings_file_gemini_would_skip_is_refused_naming_the_directory(
        tmp_path: Path) -> None:
    """Gemini CLI silently skips a system settings file below a directory group or others may write (as
    pytest's tmp_path under /tmp is): the run would have no memory tools. `memactors run` refuses it,
    naming the directory and `[store] path`, and starts no agent."""
    repo = make_repo(tmp_path / "api")
    assert (os.stat("/tmp").st_mode & 0o002) and tmp_path.is_relative_to("/tmp")  # ok: one stat, the premise
    with daemon_process(tmp_path, gemini_harness("gem-fixer", workdir=repo)) as daemon:
        done = await daemon.acli("run", "gem-fixer", "--wait", "--json")
        listed = await daemon.acli("runs", "list", "--json")
    assert done.returncode != 0
    assert "[store] path" in done.stderr and "/tmp" in done.stderr and "no memory tools" in done.stderr, done.stderr
    assert json.loads(listed.stdout)["runs"] == [], listed.stdout
