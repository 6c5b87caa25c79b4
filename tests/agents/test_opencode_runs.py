"""`memactors run` with the real OpenCode (pinned) against the loopback fake of the OpenAI Responses API.

The daemon as a process spawns `opencode run --format json …`, the briefing and prompt on stdin, with the gateway in
`OPENCODE_CONFIG_CONTENT` (the token read by OpenCode from the environment); the model (scripted) calls
`recall`, runs the failing test, writes a file and answers; the opencode adapter reads the stream, and the
episode says what the agent really did."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fix_agents import (
    OPENCODE_BIN,
    OPENCODE_MODEL,
    OPENCODE_VERSION,
    agent_bin,
    assert_the_failed_test_run_was_recorded,
    opencode_user,
    run_to_its_episode,
    seed,
    version,
)
from fix_daemon import daemon_process
from memactors.adapters import LaunchRequest
from memactors.adapters.opencode import OpenCodeAdapter, OpenCodeParser
from memactors.testing.fake_openai import FunctionCall, Message, Turn, run_fake_openai
from support import SEED_TEXT
from support_runs import PYTEST, make_repo

AT = "2026-12-02T08:00:00Z"
PROMPT = "Fix the ledger rounding test."


def user_text(body: dict[str, object]) -> str:
    """The user messages' text of a Responses request (OpenCode sends a string or input_text parts)."""
    parts = []
    for item in body.get("input") or ():  # type: ignore[attr-defined]
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                parts.append(content)
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and isinstance(block.get("text"), str):
                    parts.append(block["text"])
    return "\n".join(parts)


def opencode_harness(name: str, *, workdir: Path) -> str:
    return (f'\n[harness.{name}]\nharness = "opencode"\nworkdir = "{workdir}"\ncommand = "{agent_bin(OPENCODE_BIN)}"\n'
            f'model = "{OPENCODE_MODEL}"\nprompt = "{PROMPT}"\nmemory_briefing = true\n')


def test_make_installs_the_pinned_opencode() -> None:
    assert version(agent_bin(OPENCODE_BIN)) == OPENCODE_VERSION


def test_opencode_launch_gives_the_gateway_in_its_config_content_with_the_token_from_the_environment() -> None:
    request = LaunchRequest(harness="o", run_id="r1", workdir="/w", prompt="-fix it", command=None, model="p/m",
                            permission_mode="auto", gateway_url="http://127.0.0.1:1/mcp", run_token="tok-secret")
    spec = OpenCodeAdapter().launch(request)
    assert spec.argv[:8] == ("opencode", "run", "--format", "json", "--dir", "/w", "--title", "memactors run r1")
    # the prompt on stdin, not as an argument OpenCode would re-quote
    assert spec.stdin == "-fix it" and "-fix it" not in spec.argv and "--auto" in spec.argv
    assert json.loads(spec.env["OPENCODE_CONFIG_CONTENT"]) == {"mcp": {"memactors": {
        "type": "remote", "url": "http://127.0.0.1:1/mcp", "enabled": True, "oauth": False,
        "headers": {"Authorization": "Bearer {env:MEMACTORS_RUN_TOKEN}"}}}}
    assert spec.env["MEMACTORS_RUN_TOKEN"] == "tok-secret" and spec.env["PWD"] == "/w"
    assert not any("tok-secret" in a for a in spec.argv)


