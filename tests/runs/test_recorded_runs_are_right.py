"""What a run's episode records is what happened: a file the command adapter's agent created in a new
untracked directory is among its files touched (git names only the directory without `-uall`), and a
cost is kept at the providers' precision, never with the float artefacts of summing step costs. The
daemon as a process, `memactors run` and `runs ingest` through the CLI as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fix_daemon import Daemon, daemon_process
from support import run_record, write_config
from support_runs import make_repo

pytestmark = pytest.mark.slow


def cli(daemon: Daemon, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                          text=True, check=False, timeout=300, input=stdin)


def test_a_file_in_a_new_untracked_directory_is_among_the_runs_files_touched(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    command = "sh -c 'mkdir -p notes/deep && printf ok > notes/ledger.md && printf ok > notes/deep/more.md' {prompt}"
    config = write_config(tmp_path, f'[harness.scribe]\nharness = "command"\nworkdir = "{repo}"\n'
                                    f'command = "{command}"\nprompt = "write notes"\n')
    with daemon_process(tmp_path, config=config) as daemon:
        done = cli(daemon, "run", "scribe", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        episode_id = json.loads(done.stdout)["episode_id"]
        episode = json.loads(cli(daemon, "memory", "episodes", episode_id, "--json").stdout)["episode"]
    assert episode["files_touched"] == ["notes/deep/more.md", "notes/ledger.md"]


def test_a_summed_cost_is_kept_at_the_providers_precision(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[harness.api-fixer]\nharness = "claude-code"\n')
    summed = 0.0016 * 3
    assert repr(summed) == "0.0048000000000000004"  # what summing three step costs gives
    with daemon_process(tmp_path, config=config) as daemon:
        done = cli(daemon, "runs", "ingest", "-", "--json",
                   stdin=json.dumps(run_record(cost_usd=summed, cost_source="reported")) + "\n")
        assert done.returncode == 0, done.stderr
        listed = json.loads(cli(daemon, "memory", "episodes", "--json").stdout)["episodes"]
        [episode] = [json.loads(cli(daemon, "memory", "episodes", e["episode_id"], "--json").stdout)["episode"]
                     for e in listed]
    assert episode["cost_usd"] == 0.0048 and repr(episode["cost_usd"]) == "0.0048"
