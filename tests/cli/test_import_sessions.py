"""`memactors import claude-code` and `import codex`: past sessions, in the files the agents
themselves write, into a real daemon through the CLI as a subprocess. A Claude Code transcript in its
real format (the recorded fixture, with an edit outside the repository added); a Codex rollout written
by the real `codex exec` against the loopback Responses fake; a corrupt file of each named and skipped
while the rest go in; a session outside any repository left out; never a prompt, tool argument or tool
output in what the daemon keeps; a second import adds nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fix_agents import codex_bin, codex_env, fake_provider_args
from fix_daemon import Daemon, daemon_process
from memactors.testing.fake_openai import Message, PatchCall, ShellCall, Turn, run_fake_openai
from support import write_config
from support_runs import PYTEST, REPO_KEY, make_repo

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data"
SECRETS = ("SECRET-PROMPT", "SECRET-THINKING", "SECRET-QUERY", "SECRET-RECALL", "SECRET-OLD", "SECRET-NEW",
           "SECRET-CONTENT", "SECRET-OUTPUT")
SESSION = "5a0ddcd0-5487-4794-99ac-143f6bb9e248"


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                          text=True, check=False, timeout=300)


def claude_dir(tmp_path: Path, repo: Path) -> tuple[Path, Path]:
    """~/.claude/projects as Claude Code lays it out: the recorded transcript in the repository (plus a
    Write outside it), a session in a directory that is no repository, a corrupt file, a subagent's."""
    root = tmp_path / "claude" / "projects"
    project = root / str(repo).replace("/", "-")
    project.mkdir(parents=True)
    lines = (DATA / "claude_transcript_session.jsonl").read_text(encoding="utf-8").replace("{CWD}", str(repo)).splitlines()
    outside = tmp_path / "elsewhere" / "outside-notes.md"
    common = {"cwd": str(repo), "sessionId": SESSION, "gitBranch": "fix/flaky"}
    write = [{**common, "type": "assistant", "timestamp": "2026-11-30T10:03:30.000Z",
              "message": {"model": "claude-sonnet-4-5", "id": "msg_9", "role": "assistant", "content": [
                  {"type": "tool_use", "id": "toolu_09", "name": "Write",
                   "input": {"file_path": str(outside), "content": "SECRET-CONTENT"}}]}},
             {**common, "type": "user", "timestamp": "2026-11-30T10:03:31.000Z", "message": {"role": "user", "content": [
                 {"tool_use_id": "toolu_09", "type": "tool_result", "content": "File created successfully"}]}}]
    lines[-2:-2] = [json.dumps(w) for w in write]
    (project / f"{SESSION}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    subagents = project / SESSION / "subagents"
    subagents.mkdir(parents=True)
    (subagents / "agent-1.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plain = tmp_path / "scratch"
    plain.mkdir()
    elsewhere = root / str(plain).replace("/", "-")
    elsewhere.mkdir()
    (elsewhere / "0b6d0c7e-0000-4000-8000-000000000001.jsonl").write_text(
        "\n".join(line.replace(str(repo), str(plain)).replace(SESSION, "0b6d0c7e-0000-4000-8000-000000000001")
                  for line in lines) + "\n", encoding="utf-8")
    corrupt = project / "9f1c2d3e-0000-4000-8000-00000000dead.jsonl"
    corrupt.write_text(lines[2] + "\n" + "{not json at all\n" + lines[3] + "\n", encoding="utf-8")
    return root, corrupt


def stored(daemon: Daemon, table: str, column: str) -> list[str]:
    with sqlite3.connect(daemon.state / "memactors.db") as db:
        return [r[0] for r in db.execute(f"SELECT {column} FROM {table}")]  # noqa: S608


@pytest.mark.req5
@pytest.mark.req6
@pytest.mark.req8
def test_import_claude_code_sessions_skips_the_corrupt_one_keeps_nothing_outside_the_repo(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    root, corrupt = claude_dir(tmp_path, repo)
    config = write_config(tmp_path, f'[harness.coder]\nharness = "claude-code"\nworkdir = "{repo}"\n')
    with daemon_process(tmp_path, config=config) as daemon:
        done = cli(daemon, "import", "claude-code", "--dir", str(root), "--harness", "coder", "--json")
        assert done.returncode == 1, done.stderr  # a malformed file makes the exit 1; the rest went in
        summary = json.loads(done.stdout)
        assert summary["malformed"] == [{"file": str(corrupt), "error": "line 2 is not a JSON object"}]
        assert summary["left_out"] == {"no repository": 1}
        assert summary["records"] == 1 and summary["outcomes"]["rejected"] == 0
        assert summary["outcomes"]["recorded"] + summary["outcomes"]["queued"] == 1
        [episode_id] = summary["episode_ids"]
        shown = json.loads(cli(daemon, "memory", "episodes", episode_id, "--json").stdout)["episode"]
        assert (shown["harness"], shown["adapter"], shown["run_id"]) == ("coder", "claude-code", SESSION)
        assert shown["repo"] == REPO_KEY and shown["branch"] == "fix/flaky"
        assert shown["files_touched"] == ["ledger.py", "notes/clock.md"]
        assert shown["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
        assert "Pinned the clock in ledger.py" in shown["result_excerpt"]
        recall = cli(daemon, "memory", "recall", "pinned clock ledger", "--repo", REPO_KEY)
        assert episode_id in recall.stdout, recall.stdout
        human = cli(daemon, "import", "claude-code", "--dir", str(root), "--harness", "coder")
        assert human.returncode == 1
        assert f"malformed {corrupt}: line 2 is not a JSON object" in human.stderr
        assert "0 recorded, 1 duplicate" in human.stdout, human.stdout
        records = stored(daemon, "run_records", "record")
        log = daemon.log_text()
    assert len(records) == 1  # the second import added nothing
    assert "outside-notes.md" not in records[0] and "elsewhere" not in records[0]
    for secret in SECRETS:
        assert secret not in records[0] and secret not in log and secret not in recall.stdout


async def codex_session(tmp_path: Path, repo: Path) -> Path:
    """The real `codex exec` runs a test and writes a file against the fake; its rollout is the session."""
    script = [Turn([ShellCall(["bash", "-lc", f"{PYTEST} test_ledger.py"], timeout_ms=300_000)]),
              Turn([PatchCall("*** Begin Patch\n*** Add File: NOTES.md\n+rounding is binary floating point\n"
                              "*** End Patch\n")]),
              Turn([Message("Left NOTES.md; test_rounding still fails (2.675 is not representable).")])]
    home = tmp_path / "codex-home"
    async with run_fake_openai(script) as fake:
        argv = [str(codex_bin()), "exec", "--json", "--skip-git-repo-check", "-s", "workspace-write",
                *fake_provider_args(fake.base_url), "--", "SECRET-PROMPT fix the ledger rounding"]
        done = await trio.run_process(argv, cwd=repo, env=codex_env(home), stdin=b"", capture_stdout=True,
                                      capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    [rollout] = list((home / "sessions").rglob("rollout-*.jsonl"))
    assert "SECRET-PROMPT" in rollout.read_text(encoding="utf-8")  # the prompt is in the file: never sent
    return home / "sessions"


@pytest.mark.req5
@pytest.mark.req6
async def test_import_codex_rollouts_from_the_real_cli(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    sessions = await codex_session(tmp_path, repo)
    corrupt = sessions / "2026" / "01" / "02" / "rollout-2026-01-02T03-04-05-broken.jsonl"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b'{"timestamp": "2026-01-02T03:04:05Z", "type": "session_meta"}\n\xff\xfe garbage\n')
    with daemon_process(tmp_path, config=write_config(tmp_path)) as daemon:
        dry = cli(daemon, "import", "codex", "--dir", str(sessions), "--dry-run", "--json")
        assert json.loads(dry.stdout)["records"] == 1
        done = cli(daemon, "import", "codex", "--dir", str(sessions), "--json")
        assert done.returncode == 1, done.stderr
        summary = json.loads(done.stdout)
        assert [m["file"] for m in summary["malformed"]] == [str(corrupt)]
        assert "not UTF-8" in summary["malformed"][0]["error"]
        [episode_id] = summary["episode_ids"]
        shown = json.loads(cli(daemon, "memory", "episodes", episode_id, "--json").stdout)["episode"]
        again = json.loads(cli(daemon, "import", "codex", "--dir", str(sessions), "--json").stdout)
        records = stored(daemon, "run_records", "record")
        log = daemon.log_text()
    assert (shown["harness"], shown["adapter"]) == ("codex", "codex")
    assert shown["repo"] == REPO_KEY and shown["files_touched"] == ["NOTES.md"]
    assert shown["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
    assert "2.675 is not representable" in shown["result_excerpt"]
    assert again["outcomes"]["duplicate"] == 1 and again["episode_ids"] == [episode_id]
    assert len(records) == 1
    assert "SECRET-PROMPT" not in records[0] and "SECRET-PROMPT" not in log
    assert "-q test_ledger.py" not in records[0]  # the command (a tool argument) is not sent, only its verdict


def test_importing_a_session_the_resident_hook_recorded_adds_nothing_whatever_harness_it_names(
        tmp_path: Path) -> None:
    """A resident's SessionEnd hook recorded the session under the resident's harness; `import claude-code`
    without --harness (harness `claude-code`) finds the same session by its id and adds nothing. The hook's
    record carries the session's real duration, from the transcript's first to its last entry."""
    repo = make_repo(tmp_path / "api")
    root, _ = claude_dir(tmp_path, repo)
    transcript = next(root.rglob(f"{SESSION}.jsonl"))
    config = write_config(tmp_path, '[harness.coder]\nharness = "claude-code"\n'
                                    '[harness.claude-code]\nharness = "claude-code"\n')
    with daemon_process(tmp_path, config=config) as daemon:
        hook = subprocess.run(
            [sys.executable, "-m", "memactors.cli", "hook", "claude-code", "session-end", "--harness", "coder"],
            env=daemon.env, input=json.dumps({"session_id": SESSION, "transcript_path": str(transcript),
                                              "cwd": str(repo), "hook_event_name": "SessionEnd"}),
            capture_output=True, text=True, check=False, timeout=120)
        assert hook.returncode == 0, hook.stderr
        listed = json.loads(cli(daemon, "memory", "episodes", "--harness", "coder", "--json").stdout)["episodes"]
        [episode] = [json.loads(cli(daemon, "memory", "episodes", e["episode_id"], "--json").stdout)["episode"]
                     for e in listed]
        done = cli(daemon, "import", "claude-code", "--dir", str(root), "--json")
        summary = json.loads(done.stdout)
        runs = stored(daemon, "runs", "harness")
    assert episode["run_id"] == SESSION
    assert episode["duration_ms"] == (4 * 60 + 1) * 1000  # 10:00:00.000 to 10:04:01.000
    assert summary["records"] == 1 and summary["outcomes"]["duplicate"] == 1, summary
    assert summary["outcomes"]["recorded"] + summary["outcomes"]["queued"] == 0
    assert runs == ["coder"]  # no second run under harness claude-code
