"""A corrupt or unwritable store: the daemon as a process on a real SQLite file.

* At start, a file that is not a database, or a store path SQLite cannot open or write: `memactors
  serve` prints one line naming the file and the cause and exits 5, no traceback.
* At start, a store with damaged pages (SQLite's quick_check at open) or a zero-length file: one line naming
  the file and the commands that check and restore it (`store check`, `store restore`), exit 5, no
  traceback, never an empty memory begun without a word; `store check` says the same.
* At run time, garbage pages written into the file under the running daemon: `memactors doctor` and
  `memactors memory status` fail naming the file (SQLite's quick_check), never INTERNAL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fix_daemon import daemon_process, start_daemon
from memactors.rpc.client import connect_rpc
from support import run_record, write_config

SERVICE = "harness.v1.MemoryService"


def _serve(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = write_config(tmp_path)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "memactors.cli", "serve"], env=env, capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)


def _error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What the command said that is not a daemon log line (those carry a timestamp and a level)."""
    return [line for line in (done.stdout + done.stderr).splitlines()
            if line.strip() and not line[:4].isdigit()]


def _immutable(*paths: Path, on: bool) -> None:
    """Root ignores file modes (CI runs as root); the immutable attribute stops root as well."""
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True)


@pytest.mark.parametrize("damage", ["garbage", "directory", "read-only", "state-directory"])
def test_a_store_that_cannot_be_used_at_start_is_one_line_and_exit_5(tmp_path: Path, damage: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / "memactors.db"
    root = os.geteuid() == 0  # root ignores modes: the immutable attribute makes a file read-only for it
    locked: list[Path] = []
    if damage == "garbage":
        db.write_bytes(os.urandom(3 * 8192))
    elif damage == "directory":
        db.mkdir()
    elif damage == "read-only":  # the file cannot be written; the directory can (its WAL, its lock)
        import sqlean

        made = sqlean.connect(str(db))  # a database (a zero-length file is refused as empty: see below)
        made.execute("CREATE TABLE t (x)")
        made.close()
        db.chmod(0o400)
        locked = [db] if root else []
    else:  # the state directory itself cannot be created: a file is in its place
        state.rmdir()
        state.write_text("not a directory\n")
    if locked:
        _immutable(*locked, on=True)
    try:
        done = _serve(tmp_path)
    finally:
        if locked:
            _immutable(*locked, on=False)
    assert done.returncode == 5, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr
    lines = _error_lines(done)
    assert len(lines) == 1, lines
    named = state if damage == "state-directory" else db
    assert str(named) in lines[0]
    cause = {"garbage": "not a database", "directory": "Is a directory",
             "read-only": "cannot be written: attempt to write a readonly database", "state-directory": "File exists"}[damage]
    assert cause in lines[0], lines[0]


@pytest.mark.slow
async def test_garbage_pages_written_under_a_running_daemon_make_status_and_doctor_fail_naming_the_file(
        tmp_path: Path) -> None:
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(tmp_path))
    try:
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            for i in range(40):
                await rpc.call(f"{SERVICE}/IngestRun", {"record": run_record(run_id=f"d{i}",
                                                                              summary="ledger " * 200)})
        db = daemon.state / "memactors.db"

        async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
            return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=daemon.env,
                                          stdin=b"", capture_stdout=True, capture_stderr=True, check=False)

        healthy = await cli("doctor")
        assert b"damaged" not in healthy.stdout + healthy.stderr, healthy
        size = db.stat().st_size
        assert size >= 5 * 8192, size  # pages to damage
        with db.open("r+b") as f:  # three garbage pages in the middle of the file
            for page in (2, 3, 4):
                f.seek(page * 8192)
                f.write(os.urandom(8192))
        with trio.fail_after(120):  # status and doctor check the file at most 10 s apart: wait for it
            while True:
                doctor = await cli("doctor")
                if doctor.returncode != 0:
                    break
                await trio.sleep(0.5)
        said = (doctor.stdout + doctor.stderr).decode()
        assert str(db) in said and "damaged" in said, said
        status = await cli("memory", "status")
        assert status.returncode == 16  # the store cannot write; never INTERNAL (7)
        err = status.stderr.decode()
        assert str(db) in err and "damaged" in err, err
        as_json = await cli("memory", "status", "--json")
        assert as_json.returncode == 16 and json.loads(as_json.stdout)["store"]["damaged"] is True
        assert "Traceback" not in daemon.log_text() and "rpc handler failed" not in daemon.log_text()
    finally:
        await trio.to_thread.run_sync(daemon.stop)


def _store_with_episodes(tmp_path: Path) -> Path:
    """A store a daemon wrote (40 episodes), the daemon stopped: its memactors.db."""
    records = tmp_path / "records"
    records.mkdir()
    for i in range(40):
        (records / f"r{i}.json").write_text(json.dumps(run_record(run_id=f"d{i}", summary="ledger " * 200)),
                                            encoding="utf-8")
    with daemon_process(tmp_path) as daemon:
        done = daemon.cli("runs", "ingest", str(records))
        assert done.returncode == 0 and "40 recorded" in done.stdout, done.stdout + done.stderr
    return tmp_path / "state" / "memactors.db"


def _check(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_CONFIG": str(tmp_path / "harness.toml"), "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "memactors.cli", "store", "check", "--json"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["damaged pages", "zero bytes"])
def test_a_damaged_or_emptied_store_stops_the_start_naming_the_file_and_the_commands_to_recover(
        tmp_path: Path, damage: str) -> None:
    db = _store_with_episodes(tmp_path)
    healthy = _check(tmp_path)
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["ok"] is True, healthy.stderr
    if damage == "damaged pages":
        with db.open("r+b") as f:  # three garbage pages in the middle of the file
            for page in (2, 3, 4):
                f.seek(page * 8192)
                f.write(os.urandom(8192))
    else:
        db.write_bytes(b"")
    for _ in range(2):  # the same on every start: never an empty store begun, never a crash loop
        done = _serve(tmp_path)
        assert done.returncode == 5, (done.returncode, done.stderr[-3000:])
        assert "Traceback" not in done.stdout + done.stderr
        [line] = _error_lines(done)
        assert str(db) in line and "`memactors store restore BACKUP`" in line, line
        assert ("is damaged (quick_check:" in line and "`memactors store check`" in line if damage == "damaged pages"
                else "is empty (0 bytes)" in line)
    assert db.stat().st_size == (0 if damage == "zero bytes" else db.stat().st_size)
    checked = _check(tmp_path)
    assert checked.returncode == 1, checked.stderr
    report = json.loads(checked.stdout)
    assert report["path"] == str(db) and report["ok"] is False
