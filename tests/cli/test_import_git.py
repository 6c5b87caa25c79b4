"""`memactors import git`: a repository's real history, made with git in the test, imported
into a real daemon through the CLI as a user runs it, then `memory recall` and `memory briefing` answer
from it; a second import adds nothing; `--dry-run` sends nothing; the records go through the daemon's
own redaction."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fix_daemon import Daemon, daemon_process
from support import write_config
from support_runs import HISTORY, KEY, TOKEN, make_history

pytestmark = pytest.mark.slow



def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                          text=True, check=False, timeout=300)


def cli_json(daemon: Daemon, *args: str) -> dict:
    done = cli(daemon, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.req5
@pytest.mark.req6
def test_import_git_history_recalls_and_briefs_and_twice_adds_nothing(tmp_path: Path) -> None:
    repo = make_history(tmp_path / "api")
    config = write_config(tmp_path, f'[harness.api-fixer]\nharness = "command"\ncommand = "true"\nworkdir = "{repo}"\n')
    with daemon_process(tmp_path, config=config) as daemon:
        dry = cli_json(daemon, "import", "git", "--repo", str(repo), "--dry-run")
        assert dry["records"] == 5 and dry["dry_run"] and dry["repo"] == KEY and dry["branch"] == "main"
        assert cli_json(daemon, "memory", "episodes")["total"] == 0  # a dry run sends nothing

        first = cli_json(daemon, "import", "git", "--repo", str(repo))
        assert first["outcomes"]["recorded"] + first["outcomes"]["queued"] == 5, first
        assert first["outcomes"]["rejected"] == 0 and first["repo"] == KEY
        # the rate it went at, in the summary: records over the seconds they took
        assert first["records_per_s"] == pytest.approx(5 / first["seconds"], rel=0.05)
        listed = cli_json(daemon, "memory", "episodes", "--repo", KEY)
        assert listed["total"] == 5
        assert {e["harness"] for e in listed["episodes"]} == {"imported"}
        assert {e["started_at"] for e in listed["episodes"]} >= {"2026-03-05T19:30:00Z", "2026-03-02T08:00:00Z"}

        recall = cli_json(daemon, "memory", "recall", "ledger rounding quantize", "--repo", KEY)
        texts = [e["text"] for e in recall["episodes"]]
        assert any("Round ledger totals with Decimal quantize" in t for t in texts), texts
        hit = next(e for e in recall["episodes"] if "quantize" in e["text"])
        assert "test_ledger.py" in hit["text"] and hit["adapter"] == "git"
        assert "pat@example.invalid" not in recall["document"]  # the trailer naming a person is not kept

        webhook = cli_json(daemon, "memory", "recall", "webhook retry clock", "--repo", KEY)
        assert any("webhook retry clock" in e["text"] for e in webhook["episodes"]), webhook["document"]
        assert TOKEN not in webhook["document"] and "[REDACTED]" in webhook["document"]

        briefing = cli(daemon, "memory", "briefing", "api-fixer")
        assert briefing.returncode == 0, briefing.stderr
        episodes = briefing.stdout.split("## episodes", 1)[1]
        assert "harness imported" in episodes, briefing.stdout
        assert any(message.split("\n")[0] in episodes for message, _, _ in HISTORY), briefing.stdout

        text = cli(daemon, "import", "git", "--repo", str(repo))
        assert text.returncode == 0 and re.search(r"^5 record\(s\) in [0-9.]+ s: [0-9]+ records/s$",
                                                  text.stderr, re.M), text.stderr
        second = cli(daemon, "import", "git", "--repo", str(repo), "--json")
        assert second.returncode == 0, second.stderr
        again = json.loads(second.stdout)
        assert again["outcomes"]["duplicate"] == 5 and again["outcomes"]["recorded"] == 0, again
        assert sorted(again["episode_ids"]) == sorted(first["episode_ids"])  # the same episode ids
        assert cli_json(daemon, "memory", "episodes")["total"] == 5
        log = daemon.log_text()
    assert TOKEN not in log


def test_import_git_since_and_bad_repo(tmp_path: Path) -> None:
    """--since keeps the commits authored since then; a directory that is no repository is one line,
    exit 5, and nothing is sent."""
    repo = make_history(tmp_path / "api")
    env = {**os.environ, "HARNESS_CONFIG": str(write_config(tmp_path)), "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memactors.cli", "import", "git", *args], env=env,
                              capture_output=True, text=True, check=False, timeout=120)

    done = run("--repo", str(repo), "--since", "2026-04-01T00:00:00Z", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["records"] == 3  # the webhook, the exports and the side commit
    (tmp_path / "plain").mkdir()
    bad = run("--repo", str(tmp_path / "plain"))
    assert bad.returncode == 5 and "not a git repository" in bad.stderr and "Traceback" not in bad.stderr
