"""`memactors run` with the real Qwen Code (pinned, from npm) against a loopback fake of the OpenAI-compatible
Chat Completions API (`harness = "qwen-code"`).

The daemon as a process spawns `qwen --output-format stream-json … --mcp-config <run file>` with the briefing and
the prompt on stdin; the gateway reaches Qwen Code through the run's MCP config in its own format (`httpUrl`); the
model (scripted) calls `recall`, writes a file, runs the failing test and answers; the qwen-code adapter
reads the stream, and the episode says what the agent really did."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fix_agents import (
    QWEN_BIN,
    QWEN_MODEL,
    QWEN_VERSION,
    agent_bin,
    assert_the_failed_test_run_was_recorded,
    assert_the_model_got_its_memory,
    parsed_as_the_failed_test_session,
    qwen_user,
    run_to_its_episode,
    seed,
    version,
)
from fix_daemon import daemon_process
from memactors.adapters import LaunchRequest
from memactors.adapters.qwen_code import QwenCodeAdapter, QwenCodeParser
from memactors.testing.fake_chat import Call, Reply, Step, run_fake_chat
from support import SEED_TEXT
from support_runs import PYTEST, make_repo

AT = "2026-12-02T08:00:00Z"
PROMPT = "Fix the ledger rounding test."


def test_make_installs_the_pinned_qwen_code() -> None:
    assert version(agent_bin(QWEN_BIN)) == QWEN_VERSION


def test_qwen_launch_names_the_run_mcp_config_and_keeps_the_token_and_the_prompt_out_of_argv() -> None:
    spec = QwenCodeAdapter().launch(LaunchRequest(
        harness="q", run_id="r1", workdir="/w", prompt="-fix it", command=None, model="m", permission_mode="yolo",
        mcp_config_path="/state/runs/mcp-1.json", gateway_url="http://127.0.0.1:1/mcp", run_token="tok-secret"))
    assert spec.argv == ("qwen", "--output-format", "stream-json", "--model", "m", "--approval-mode", "yolo",
                         "--mcp-config", "/state/runs/mcp-1.json")
    assert spec.stdin == "-fix it"  # on stdin: never read as a flag
    assert not any("tok-secret" in a for a in spec.argv)
    server = QwenCodeAdapter.mcp_config("http://127.0.0.1:1/mcp", "tok")["mcpServers"]["memactors"]
    assert server["httpUrl"] == "http://127.0.0.1:1/mcp" and "url" not in server  # url alone would be SSE


def test_qwen_parser_reads_edits_exit_codes_and_the_answer() -> None:
    def blocks(kind: str, *content: dict) -> dict:
        role = "assistant" if kind == "assistant" else "user"
        return {"type": kind, "session_id": "s-1", "message": {"role": role, "model": "m-1", "content": list(content)}}

    lines = [
        {"type": "system", "subtype": "init", "session_id": "s-1"},
        blocks("assistant", {"type": "tool_use", "id": "a", "name": "write_file", "input": {"file_path": "a.txt"}}),
        blocks("user", {"type": "tool_result", "tool_use_id": "a", "is_error": False, "content": "ok"}),
        blocks("assistant", {"type": "tool_use", "id": "b", "name": "run_shell_command", "input": {"command": "pytest"}}),
        blocks("user", {"type": "tool_result", "tool_use_id": "b", "is_error": True,
                        "content": "Command: pytest\nOutput: 1 failed\nExit Code: 1\nSignal: (none)"}),
        blocks("assistant", {"type": "tool_use", "id": "c", "name": "edit", "input": {"file_path": "b.txt"}}),
        blocks("user", {"type": "tool_result", "tool_use_id": "c", "is_error": True, "content": "no match"}),
        blocks("assistant", {"type": "text", "text": "Still failing."}),
        {"type": "result", "subtype": "success", "is_error": False, "duration_ms": 42,
         "usage": {"input_tokens": 300, "output_tokens": 60, "total_tokens": 360}},
    ]
    parser = QwenCodeParser()
    t = parsed_as_the_failed_test_session(parser, lines, at=AT)
    assert parser.usage == {"input_tokens": 300, "output_tokens": 60, "total_tokens": 360} and t.duration_ms == 42


@pytest.mark.slow
@pytest.mark.req16
async def test_a_qwen_code_run_recalls_and_becomes_an_episode_with_its_edit_and_failed_test(tmp_path: Path) -> None:
    qwen = agent_bin(QWEN_BIN)
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = [Step([Call("mcp__memactors__recall|memactors__recall|recall", {"query": "ledger rounding"})]),
              Step([Call("write_file", {"file_path": str(repo / "NOTES.md"), "content": "binary floating point\n"})]),
              Step([Call("run_shell_command", {"command": f"{PYTEST} test_ledger.py", "description": "the test"})]),
              Step([Reply("Left NOTES.md; test_rounding still fails (2.675 is not representable).")])]
    harness = (f'[harness.qwen-fixer]\nharness = "qwen-code"\nworkdir = "{repo}"\ncommand = "{qwen}"\n'
               f'model = "{QWEN_MODEL}"\npermission_mode = "yolo"\nprompt = "{PROMPT}"\nmemory_briefing = true\n')
    async with run_fake_chat(script) as fake:
        env = {**os.environ, **qwen_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, harness, env=env) as daemon:
            seeded = await seed(daemon, tmp_path, SEED_TEXT)
            done = await run_to_its_episode(daemon, "qwen-fixer")
    # the run, its episode, and its recall through the gateway as this run
    assert_the_failed_test_run_was_recorded(done, daemon.state, harness="qwen-fixer", adapter="qwen-code")
    assert done.episode["duration_ms"] > 0, done.run.get("stderr_tail")
    # the memory document came back to the model, and the briefing came first (REQ-16)
    assert_the_model_got_its_memory(fake, seeded=seeded, prompt=PROMPT)
