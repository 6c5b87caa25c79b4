"""The readers of resident sessions, on the shapes the real CLIs write (Gemini CLI 0.61's session file,
the parts memactors' OpenCode plugin collects): what becomes the run record, and what is never kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memactors.agents.resident_sessions import gemini_session, opencode_session, resident_record
from memactors.config import HarnessConfig
from support import write_config
from support_runs import make_repo

PROMPT = "the user's prompt, never kept"


def cfg(adapter: str) -> HarnessConfig:
    return HarnessConfig(name="coder", harness=adapter, origin="global")


def gemini_lines() -> list[str]:
    shell = {"id": "run_shell_command__call_00_0", "name": "run_shell_command", "status": "success",
             "args": {"command": "python -m pytest -q test_ledger.py"}, "timestamp": "2026-12-02T13:44:39.667Z",
             "result": [{"functionResponse": {"response": {"output": "<untrusted_context>\nOutput: 1 failed\n"
                                                                     "Exit Code: 1\nProcess Group PGID: 7\n"
                                                                     "</untrusted_context>"}}}]}
    passed = {**shell, "id": "b", "timestamp": "2026-12-02T13:44:40.000Z", "result": [{"functionResponse": {
        "response": {"output": "<untrusted_context>\nOutput: 1 passed\nProcess Group PGID: 8\n</untrusted_context>"}}}]}
    cancelled = {**shell, "id": "c", "status": "cancelled", "result": []}
    write = {"id": "w", "name": "write_file", "status": "success", "args": {"file_path": "NOTES.md", "content": "x"},
             "result": [{"functionResponse": {"response": {"output": "Successfully wrote"}}}]}
    failed_edit = {"id": "e", "name": "replace", "status": "error", "args": {"file_path": "README.md"},
                   "result": [{"functionResponse": {"response": {"error": "no match"}}}]}
    entries = [
        {"sessionId": "s-1", "projectHash": "h", "startTime": "2026-12-02T13:44:35.278Z", "kind": "main"},
        {"$set": {"messages": [{"id": "ctx", "timestamp": "2026-12-02T13:44:35.279Z", "type": "user",
                                "content": [{"text": "<session_context>…"}]}]}},
        {"id": "u1", "timestamp": "2026-12-02T13:44:35.320Z", "type": "user", "content": [{"text": PROMPT}]},
        # a model message is written when it streams, and again under its id once its tool calls finished
        {"id": "g1", "timestamp": "2026-12-02T13:44:35.721Z", "type": "gemini", "content": "", "model": "gemini-2.5-flash"},
        {"id": "g1", "timestamp": "2026-12-02T13:44:35.721Z", "type": "gemini", "content": "Running the test.",
         "model": "gemini-2.5-flash", "toolCalls": [shell, write, failed_edit]},
        {"$set": {"lastUpdated": "2026-12-02T13:44:39.669Z"}},
        "not json at all",
        {"id": "g2", "timestamp": "2026-12-02T13:44:40.100Z", "type": "gemini", "content": "",
         "model": "gemini-2.5-flash", "toolCalls": [passed, cancelled]},
        {"id": "g3", "timestamp": "2026-12-02T13:44:41.939Z", "type": "gemini", "content": "Fixed; the test passes.",
         "model": "gemini-2.5-flash"},
    ]
    return [e if isinstance(e, str) else json.dumps(e) for e in entries]


def test_a_gemini_session_file_gives_edits_exit_statuses_and_the_last_answer_never_the_prompt(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    session = gemini_session(gemini_lines())
    t = session.transcript
    assert (t.session_id, t.model, t.result_text) == ("s-1", "gemini-2.5-flash", "Fixed; the test passes.")
    assert [(c.command.split()[-1], c.exit_code) for c in t.commands] == [("test_ledger.py", 1), ("test_ledger.py", 0),
                                                                          ("test_ledger.py", None)]
    assert [e.path for e in t.edits] == ["NOTES.md"]  # the replace that failed wrote nothing
    assert (session.started_at, session.ended_at) == ("2026-12-02T13:44:35.278Z", "2026-12-02T13:44:41.939Z")
    record = resident_record(t, harness="coder", adapter="gemini-cli", cfg=cfg("gemini-cli"), session_id="s-1",
                             cwd=str(repo), started_at=session.started_at, ended_at=session.ended_at)
    assert (record["outcome"], record["reason"]) == ("succeeded", "completed")  # the last test passed
    assert [e["ok"] for e in record["events"] if e["kind"] == "verify"] == [False, True]
    assert record["sessions"][0]["git_branch"] == "main" and record["trigger"] == {"source": "manual",
                                                                                  "name": "session-end"}
    assert PROMPT not in json.dumps(record) and record["prompt"] is None


def test_the_opencode_plugins_parts_give_edits_exit_statuses_cost_and_the_answer(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    doc = {"session_id": "ses_1", "directory": str(repo), "started_at": 1796219270782, "ended_at": 1796219276153,
           "model": "fake/fake-model", "errors": [], "parts": [
               {"type": "step-start"},
               {"type": "tool", "tool": "bash", "state": {"status": "completed", "input": {"command": "pytest -q"},
                                                          "metadata": {"exit": 1},
                                                          "time": {"start": 1796219271000, "end": 1796219272000}}},
               {"type": "tool", "tool": "write", "state": {"status": "completed",
                                                           "input": {"filePath": str(repo / "NOTES.md")},
                                                           "metadata": {}, "time": {"end": 1796219273000}}},
               {"type": "tool", "tool": "apply_patch", "state": {"status": "completed", "input": {
                   "patchText": "*** Update File: src/ledger.py"}, "metadata": {}}},
               {"type": "step-finish", "reason": "tool-calls", "cost": 0.25, "tokens": {"input": 100, "output": 20}},
               {"type": "text", "text": "Left NOTES.md; the test still fails.", "time": {"end": 1796219276000}},
               {"type": "step-finish", "reason": "stop", "cost": 0.5},
           ]}
    transcript, started, ended = opencode_session(doc)
    assert (started, ended) == ("2026-12-02T13:47:50.782Z", "2026-12-02T13:47:56.153Z")
    record = resident_record(transcript, harness="coder", adapter="opencode", cfg=cfg("opencode"), session_id="ses_1",
                             cwd=str(repo), started_at=started, ended_at=ended)
    assert (record["outcome"], record["reason"]) == ("failed", "verify_failed")
    assert [e["path"] for e in record["events"] if e["kind"] == "edit"] == ["NOTES.md", "src/ledger.py"]
    assert record["cost_usd"] == 0.75 and record["cost_source"] == "reported"
    assert record["result_text"] == "Left NOTES.md; the test still fails."
    assert record["model"]["served"] == "fake/fake-model" and record["run_id"] == "ses_1"


@pytest.mark.parametrize("agent", ["gemini-cli", "opencode", "claude-code", "codex"])
def test_a_user_installs_hooks_leave_a_memactors_run_to_the_daemon(tmp_path: Path, agent: str) -> None:
    """In a session `memactors run` started (MEMACTORS_RUN_ID in its environment) a user install's hooks fire
    too: no second briefing, no second record (the daemon records the run from its stream) — for every
    agent's hooks, Claude Code's and Codex's as well as Gemini CLI's and OpenCode's."""
    config = write_config(tmp_path, f'[harness.coder]\nharness = "{agent}"\n')
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path), "MEMACTORS_RUN_ID": "r-1"}
    session = tmp_path / "session.jsonl"
    session.write_text("\n".join(gemini_lines()) + "\n", encoding="utf-8")
    end = {"session_id": "s-1", "transcript_path": str(session), "cwd": str(tmp_path), "directory": str(tmp_path),
           "parts": [{"type": "text", "text": "done"}]}
    for event, stdin in (("session-start", {"source": "startup"}), ("session-end", end)):
        where = ["--user"] if event == "session-start" else []
        done = subprocess.run([sys.executable, "-m", "memactors.cli", "hook", agent, event, "--harness", "coder",
                               *where], input=json.dumps(stdin), env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert (done.returncode, done.stdout) == (0, ""), done.stderr
    state = tmp_path / "state"
    assert not (state / "session-spool.jsonl").exists() and not (state / "session-start-failures.jsonl").exists()
