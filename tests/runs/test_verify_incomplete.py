"""A verify call that never finished is not a success. A Codex stream whose test command has an
``item.started`` but no ``item.completed`` (pytest ran past Codex's command window), or a Claude Code Bash
call whose result never came or came without an exit status, makes the run ``failed`` /
``verify_incomplete`` — never ``succeeded`` by omission — unless a later test command reported."""

from __future__ import annotations

import json
from pathlib import Path

from memactors._wire import parse_run_record
from memactors.adapters import Transcript
from memactors.adapters.claude_code import ClaudeCodeParser
from memactors.adapters.codex import CodexParser
from memactors.agents.run_record import build_run_record
from memactors.config import HarnessConfig
from memactors.episode import SessionRepo, assemble

DATA = Path(__file__).resolve().parents[1] / "data"
AT = "2026-12-02T08:00:00Z"


def _record(transcript: Transcript, adapter: str = "codex") -> dict[str, object]:
    data = build_run_record(
        harness="h", adapter=adapter, run_id="r1", cfg=HarnessConfig(name="h", harness=adapter, origin="global"),
        transcript=transcript, exit_code=0, stopped=None, spawn_error=False, started_at=AT, ended_at=AT,
        duration_ms=5, workdir="/var/tmp/work", repo_key="forge.example/acme/ledger", toplevel="/var/tmp/work",
        branch="main", changed={"ledger.py"})
    parse_run_record(data)  # the record IngestRun accepts (the schema knows the reason)
    return data


def _codex(lines: list[str]) -> CodexParser:
    parser = CodexParser()
    for line in lines:
        parser.feed(line, at=AT)
    return parser


def _stream() -> list[str]:
    return (DATA / "codex_exec_unfinished_pytest.jsonl").read_text(encoding="utf-8").splitlines()


def test_a_codex_test_command_without_its_end_event_is_verify_incomplete() -> None:
    parser = _codex(_stream())
    tr = parser.transcript
    assert tr.result_ok is True  # Codex itself says the turn completed
    assert tr.commands == []     # the command never ended ...
    [(_, pending)] = tr.running.values()
    assert (pending.command, pending.exit_code, pending.finished) == ("python -m pytest -q", None, False)
    data = _record(tr)
    assert (data["outcome"], data["reason"]) == ("failed", "verify_incomplete")
    assert [e for e in data["events"] if e["kind"] == "verify"] == []  # neither a pass nor a failure
    # the episode carries the reason through (REQ-5)
    record = parse_run_record(data)
    episode = assemble(record, {record.sessions[0].session_id: SessionRepo(
        key="forge.example/acme/ledger", cwd="/var/tmp/work", roots=("/var/tmp/work",))}, excerpt_chars=200)
    assert (episode.outcome, episode.reason) == ("failed", "verify_incomplete")


def test_the_same_stream_with_the_end_event_succeeds() -> None:
    lines = _stream()
    started = json.loads(lines[2])
    done = {"type": "item.completed", "item": {**started["item"], "exit_code": 0, "status": "completed",
                                               "aggregated_output": "3 passed"}}
    parser = _codex([*lines[:3], json.dumps(done), *lines[3:]])
    assert parser.transcript.running == {}
    data = _record(parser.transcript)
    assert (data["outcome"], data["reason"]) == ("succeeded", "completed")
    assert [e["ok"] for e in data["events"] if e["kind"] == "verify"] == [True]


def test_a_later_test_command_that_reported_decides_and_a_later_unfinished_one_does() -> None:
    lines = _stream()
    passed = ['{"type":"item.completed","item":{"id":"item_9","type":"command_execution",'
              '"command":"/bin/bash -lc \'python -m pytest -q -x\'","aggregated_output":"","exit_code":0,'
              '"status":"completed"}}']
    later_pass = _record(_codex([*lines[:3], *passed, *lines[3:]]).transcript)
    assert (later_pass["outcome"], later_pass["reason"]) == ("succeeded", "completed")
    # a pass first, then a test command that never ended: nothing says the final state passed
    earlier_pass = _record(_codex([lines[0], lines[1], *passed, *lines[2:]]).transcript)
    assert (earlier_pass["outcome"], earlier_pass["reason"]) == ("failed", "verify_incomplete")


def test_a_declined_codex_command_still_tested_nothing() -> None:
    declined = ('{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"pytest",'
                '"aggregated_output":"","exit_code":null,"status":"declined"}}')
    lines = _stream()
    parser = _codex([lines[0], lines[1], declined, *lines[3:]])
    data = _record(parser.transcript)
    assert (data["outcome"], data["reason"]) == ("succeeded", "completed")


def _claude(lines: list[dict[str, object]]) -> ClaudeCodeParser:
    parser = ClaudeCodeParser()
    for line in lines:
        parser.feed(json.dumps(line), at=AT)
    return parser


_INIT = {"type": "system", "subtype": "init", "session_id": "s-1", "model": "claude-x", "cwd": "/var/tmp/work"}
_BASH = {"type": "assistant", "message": {"id": "m1", "model": "claude-x", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "python -m pytest -q"}}]}}
_RESULT = {"type": "result", "subtype": "success", "is_error": False, "result": "done", "total_cost_usd": 0.01}


def test_a_claude_bash_test_whose_result_never_came_or_timed_out_is_verify_incomplete() -> None:
    never = _claude([_INIT, _BASH, _RESULT])
    assert (_record(never.transcript, "claude-code")["reason"]) == "verify_incomplete"
    timed_out = _claude([_INIT, _BASH, {"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
         "content": "Command timed out after 2m 0.0s"}]}}, _RESULT])
    [command] = timed_out.transcript.commands
    assert (command.exit_code, command.finished) == (None, False)
    data = _record(timed_out.transcript, "claude-code")
    assert (data["outcome"], data["reason"]) == ("failed", "verify_incomplete")
    ran = _claude([_INIT, _BASH, {"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False, "content": "3 passed"}]}}, _RESULT])
    assert _record(ran.transcript, "claude-code")["reason"] == "completed"
