"""`memactors import claude-code` with one transcript whose timestamps no date can hold (a 30 February, a
time before year 1 in UTC): the good sessions beside it go in, the bad one is named and skipped, and the
summary counts it, with `--since` as without. The CLI as a subprocess against the daemon as a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fix_daemon import Daemon, daemon_process
from support import write_config
from support_runs import make_repo

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data"
SESSION = "5a0ddcd0-5487-4794-99ac-143f6bb9e248"


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                          text=True, check=False, timeout=300)


def transcript(path: Path, repo: Path, session: str, timestamp: str | None = None) -> Path:
    """The recorded Claude Code transcript in `repo` as session `session`, every timestamp `timestamp`."""
    out = []
    for line in (DATA / "claude_transcript_session.jsonl").read_text(encoding="utf-8").splitlines():
        line = line.replace("{CWD}", str(repo)).replace(SESSION, session)
        try:
            entry = json.loads(line)
        except ValueError:
            out.append(line)  # the fixture's own torn last line
            continue
        if timestamp is not None and "timestamp" in entry:
            entry["timestamp"] = timestamp
        out.append(json.dumps(entry))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("impossible", ["2026-02-30T10:00:00.000Z", "0001-01-01T00:00:00+01:00"])
def test_a_transcript_with_an_impossible_date_is_named_and_skipped_and_the_good_ones_go_in(
        tmp_path: Path, impossible: str) -> None:
    repo = make_repo(tmp_path / "api")
    root = tmp_path / "claude" / "projects"
    project = root / str(repo).replace("/", "-")
    good = [transcript(project / f"{n}.jsonl", repo, f"5a0ddcd0-5487-4794-99ac-00000000000{n}") for n in (1, 2)]
    bad = transcript(project / "3.jsonl", repo, "5a0ddcd0-5487-4794-99ac-000000000003", impossible)
    config = write_config(tmp_path, f'[harness.coder]\nharness = "claude-code"\nworkdir = "{repo}"\n')
    with daemon_process(tmp_path, config=config) as daemon:
        for since in ((), ("--since", "3650d")):
            done = cli(daemon, "import", "claude-code", "--dir", str(root), "--harness", "coder", "--json", *since)
            assert done.returncode == 1, done.stderr  # a file was skipped: it ran and reports a failure
            assert "Traceback" not in done.stderr
            summary = json.loads(done.stdout)
            assert [m["file"] for m in summary["malformed"]] == [str(bad)]
            assert "not a valid RFC 3339 time" in summary["malformed"][0]["error"]
            assert summary["records"] == len(good) and summary["outcomes"]["rejected"] == 0
        listed = json.loads(cli(daemon, "memory", "episodes", "--json").stdout)
        assert listed["total"] == len(good)
        human = cli(daemon, "import", "claude-code", "--dir", str(root), "--harness", "coder")
        assert f"malformed {bad}" in human.stderr and "1 malformed file(s) skipped" in human.stdout
