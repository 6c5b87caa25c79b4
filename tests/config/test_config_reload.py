"""The daemon (a process) reloads its configuration when harness.toml or a drop-in changes on disk
and on SIGHUP, keeping the last good configuration when an edit is broken (REQ-1) and saying so in doctor;
`memactors install` makes a daemon that does not know the harness yet reload (SIGHUP to its pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fix_agents import git_repo
from fix_daemon import Daemon, daemon_process

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "claude-code"\n'
NEW = '\n[harness.new]\nharness = "claude-code"\n'
#: Generous: the daemon looks at its files every second; a loaded machine (load ~10) is slow to answer.
PATIENCE = 90.0


def until(what: Callable[[], Any], why: str) -> Any:
    """Poll a state (a CLI answer) until it holds; fail naming it when it never does."""
    deadline = time.monotonic() + PATIENCE
    last = None
    while time.monotonic() < deadline:
        last = what()
        if last is not None:
            return last
        time.sleep(0.2)
    raise AssertionError(f"never: {why}")


def config_row(daemon: Daemon) -> dict[str, str]:
    done = daemon.cli("doctor", "--json")
    rows = [r for r in json.loads(done.stdout)["rows"] if r["name"] == "configuration"]
    assert rows, (done.stdout, done.stderr)
    return rows[0]


def warned(daemon: Daemon, needle: str) -> dict[str, str] | None:
    row = config_row(daemon)
    return row if row["status"] == "warn" and needle in row["message"] else None


def briefed(daemon: Daemon, harness: str) -> subprocess.CompletedProcess[str] | None:
    done = daemon.cli("memory", "briefing", harness)
    return done if done.returncode == 0 else None


def test_a_harness_added_while_the_daemon_runs_is_briefed_and_a_broken_edit_keeps_the_last_good(
        tmp_path: Path) -> None:
    with daemon_process(tmp_path, HARNESS) as daemon:
        config = Path(daemon.env["HARNESS_CONFIG"])
        before = daemon.cli("memory", "briefing", "new")
        assert before.returncode != 0 and "harness" in before.stderr  # not configured yet
        assert config_row(daemon)["status"] == "pass"
        good = config.read_text(encoding="utf-8") + NEW
        config.write_text(good, encoding="utf-8")
        # no restart, no signal: the daemon notices the edit
        until(lambda: briefed(daemon, "new"), "the new harness is briefed after the edit")
        # a broken edit (a drop-in that is not TOML): the daemon keeps the last good configuration, and
        # doctor says which file is wrong
        broken = config.parent / "harness_d" / "50-extra.toml"
        broken.write_text('[harness.extra\nharness = "codex"\n', encoding="utf-8")
        row = until(lambda: warned(daemon, "failed"), "doctor reports the failed reload")
        assert "failed" in row["message"] and str(broken) in row["message"] and "stays in force" in row["message"]
        assert str(config) in row["message"]  # where the configuration in force came from
        assert briefed(daemon, "new") is not None   # the last good configuration still serves it
        # an edit that is TOML but not a valid configuration: kept out the same way
        broken.write_text('[harness.extra]\nharness = "codex"\nmax_turns = 5\n', encoding="utf-8")
        until(lambda: warned(daemon, "max_turns"), "doctor names the second broken edit")
        assert daemon.cli("memory", "briefing", "extra").returncode != 0
        # fixed: the drop-in's harness is briefed
        broken.write_text('[harness.extra]\nharness = "codex"\n', encoding="utf-8")
        until(lambda: briefed(daemon, "extra"), "the drop-in's harness is briefed once the file is fixed")
        assert config_row(daemon)["status"] == "pass"
        log = daemon.log.read_text(encoding="utf-8")
    assert "keeping the last good configuration" in log
    assert "configuration files changed; reloading" in log


def test_install_makes_a_daemon_that_does_not_know_the_harness_reload_with_sighup(tmp_path: Path) -> None:
    env = {**os.environ, "MEMACTORS_CONFIG_POLL_SECONDS": "0"}  # no file watch: only SIGHUP can reload
    with daemon_process(tmp_path, HARNESS, env=env) as daemon:
        config = Path(daemon.env["HARNESS_CONFIG"])
        config.write_text(config.read_text(encoding="utf-8") + NEW, encoding="utf-8")
        repo = git_repo(tmp_path / "ledger")
        assert daemon.cli("memory", "briefing", "new").returncode != 0  # the daemon does not know it
        done = subprocess.run([sys.executable, "-m", "memactors.cli", "install", "claude-code", "--harness", "new",
                               "--project", str(repo)], env={**daemon.env, "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "sent it SIGHUP, and it reloaded" in done.stdout
        assert briefed(daemon, "new") is not None  # at once: install waited for the reload
        again = subprocess.run([sys.executable, "-m", "memactors.cli", "install", "claude-code", "--harness", "new",
                                "--project", str(repo), "--json"], env={**daemon.env, "HOME": str(tmp_path)},
                               capture_output=True, text=True, timeout=120, check=False)
        assert json.loads(again.stdout)["daemon_config"] == "known"


def test_the_holder_records_each_attempt_and_keeps_the_last_good(tmp_path: Path) -> None:
    from memactors.config import ConfigHolder, config_fingerprint, load_config

    path = tmp_path / "harness.toml"
    path.write_text(HARNESS, encoding="utf-8")
    holder = ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))
    assert holder.seen == config_fingerprint(path) and holder.state()["error"] is None
    (tmp_path / "harness_d").mkdir()
    assert config_fingerprint(path) != holder.seen  # a directory that appears is a change
    (tmp_path / "harness_d" / "x.toml").write_text("[harness.x\n", encoding="utf-8")
    with pytest.raises(Exception, match="x.toml"):
        holder.reload()
    assert holder.seen == config_fingerprint(path)  # the broken file is tried once, not at every look
    assert set(holder.current.harness) == {"coder"} and "x.toml" in holder.state()["error"]
    (tmp_path / "harness_d" / "x.toml").write_text('[harness.x]\nharness = "codex"\n', encoding="utf-8")
    holder.reload()
    assert set(holder.current.harness) == {"coder", "x"} and holder.state()["error"] is None
