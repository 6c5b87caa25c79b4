"""One briefing a session. An agent installed both for the user and in a project runs both
session-start hooks in that project (the agents merge user and project hooks); the project's, the more
specific, briefs the session and the user's stays silent — and asks nothing of the gateway. Outside the
project the user's hook asks. The CLI as a subprocess against the daemon as a process, every agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fix_agents import git_repo
from fix_daemon import Daemon, daemon_process
from support import run_record

pytestmark = pytest.mark.slow

AGENTS = ("claude-code", "codex", "gemini-cli", "opencode")
HARNESS = "".join(f'[harness.{a.replace("-", "")}]\nharness = "{a}"\nmemory_briefing = true\n' for a in AGENTS)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with daemon_process(tmp_path_factory.mktemp("daemon"), HARNESS) as running:
        records = "".join(json.dumps(run_record(
            harness="claudecode", run_id=f"seed-{name}", result_text=f"fixed the {name} rounding: invoice totals are now summed in integer cents "
                        "before the ledger reconciles them",
            sessions=[{"session_id": "s1", "cwd": f"/srv/{name}", "repo": f"forge.example/acme/{name}",
                       "git_branch": "fix/flaky"}])) + "\n" for name in ("ledger", "other"))
        done = memactors(running, "runs", "ingest", "-", home=Path(running.env["HOME"]), stdin=records)
        assert done.returncode == 0, done.stderr
        yield running


def memactors(daemon: Daemon, *args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**daemon.env, "HOME": str(home)}
    for name in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "MEMACTORS_RUN_ID"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False, input=stdin)


@pytest.mark.parametrize("agent", AGENTS)
def test_a_user_and_a_project_install_brief_a_project_session_once(
        daemon: Daemon, tmp_path: Path, agent: str) -> None:
    harness = agent.replace("-", "")
    home = tmp_path / "home"
    home.mkdir()
    project = git_repo(home / "src" / "ledger")
    (project / "pkg").mkdir()
    elsewhere = git_repo(home / "src" / "other", remote="git@forge.example:acme/other.git")
    for where in (["--user"], ["--project", str(project)]):
        done = memactors(daemon, "install", agent, "--briefing-at-start", "--harness", harness, *where, home=home)
        assert done.returncode == 0, done.stderr

    def start(where: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        hook = json.dumps({"session_id": "s-1", "source": "startup", "cwd": str(cwd), "hook_event_name": "SessionStart"})
        return memactors(daemon, "hook", agent, "session-start", "--harness", harness, *where, home=home, stdin=hook)

    in_project = start(["--project", str(project)], project / "pkg")
    assert in_project.returncode == 0 and "memory-data" in in_project.stdout, in_project.stderr
    user_in_project = start(["--user"], project / "pkg")
    assert (user_in_project.returncode, user_in_project.stdout, user_in_project.stderr) == (0, "", "")
    user_elsewhere = start(["--user"], elsewhere)
    assert (user_elsewhere.returncode, user_elsewhere.stderr) == (0, "")
    assert "fixed the ledger rounding" in in_project.stdout
    # The gateway served this harness two briefings: the project hook's and the user hook's outside the
    # project (a user token has no place of its own, so that one is empty); none for the user hook in
    # the project, which never asked.
    deadline = time.monotonic() + 60  # a hang guard: the log line is written as the answer goes out
    while served(daemon, harness) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # ok: a plain test thread polling a log file
    assert served(daemon, harness) == 2


def served(daemon: Daemon, harness: str) -> int:
    return sum("briefing served" in line and f"harness={harness} " in line
               for line in daemon.log.read_text(encoding="utf-8").splitlines())