def test_opencode_parser_reads_exit_codes_edits_cost_and_the_answer() -> None:
    def tool(name: str, status: str, tool_input: dict[str, object], metadata: dict[str, object]) -> dict[str, object]:
        return {"type": "tool_use", "sessionID": "ses_1", "part": {"type": "tool", "tool": name, "state": {
            "status": status, "input": tool_input, "output": "…", "metadata": metadata}}}

    def finish(reason: str, cost: float) -> dict[str, object]:
        return {"type": "step_finish", "sessionID": "ses_1", "part": {"reason": reason, "cost": cost,
                                                                       "tokens": {"input": 100, "output": 20}}}

    lines = [
        {"type": "step_start", "sessionID": "ses_1", "part": {}},
        tool("bash", "completed", {"command": "pytest -q"}, {"exit": 1}),
        tool("bash", "error", {"command": "pytest -q"}, {}),
        tool("write", "completed", {"filePath": "a.txt"}, {}),
        tool("edit", "error", {"filePath": "b.txt"}, {}),
        tool("apply_patch", "completed", {"patchText": "*** Begin Patch\n*** Add File: c.txt\n+x\n*** End Patch"}, {}),
        tool("memactors_recall", "completed", {"query": "q"}, {}),
        finish("tool-calls", 0.25),
        {"type": "step_start", "sessionID": "ses_1", "part": {}},
        {"type": "text", "sessionID": "ses_1", "part": {"type": "text", "text": "Done."}},
        finish("stop", 0.5),
    ]
    parser = OpenCodeParser()
    for line in [*map(json.dumps, lines), "not json"]:
        parser.feed(line, at=AT)
    t = parser.transcript
    assert (t.session_id, t.turns, t.result_ok, t.result_text, t.cost_usd) == ("ses_1", 2, True, "Done.", 0.75)
    assert [(c.command, c.exit_code) for c in t.commands] == [("pytest -q", 1), ("pytest -q", None)]
    assert [e.path for e in t.edits] == ["a.txt", "c.txt"]
    assert "memactors_recall" in t.tool_calls
    assert parser.usage["input_tokens"] == 200 and parser.usage["output_tokens"] == 40
    error = OpenCodeParser()
    error.feed(json.dumps({"type": "error", "sessionID": "s", "error": {"name": "APIError", "data": {}}}), at=AT)
    assert (error.transcript.result_ok, error.transcript.result_kind) == (False, "APIError")


@pytest.mark.slow
@pytest.mark.req16
async def test_an_opencode_run_calls_recall_and_becomes_an_episode_with_its_edit_and_failed_test(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = [
        Turn([FunctionCall("memactors_recall", {"query": "ledger rounding"})]),
        Turn([FunctionCall("bash", {"command": f"{PYTEST} test_ledger.py", "description": "run the ledger test",
                                    "timeout": 600_000})]),
        Turn([FunctionCall("write", {"filePath": "NOTES.md", "content": "rounding is binary floating point\n"})]),
        Turn([Message("Left NOTES.md; test_rounding still fails (2.675 is not representable).")]),
    ]
    async with run_fake_openai(script) as fake:
        env = {**os.environ, **opencode_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, opencode_harness("oc-fixer", workdir=repo), env=env) as daemon:
            seeded = await seed(daemon, tmp_path, SEED_TEXT)
            done = await run_to_its_episode(daemon, "oc-fixer", logs=True)
    # the run, its episode, and its recall through the gateway as this run
    assert_the_failed_test_run_was_recorded(done, daemon.state, harness="oc-fixer", adapter="opencode")
    run, events, log = done.run, done.events, done.log
    assert done.episode["branch"] == "main"
    # the memory document came back to the model
    [recalled] = fake.tool_outputs(1)
    assert recalled.count('<memory-data kind="recall"') == 1 and seeded in recalled and "Decimal quantize" in recalled
    # REQ-16: the fenced briefing precedes the configured prompt in the first user message, exactly as
    # composed: given on stdin, the prompt is not re-quoted as OpenCode 1.18 re-quotes an argument with a space
    prompt = user_text(fake.model_calls[0].body)
    assert prompt.startswith('<untrusted-data source="harness-memory" field="briefing"'), prompt[:2000]
    assert '<memory-data kind="briefing"' in prompt and prompt.endswith(f"\n\n{PROMPT}"), prompt[-2000:]
    assert '\\"' not in prompt
    assert PROMPT not in log
    # `runs logs`: the recall tool, the failed test with its exit status, the edit, the result with its cost
    kinds = [(e["kind"], e.get("name") or e.get("path")) for e in events]
    assert ("tool", "memactors_recall") in kinds and ("edit", "NOTES.md") in kinds
    assert any(e["kind"] == "command" and e["exit_code"] == 1 and "test_ledger.py" in e["command"] for e in events)
    assert any(e["kind"] == "result" and e["ok"] is True and e["cost_usd"] for e in events)
    assert run.get("cost_usd") is None or run["cost_usd"] > 0
