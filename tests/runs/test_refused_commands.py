"""A shell command the agent CLI refused to run is not a verify event: a verify event needs an exit status.

The data files are what the real Claude Code 2.1 wrote for one scripted session (against the loopback
Anthropic fake, only ``Bash(python3 -m pytest:*)`` allowed): ``python3 -m pytest -q && rm -rf build``
(refused: the ``rm`` needs approval), ``python3 -m pytest -q`` (passes), ``python3 -m pytest -q
test_missing.py`` (runs, exits 4). ``claude_stream_refused_bash.jsonl`` is its ``-p --output-format
stream-json --verbose`` output, as ``memactors run`` reads it; ``claude_transcript_refused_bash.jsonl``
is the session's transcript, as the ``SessionEnd`` hook reads it (its user, assistant and cost-state
entries; the request replays Claude Code also writes there were dropped for size, and the reader skips
them anyway). The refused call is ``is_error: true`` like the failing one, but carries no ``Exit code N``
and is marked as not run: a ``permission_denied`` event and ``non_execution_kind`` in the stream,
``toolDenialKind`` in the transcript.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fix_daemon import serving_env as daemon
from memactors.adapters import CommandRun
from memactors.adapters.claude_code import ClaudeCodeAdapter
from memactors.agents.run_record import build_run_record
from memactors.agents.transcript import read_claude_transcript, run_record_from_transcript
from memactors.config import HarnessConfig
from memactors.testing.fake_anthropic import Script, Text, ToolUse, run_fake_anthropic
from support import write_config
from support_runs import base_env, claude_binary, claude_env, cli, make_repo

DATA = Path(__file__).resolve().parents[1] / "data"
AT = "2026-12-01T10:00:00.000000Z"
REFUSED = "python3 -m pytest -q && rm -rf build"


def stream_lines(keep: set[str] | None = None) -> list[str]:
    """The recorded stream; with ``keep``, only the tool calls with those ids (and every other event)."""
    lines = (DATA / "claude_stream_refused_bash.jsonl").read_text(encoding="utf-8").splitlines()
    if keep is None:
        return lines
    out = []
    for line in lines:
        event = json.loads(line)
        message = event.get("message") if isinstance(event.get("message"), dict) else {}
        ids = {b.get("id") or b.get("tool_use_id") for b in message.get("content", []) if isinstance(b, dict)}
        ids = (ids | {event.get("tool_use_id")}) - {None}
        if not ids or ids & keep:
            out.append(line)
    return out


def record_of(lines: list[str]) -> dict[str, object]:
    parser = ClaudeCodeAdapter().parser()
    for line in lines:
        parser.feed(line, at=AT)
    return build_run_record(
        harness="h", adapter="claude-code", run_id="r1", cfg=HarnessConfig(name="h", harness="claude-code",
                                                                           origin="global"),
        transcript=parser.transcript, exit_code=0, stopped=None, spawn_error=False, started_at=AT, ended_at=AT,
        duration_ms=1, workdir="/tmp/exp_runs/rec", repo_key="forge.example/acme/api", toplevel="/tmp/exp_runs/rec",
        branch="main", changed=set())


def test_the_stream_parser_gives_a_refused_bash_call_no_exit_status() -> None:
    parser = ClaudeCodeAdapter().parser()
    for line in stream_lines():
        parser.feed(line, at=AT)
    assert parser.transcript.commands == [
        CommandRun(REFUSED, None, AT),                                  # refused: never ran
        CommandRun("python3 -m pytest -q", 0, AT),                      # passed
        CommandRun("python3 -m pytest -q test_missing.py", 4, AT),      # ran and failed: "Exit code 4"
    ]


def test_a_refused_test_command_is_no_verify_event_in_a_runs_record() -> None:
    record = record_of(stream_lines())
    assert [(e["ok"], e["error_class"]) for e in record["events"] if e["kind"] == "verify"] == [  # type: ignore[attr-defined,index]
        (True, None), (False, "test_failure")]


def test_a_run_whose_only_test_command_was_refused_did_not_fail_a_test() -> None:
    record = record_of(stream_lines(keep={"toolu_fake_00"}))
    assert [e for e in record["events"] if e["kind"] == "verify"] == []  # type: ignore[attr-defined,index]
    assert (record["outcome"], record["reason"]) == ("succeeded", "completed")


def test_the_session_transcript_gives_a_refused_bash_call_no_verify_event() -> None:
    lines = (DATA / "claude_transcript_refused_bash.jsonl").read_text(encoding="utf-8").splitlines()
    session = read_claude_transcript(lines)
    assert [(v.command, v.ok) for v in session.verifies] == [
        ("python3 -m pytest -q", True), ("python3 -m pytest -q test_missing.py", False)]
    refused_only = [line for line in lines if "toolu_fake_01" not in line and "toolu_fake_02" not in line]
    record = run_record_from_transcript(read_claude_transcript(refused_only), harness="coder",
                                        fallback_session_id="s", fallback_cwd="/w", ended_at=AT)
    assert [e for e in record["events"] if e["kind"] == "verify"] == []
    assert (record["outcome"], record["reason"]) == ("succeeded", "completed")


@pytest.mark.slow
async def test_a_refused_bash_call_gives_no_verify_failure_through_memactors_run_and_the_hook(
        tmp_path: Path) -> None:
    """The real claude refuses a test command (its `rm` needs approval): the run is not verify_failed,
    and the episode has no verify failure. The same session's transcript through the SessionEnd hook
    counts only the test that really ran and failed."""
    claude = claude_binary()
    repo = make_repo(tmp_path / "api")
    script = Script((ToolUse("Bash", {"command": REFUSED, "description": "Run the tests, then clean"}),
                     Text("I was not allowed to run that.")))
    config = write_config(tmp_path, f"""
[harness.careful]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt = "Run the tests."
allowed_tools = ["Bash(python3 -m pytest:*)"]
""")
    async with run_fake_anthropic(script) as fake:
        env = claude_env(tmp_path, config, fake.base_url)
        with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
            done = await cli(env, "run", "careful", "--wait", "--json")
            assert done.returncode == 0, done.stdout + done.stderr  # succeeded: nothing failed
            run = json.loads(done.stdout)
            episode = json.loads((await cli(env, "memory", "episodes", run["episode_id"], "--json")).stdout)["episode"]
            assert episode["verify_failures"] == []
            assert (episode["outcome"], episode["reason"]) == ("succeeded", "completed")

            transcript = tmp_path / "session.jsonl"
            transcript.write_text((DATA / "claude_transcript_refused_bash.jsonl").read_text(encoding="utf-8")
                                  .replace("/tmp/exp_runs/rec", str(repo)), encoding="utf-8")
            hook = {"session_id": "d4eaa1ab-2471-4c94-9e3e-16a6b68e53b7", "transcript_path": str(transcript),
                    "cwd": str(repo), "hook_event_name": "SessionEnd", "reason": "other"}
            hooked = await cli(base_env(tmp_path, config), "hook", "claude-code", "session-end", "--harness",
                               "careful", "--json", stdin=json.dumps(hook).encode())
            assert hooked.returncode == 0, hooked.stderr
            shown = await cli(env, "memory", "episodes", json.loads(hooked.stdout)["episode_id"], "--json")
            resident = json.loads(shown.stdout)["episode"]
    assert resident["verify_failures"] == [{"error_class": "test_failure", "count": 1}]  # test_missing.py only
