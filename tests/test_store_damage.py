"""Issue 34, "a corrupt or unwritable store": the daemon as a process on a real SQLite file.

* At start, a file that is not a database, or a store path SQLite cannot open or write: `memactors
  serve` prints one line naming the file and the cause and exits 5, no traceback.
* At run time, garbage pages written into the file under the running daemon: `memactors doctor` and
  `memactors memory status` fail naming the file (SQLite's quick_check).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from memactors.rpc.transport import connect_rpc
from support import run_record, write_config
from support_daemon import start_daemon

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
        db.touch()
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
             "read-only": "not permitted" if root else "readonly", "state-directory": "File exists"}[damage]
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
        assert status.returncode != 0
        err = status.stderr.decode()
        assert str(db) in err and "damaged" in err, err
        assert "Traceback" not in daemon.log_text()
    finally:
        await trio.to_thread.run_sync(daemon.stop)
