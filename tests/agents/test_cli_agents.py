"""Residents: `memactors token mint`, `memactors mcp-config` and `memactors hook claude-code session-end`,
run as subprocesses against the daemon as a process (REQ-15: nothing is typed into a resident)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import mcp
import mcp.types as t
import pytest
from mcp.client.streamable_http import streamable_http_client

from fix_agents import git_repo, transcript_in
from fix_daemon import Daemon
from memactors.agents.transcript import read_claude_transcript, run_record_from_transcript
from memactors.cli.agents import client_config

DATA = Path(__file__).resolve().parents[1] / "data"
HARNESS = '[harness.coder]\nharness = "claude-code"\n'
SECRETS = ("SECRET-PROMPT", "SECRET-THINKING", "SECRET-QUERY", "SECRET-RECALL", "SECRET-OLD", "SECRET-NEW",
           "SECRET-CONTENT", "SECRET-OUTPUT")


async def call_briefing(config: dict[str, object]) -> t.CallToolResult:
    """Connect as the pasted client configuration says (URL and headers) and call the briefing tool."""
    server = config["mcpServers"]["memactors"]  # type: ignore[index]
    async with httpx2.AsyncClient(headers=server["headers"], timeout=None) as http, \
            mcp.Client(streamable_http_client(server["url"], http_client=http)) as client:
        return await client.call_tool("briefing", {})


# -- token mint and mcp-config --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.req15
async def test_mcp_config_prints_a_claude_code_mcp_json_whose_token_the_gateway_attributes_to_the_run(
        daemon: Daemon, tmp_path: Path) -> None:
    done = await daemon.acli("mcp-config", "coder", "--run", "resident-1", "--ttl", "2h", "--workdir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    server = config["mcpServers"]["memactors"]
    assert server["type"] == "http" and server["url"] == daemon.gateway
    assert server["headers"]["Authorization"].startswith("Bearer ")
    result = await call_briefing(config)
    assert not result.is_error  # an unattributed caller is refused not_attributed
    token = server["headers"]["Authorization"].removeprefix("Bearer ")
    # the daemon's gateway refuses a token that is not a live run token, before MCP, with 401
    async with httpx2.AsyncClient(timeout=None) as http:
        refused = await http.post(server["url"], json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={
            "authorization": f"Bearer {token[:-4]}xxxx", "accept": "application/json, text/event-stream"})
    assert refused.status_code == 401 and refused.json()["error"] == "invalid_token"
    log = daemon.log.read_text(encoding="utf-8")
    assert "gateway refused" in log and token not in log and token[:-4] not in log


@pytest.mark.slow
def test_token_mint_prints_the_token_alone_and_json_names_run_expiry_and_gateway(daemon: Daemon) -> None:
    plain = daemon.cli("token", "mint", "coder")
    assert plain.returncode == 0, plain.stderr
    token = plain.stdout.strip()
    assert len(token) >= 40 and "\n" not in token
    assert "run resident-" in plain.stderr and "expires 20" in plain.stderr  # the default run id and 7d expiry
    described = daemon.cli("token", "mint", "coder", "--run", "r-9", "--ttl", "30m", "--json")
    assert described.returncode == 0, described.stderr
    minted = json.loads(described.stdout)
    assert minted["harness"] == "coder" and minted["run_id"] == "r-9" and minted["gateway"] == daemon.gateway
    assert minted["expires_at"].endswith("Z") and minted["token"] != token


@pytest.mark.slow
def test_token_mint_refuses_an_unconfigured_harness_and_a_bad_ttl_naming_them(daemon: Daemon) -> None:
    unknown = daemon.cli("token", "mint", "nobody")
    assert unknown.returncode == 5 and "harness.nobody" in unknown.stderr and "coder" in unknown.stderr
    bad = daemon.cli("mcp-config", "coder", "--ttl", "soon")
    assert bad.returncode == 5 and '"soon"' in bad.stderr and bad.stdout == ""
    too_long = daemon.cli("token", "mint", "coder", "--ttl", "400d")
    assert too_long.returncode == 5 and "ttl_seconds" in too_long.stderr


def test_client_config_formats_for_claude_code_cursor_and_plain_json() -> None:
    kw = {"url": "http://127.0.0.1:7/mcp", "token": "tok", "harness": "coder", "run_id": "r", "expires_at": None}
    auth = {"Authorization": "Bearer tok"}
    assert client_config("claude-code", **kw) == {  # type: ignore[arg-type]
        "mcpServers": {"memactors": {"type": "http", "url": "http://127.0.0.1:7/mcp", "headers": auth}}}
    assert client_config("cursor", **kw) == {  # type: ignore[arg-type]
        "mcpServers": {"memactors": {"url": "http://127.0.0.1:7/mcp", "headers": auth}}}
    plain = client_config("json", **kw)  # type: ignore[arg-type]
    assert plain["url"] == "http://127.0.0.1:7/mcp" and plain["headers"] == auth and plain["run_id"] == "r"


# -- the Claude Code transcript -------------------------------------------------------------------------

def test_a_claude_code_transcript_yields_edits_verifies_model_and_the_last_answer() -> None:
    with (DATA / "claude_transcript_session.jsonl").open(encoding="utf-8") as f:
        session = read_claude_transcript(f)
    assert session.session_id == "5a0ddcd0-5487-4794-99ac-143f6bb9e248"
    assert session.cwd == "{CWD}" and session.git_branch == "fix/flaky"
    assert (session.started_at, session.ended_at) == ("2026-11-30T10:00:00.000Z", "2026-11-30T10:04:01.000Z")
    assert session.model == "claude-sonnet-4-5"
    # the failed Edit of missing.py wrote nothing; `git status` is no verify command
    assert [e.path for e in session.edits] == ["{CWD}/ledger.py", "{CWD}/notes/clock.md"]
    assert [(v.command, v.ok) for v in session.verifies] == [("python -m pytest -q test_ledger.py", False)]
    assert session.result_text == "Pinned the clock in ledger.py; test_reconcile still fails under the fake clock."
    assert session.unparsed == 1 and session.tool_calls == 6  # the api-request-blob replay is not counted
    assert session.cost_usd == 0.0421
    assert not any(secret in repr(session) for secret in SECRETS)


def test_the_run_record_from_a_transcript_is_a_failed_verify_with_no_prompt() -> None:
    with (DATA / "claude_transcript_session.jsonl").open(encoding="utf-8") as f:
        session = read_claude_transcript(f)
    record = run_record_from_transcript(session, harness="coder", fallback_session_id="x", fallback_cwd="/x",
                                        ended_at="2026-11-30T11:00:00.000000Z")
    assert record["run_id"] == session.session_id and record["adapter"] == "claude-code"
    assert (record["outcome"], record["reason"]) == ("failed", "verify_failed")
    assert record["trigger"] == {"source": "manual", "name": "session-end"} and record["prompt"] is None
    assert (record["cost_usd"], record["cost_source"]) == (0.0421, "reported")
    assert [e["kind"] for e in record["events"]] == ["edit", "edit", "verify"]
    assert record["events"][-1]["error_class"] == "test_failure"
    empty = run_record_from_transcript(read_claude_transcript([]), harness="coder", fallback_session_id="s-0",
                                       fallback_cwd="/w", ended_at="2026-11-30T11:00:00.000000Z")
    assert empty["run_id"] == "s-0" and empty["sessions"][0]["cwd"] == "/w"
    assert (empty["outcome"], empty["started_at"]) == ("succeeded", "2026-11-30T11:00:00.000000Z")
    assert (empty["cost_usd"], empty["cost_source"]) == (None, "unknown")


@pytest.mark.slow
@pytest.mark.req15
def test_session_end_hook_ingests_the_resident_session_as_an_episode(daemon: Daemon, tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    transcript = transcript_in(repo, tmp_path)
    hook = {"session_id": "5a0ddcd0-5487-4794-99ac-143f6bb9e248", "transcript_path": str(transcript),
            "cwd": str(repo), "hook_event_name": "SessionEnd", "reason": "prompt_input_exit"}
    done = daemon.cli("hook", "claude-code", "session-end", "--harness", "coder", "--json", stdin=json.dumps(hook))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["episode_id"].startswith("ep_"), result
    shown = daemon.cli("memory", "episodes", result["episode_id"], "--json")
    assert shown.returncode == 0, shown.stderr
    episode = json.loads(shown.stdout)["episode"]
    assert episode["run_id"] == hook["session_id"] and episode["harness"] == "coder"
    assert episode["repo"] == "forge.example/acme/ledger" and episode["branch"] == "fix/flaky"
    assert episode["files_touched"] == ["ledger.py", "notes/clock.md"]
    assert episode["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
    assert episode["outcome"] == "failed"
    # nothing the session said or ran is stored: not the prompt, tool inputs, outputs or thinking
    stored = b"".join(p.read_bytes() for p in daemon.state.rglob("*") if p.is_file())
    assert not any(secret.encode() in stored for secret in SECRETS)


@pytest.mark.slow
def test_session_end_hook_names_what_is_missing(daemon: Daemon, tmp_path: Path) -> None:
    no_harness = daemon.cli("hook", "claude-code", "session-end", stdin="{}")
    assert no_harness.returncode == 5 and "--harness" in no_harness.stderr
    unknown = daemon.cli("hook", "claude-code", "session-end", "--harness", "nobody", stdin="{}")
    assert unknown.returncode == 5 and "harness.nobody" in unknown.stderr
    not_json = daemon.cli("hook", "claude-code", "session-end", "--harness", "coder", stdin="session please")
    assert not_json.returncode == 5 and "not JSON" in not_json.stderr
    no_path = daemon.cli("hook", "claude-code", "session-end", "--harness", "coder",
                         stdin=json.dumps({"session_id": "s"}))
    assert no_path.returncode == 5 and "transcript_path" in no_path.stderr
    gone = daemon.cli("hook", "claude-code", "session-end", "--harness", "coder",
                      stdin=json.dumps({"session_id": "s", "transcript_path": str(tmp_path / "nope.jsonl")}))
    assert gone.returncode == 5 and "transcript_path" in gone.stderr
