"""`memactors run` with the real pi (pinned, from npm) against a loopback fake of the OpenAI-compatible Chat
Completions API (`harness = "pi"`).

pi has no MCP client: the run's "MCP config" is memactors' pi extension (written, mode 0600, beside the other
runs' configs and loaded with `-e`), whose `recall` and `briefing` tools reach the gateway as the run through
`memactors hook pi tool` with the run's own URL and token from its environment. The model (scripted) calls
`recall`, writes a file, runs the failing test and answers; the pi adapter reads `pi --mode json`, and the
episode says what the agent really did."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fix_agents import (
    PI_BIN,
    agent_bin,
    assert_the_failed_test_run_was_recorded,
    assert_the_model_got_its_memory,
    parsed_as_the_failed_test_session,
    pi_user,
    run_to_its_episode,
    seed,
)
from fix_daemon import daemon_process
from memactors.adapters import LaunchRequest
from memactors.adapters.pi import PiAdapter, PiParser
from memactors.testing.fake_chat import Call, Reply, Step, run_fake_chat
from support import SEED_TEXT
from support_runs import PYTEST, make_repo

AT = "2026-12-02T08:00:00Z"
PROMPT = "Fix the ledger rounding test."


def test_pi_launch_loads_the_run_extension_and_keeps_the_token_out_of_argv_and_the_extension() -> None:
    spec = PiAdapter().launch(LaunchRequest(
        harness="p", run_id="r1", workdir="/w", prompt="fix it", command=None, model="fake-chat",
        mcp_config_path="/state/runs/mcp-1.ts", gateway_url="http://127.0.0.1:1/mcp", run_token="tok-secret"))
    assert spec.argv == ("pi", "--mode", "json", "-e", "/state/runs/mcp-1.ts", "--model", "fake-chat", "-p", "fix it")
    extension = PiAdapter.mcp_config("http://127.0.0.1:1/mcp", "tok-secret")
    assert "tok-secret" not in extension and '"hook", "pi", "tool"' in extension


def test_pi_parser_reads_edits_exit_codes_and_the_answer() -> None:
    def message(role: str, *content: dict, **extra: object) -> dict:
        return {"type": "message_end", "message": {"role": role, "content": list(content), **extra}}

    lines = [
        {"type": "session", "version": 3, "id": "s-1", "cwd": "/w"},
        message("user", {"type": "text", "text": "the prompt, never kept"}),
        message("assistant", {"type": "toolCall", "id": "a", "name": "write", "arguments": {"path": "a.txt"}},
                model="m-1"),
        message("toolResult", {"type": "text", "text": "Successfully wrote"}, toolCallId="a", isError=False),
        message("assistant", {"type": "toolCall", "id": "b", "name": "bash", "arguments": {"command": "pytest"}}),
        message("toolResult", {"type": "text", "text": "1 failed\n\nCommand exited with code 1"}, toolCallId="b",
                isError=True),
        message("assistant", {"type": "toolCall", "id": "c", "name": "edit", "arguments": {"path": "b.txt"}}),
        message("toolResult", {"type": "text", "text": "no match"}, toolCallId="c", isError=True),
        message("assistant", {"type": "text", "text": "Still failing."}),
        {"type": "agent_end", "messages": []},
    ]
    parsed_as_the_failed_test_session(PiParser(), lines, at=AT)


@pytest.mark.slow
@pytest.mark.req16
async def test_a_pi_run_recalls_through_the_extension_and_becomes_an_episode_with_its_edit_and_failed_test(
        tmp_path: Path) -> None:
    pi = agent_bin(PI_BIN)
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = [Step([Call("recall", {"query": "ledger rounding"})]),
              Step([Call("write", {"path": str(repo / "NOTES.md"), "content": "binary floating point\n"})]),
              Step([Call("bash", {"command": f"{PYTEST} test_ledger.py"})]),
              Step([Reply("Left NOTES.md; test_rounding still fails (2.675 is not representable).")])]
    harness = (f'[harness.pi-fixer]\nharness = "pi"\nworkdir = "{repo}"\ncommand = "{pi}"\nmodel = "fake-chat"\n'
               f'extra_args = ["--provider", "fake"]\nprompt = "{PROMPT}"\nmemory_briefing = true\n')
    async with run_fake_chat(script) as fake:
        pi_user(tmp_path, fake.base_url)
        with daemon_process(tmp_path, harness, env=dict(os.environ)) as daemon:
            seeded = await seed(daemon, tmp_path, SEED_TEXT)
            done = await run_to_its_episode(daemon, "pi-fixer")
    # the run, its episode, and its recall through the gateway as this run
    assert_the_failed_test_run_was_recorded(done, daemon.state, harness="pi-fixer", adapter="pi")
    assert done.episode["duration_ms"] > 0, done.run.get("stderr_tail")
    # the memory document came back to the model, and the briefing came first (REQ-16)
    assert_the_model_got_its_memory(fake, seeded=seeded, prompt=PROMPT)
