"""`memactors store import` reads a row as strictly as the store will read it, redacts what it stores and
derives scope from the episode's repository; a bad row is refused by its line number and reason while
the good rows go in; and a pending record whose stored episode cannot be read (a damaged row, or one an
older import let in) is quarantined and reported, never retried into a daemon that cannot start.

Through the surfaces a user touches: the CLI as a subprocess, the daemon as a process, the gateway."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import run_record, write_config
from support_daemon import Daemon, daemon_process, start_daemon

REPO = "forge.example/acme/api"
OTHER = "forge.example/acme/other"


def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          input=stdin, check=False, timeout=300)


def ok_json(env: dict[str, str], *args: str) -> Any:
    done = cli(env, *args, "--json")
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def wait_for(daemon: Daemon, what: str, check: Any) -> Any:
    """Poll `memory status --json` until `check(status)` holds (a hang guard bounds it, not a timing)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = ok_json(daemon.env, "memory", "status")
        if check(status):
            return status
        assert daemon.proc.poll() is None, f"daemon exited {daemon.proc.returncode}:\n{daemon.log_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"{what}: {status}")


def exported(tmp_path: Path, *records: dict[str, Any]) -> tuple[list[dict[str, Any]], Path, dict[str, str]]:
    """A real daemon's `store export` after `runs ingest` of `records`: (its lines parsed, config, env)."""
    state = tmp_path / "source"
    state.mkdir()
    config = write_config(state)
    with daemon_process(state, config=config) as daemon:
        for n, record in enumerate(records):
            path = state / f"run{n}.json"
            path.write_text(json.dumps(record), encoding="utf-8")
            ok_json(daemon.env, "runs", "ingest", str(path))
        done = cli(daemon.env, "store", "export")
        assert done.returncode == 0, done.stderr
        env = daemon.env
    return [json.loads(line) for line in done.stdout.splitlines()], config, env


def target(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """An empty state directory to import into: (its directory, config, env)."""
    where = tmp_path / "target"
    where.mkdir()
    config = write_config(where)
    import os

    return where, config, {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(where)}


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.slow
def test_an_unreadable_pending_record_is_quarantined_and_the_daemon_serves(tmp_path: Path) -> None:
    """A stored body that is not an episode (written before import checked bodies, or damaged) with a
    pending record: the daemon starts and serves, the record is set aside and counted, doctor warns, the
    log names the episode, `memory episodes` still answers, and `memory forget` clears it."""
    import sqlean

    config = write_config(tmp_path)
    with daemon_process(tmp_path, config=config) as daemon:
        path = tmp_path / "run.json"
        path.write_text(json.dumps(run_record()), encoding="utf-8")
        [done] = ok_json(daemon.env, "runs", "ingest", str(path))
    episode_id = done["episode_id"]
    db = sqlean.connect(str(tmp_path / "state" / "memactors.db"), isolation_level=None)
    db.execute("UPDATE episode_bodies SET body = 'hello'")
    db.execute("INSERT INTO pending (kind, provider, episode_id, provider_id, first_at, next_at) VALUES"
               " ('record', 'builtin', ?, '', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')",
               [episode_id])
    db.close()
    with daemon_process(tmp_path, config=config) as daemon:
        status = wait_for(daemon, "the record quarantined", lambda s: s["pending"]["record_quarantined"] == 1)
        assert status["pending"]["records"] == 0 and status["pending"]["record_failed"] == 0
        text = cli(daemon.env, "memory", "status")
        assert text.returncode == 0 and "quarantined: 1 records" in text.stdout
        doctor = cli(daemon.env, "doctor")
        assert "memory records quarantined" in doctor.stdout and "Traceback" not in doctor.stderr
        assert "pending record quarantined" in daemon.log_text() and episode_id in daemon.log_text()
        listed = ok_json(daemon.env, "memory", "episodes", "--repo", REPO)
        assert [e["episode_id"] for e in listed["episodes"]] == [episode_id]
        ok_json(daemon.env, "memory", "forget", episode_id, "--yes")
        wait_for(daemon, "the quarantined record gone with its episode",
                 lambda s: s["pending"]["record_quarantined"] == 0)
        assert daemon.proc.poll() is None


@pytest.mark.slow
def test_a_bad_episode_body_in_an_import_is_refused_by_line_and_the_daemon_starts(tmp_path: Path) -> None:
    """The audit's reproduction: an export line's episode text set to "hello" (new ids) is refused with
    its line number; the good rows beside it are imported; the daemon on the result starts and serves."""
    lines, _, _ = exported(tmp_path, run_record(), run_record(run_id="2", started_at="2026-11-28T10:00:00Z",
                                                              ended_at="2026-11-28T10:05:00Z"))
    where, config, env = target(tmp_path)
    episodes = [n for n, x in enumerate(lines) if x["type"] == "episode"]
    bad_line = episodes[0] + 1  # the file's line number (1-based)
    bad = json.loads(json.dumps(lines[episodes[0]]))
    bad["text"] = "hello"
    lines[episodes[0]] = bad
    path = write_lines(tmp_path / "bad.jsonl", lines)
    done = cli(env, "store", "import", str(path), "--json")
    assert done.returncode == 1, done.stderr  # it ran and reports a failure: a line was refused
    summary = json.loads(done.stdout)
    assert summary["refused"] == [{"line": bad_line, "type": "episode",
                                   "reason": summary["refused"][0]["reason"]}]
    assert "episode" in summary["refused"][0]["reason"]
    assert summary["added"]["episode"] == 1 and summary["queued_for_provider"] == 1
    assert f"line {bad_line}" in done.stderr and "Traceback" not in done.stderr
    with daemon_process(where, config=config) as daemon:
        wait_for(daemon, "the good episode recorded", lambda s: s["pending"]["records"] == 0
                 and s["counts"]["indexed_ids"] >= 1)
        assert daemon.proc.poll() is None
        assert ok_json(daemon.env, "memory", "episodes", "--repo", REPO)["total"] == 1
