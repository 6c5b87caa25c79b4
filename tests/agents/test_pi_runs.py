"""`memactors run` with the real pi (pinned, from npm) against a loopback fake of the OpenAI-compatible Chat
Completions API (`harness = "pi"`).

pi has no MCP client: the run's "MCP config" is memactors' pi extension (written, mode 0600, beside the other
runs' configs and loaded with `-e`), whose `recall` and `briefing` tools reach the gateway as the run through
`memactors hook pi tool` with the run's own URL and token from its environment. The model (scripted) calls
`recall`, writes a file, runs the failing test and answers; the pi adapter reads `pi --mode json`, and the
episode says what the agent really did."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fix_agents import PI_BIN, agent_bin, gateway_calls, pi_user
from fix_daemon import daemon_process
from memactors.adapters import LaunchRequest
from memactors.adapters.pi import PiAdapter, PiParser
from memactors.testing.fake_chat import Call, Reply, Step, run_fake_chat
from support import SEED_TEXT, run_record
from support_runs import PYTEST, REPO_KEY, make_repo

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
    parser = PiParser()
    for line in lines:
        parser.feed(json.dumps(line), at=AT)
    t = parser.transcript
    assert (t.session_id, t.model, t.result_ok, t.result_text) == ("s-1", "m-1", True, "Still failing.")
    assert [e.path for e in t.edits] == ["a.txt"]
    assert [(c.command, c.exit_code) for c in t.commands] == [("pytest", 1)]


@pytest.mark.slow
@pytest.mark.req16
async def test_a_pi_run_recalls_through_the_extension_and_becomes_an_episode_with_its_edit_and_failed_test(
        tmp_path: Path) -> None:
    pi = agent_bin(PI_BIN)
    repo = make_repo(tmp_path / "api", failing_test=True)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(run_record(result_text=SEED_TEXT)),
                       encoding="utf-8")
    script = [Step([Call("recall", {"query": "ledger rounding"})]),
              Step([Call("write", {"path": str(repo / "NOTES.md"), "content": "binary floating point\n"})]),
              Step([Call("bash", {"command": f"{PYTEST} test_ledger.py"})]),
              Step([Reply("Left NOTES.md; test_rounding still fails (2.675 is not representable).")])]
    harness = (f'[harness.pi-fixer]\nharness = "pi"\nworkdir = "{repo}"\ncommand = "{pi}"\nmodel = "fake-chat"\n'
               f'extra_args = ["--provider", "fake"]\nprompt = "{PROMPT}"\nmemory_briefing = true\n')
    async with run_fake_chat(script) as fake:
        pi_user(tmp_path, fake.base_url)
        with daemon_process(tmp_path, harness, env=dict(os.environ)) as daemon:
            ingested = await daemon.acli("runs", "ingest", str(earlier), "--json")
            assert ingested.returncode == 0, ingested.stderr
            [seeded] = [r["episode_id"] for r in json.loads(ingested.stdout)]
            done = await daemon.acli("run", "pi-fixer", "--wait", "--json")
            assert done.returncode == 1, (done.stdout, done.stderr, daemon.log.read_text(encoding="utf-8")[-3000:])
            run = json.loads(done.stdout)
            shown = await daemon.acli("memory", "episodes", run["episode_id"], "--json")
            episode = json.loads(shown.stdout)["episode"]
        calls = gateway_calls(daemon.state)
    assert (run["outcome"], run["reason"]) == ("failed", "verify_failed"), run.get("stderr_tail")
    assert (episode["adapter"], episode["run_id"], episode["repo"]) == ("pi", run["run_id"], REPO_KEY)
    assert episode["files_touched"] == ["NOTES.md"]
    assert episode["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
    assert "2.675 is not representable" in episode["result_excerpt"] and episode["duration_ms"] > 0
    # recall went through the gateway as this run, and the memory document came back to the model
    assert calls == [(f"pi-fixer/{run['run_id']}", "recall", "ok")]
    agent = fake.agent_requests()
    assert seeded in " ".join(agent[1].tool_results())
    # REQ-16: the fenced briefing precedes the configured prompt in the first user message
    first = json.dumps(agent[0].body)
    assert first.index("memory-data kind=\\\"briefing\\\"") < first.index(PROMPT)
