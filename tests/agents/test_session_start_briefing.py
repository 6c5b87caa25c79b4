"""The briefing at session start, pulled by the agent. `memactors install claude-code` adds a
SessionStart hook that asks the gateway for this resident's briefing with its token and prints it fenced as
`additionalContext`; the real Claude Code CLI (headless `-p`) against the loopback fake Anthropic API sends it
in the session's context. With the daemon down the session starts at once with nothing, and doctor counts it.
The daemon as a process, the CLI as a subprocess."""

from __future__ import annotations

import json
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from fix_agents import claude_bin, claude_env, claude_p
from fix_daemon import daemon_process
from memactors.agents.session_start import recent_failures, record_failure
from memactors.doctor import doctor_rows
from memactors.testing.fake_anthropic import Script, Text, run_fake_anthropic
from support_runs import REPO_KEY, make_repo

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "claude-code"\n'
FACT = "ledger amounts round with Decimal, never float"


async def test_an_installed_claude_code_session_starts_with_its_briefing_in_context(tmp_path: Path) -> None:
    claude = claude_bin()
    repo = make_repo(tmp_path / "api")
    home = tmp_path / "home"
    home.mkdir()
    async with run_fake_anthropic(Script(turns=(Text("Noted."),))) as fake:
        with daemon_process(tmp_path, HARNESS) as daemon:
            fact = await daemon.acli("facts", "add", FACT, "--scope", f"project:{REPO_KEY}", "--confidence", "0.9")
            assert fact.returncode == 0, fact.stderr
            installed = await trio.run_process(
                [sys.executable, "-m", "memactors.cli", "install", "claude-code", "--briefing-at-start", "--harness", "coder", "--project",
                 str(repo)], env={**daemon.env, "HOME": str(home)}, capture_stdout=True, capture_stderr=True,
                check=False)
            assert installed.returncode == 0, installed.stderr.decode()
            settings = json.loads((repo / ".claude" / "settings.local.json").read_text(encoding="utf-8"))
            [group] = settings["hooks"]["SessionStart"]
            assert "hook claude-code session-start" in group["hooks"][0]["command"]
            assert "Bearer" not in group["hooks"][0]["command"]  # the token is read from the file, not argv
            await claude_p(claude, "Say hello.", cwd=repo, env=claude_env(home, daemon.env, fake.base_url))
            doctor = await daemon.acli("doctor", "--json")
    db = sqlite3.connect(daemon.state / "memactors.db")
    try:
        exposed = db.execute("SELECT harness, surface FROM exposures").fetchall()
        calls = db.execute("SELECT tool FROM call_log WHERE server = 'gateway'").fetchall()
    finally:
        db.close()
    # the model saw the briefing, fenced, in the session's context before the user's prompt was answered
    first = json.dumps(fake.agent_requests()[0].body)
    assert FACT in first
    assert 'source=\\"harness-memory\\" field=\\"briefing\\"' in first
    # pulled through the gateway as the resident: one briefing call, the fact's exposure written (REQ-17)
    assert calls == [("briefing",)]
    assert exposed and all(h == "coder" for h, _ in exposed)
    assert "resident session start" not in doctor.stdout


async def test_with_the_daemon_down_the_session_starts_at_once_and_doctor_counts_it(tmp_path: Path) -> None:
    claude = claude_bin()
    repo = make_repo(tmp_path / "api")
    home = tmp_path / "home"
    home.mkdir()
    with daemon_process(tmp_path, HARNESS) as daemon:
        installed = await daemon.acli("install", "claude-code", "--briefing-at-start", "--harness", "coder", "--project", str(repo))
        assert installed.returncode == 0, installed.stderr
        env = daemon.env
    # the daemon is down: the hook gives up on the gateway, prints nothing, and the session runs
    async with run_fake_anthropic(Script(turns=(Text("Offline."),))) as fake:
        events = await claude_p(claude, "Say hello.", cwd=repo, env=claude_env(home, env, fake.base_url))
    assert any(e.get("type") == "result" and e.get("result") == "Offline." for e in events)
    assert "harness-memory" not in json.dumps(fake.agent_requests()[0].body)
    failures = (daemon.state / "session-start-failures.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(failures) == 1 and json.loads(failures[0])["harness"] == "coder"
    with daemon_process(tmp_path, HARNESS) as restarted:
        doctor = await restarted.acli("doctor", "--json")
    [row] = [r for r in json.loads(doctor.stdout)["rows"] if r["name"] == "resident session start"]
    assert row["status"] == "warn" and row["message"].startswith("1 resident sessions started without")


def test_doctor_counts_only_the_last_24_hours_of_session_start_failures(tmp_path: Path) -> None:
    record_failure(tmp_path, at="2026-12-01T08:00:00Z", harness="old", error="down")
    record_failure(tmp_path, at="2026-12-02T07:00:00Z", harness="coder", error="no answer within 3 s")
    with (tmp_path / "session-start-failures.jsonl").open("a", encoding="utf-8") as f:
        f.write("not json\n")
    seen = recent_failures(tmp_path, datetime(2026, 12, 2, 9, 0, tzinfo=UTC))
    assert seen == {"count": 1, "last_at": "2026-12-02T07:00:00Z", "last_error": "no answer within 3 s",
                    "harnesses": ["coder"]}
    assert recent_failures(tmp_path / "none", datetime(2026, 12, 2, tzinfo=UTC))["count"] == 0
    from memactors.config import Config

    status = {"provider": "builtin", "state": "ready", "transport": "builtin", "contract": 1, "breaker": "closed"}
    rows = {r.name: r for r in doctor_rows(Config(), status, oldest_pending_seconds={}, degraded_recalls_24h=0,
                                           episodes_missing_vectors=0, session_start=seen)}
    assert rows["resident session start"].status == "warn" and "no answer within 3 s" in rows[
        "resident session start"].message
