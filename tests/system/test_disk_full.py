"""A full disk is RESOURCE_EXHAUSTED naming the path and the bytes free (it was INTERNAL, exit
7), and `memory status`, `doctor` and `/readyz` say the store cannot write (status said "ready", doctor
stayed green).

The daemon runs as a process with its state directory on a small tmpfs of its own, filled by the test;
the CLI runs as a subprocess, /readyz is read over HTTP.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fix_daemon import Daemon, daemon_process
from memactors.cli import memory as cli_memory
from memactors.cli._core import EXIT_RESOURCE
from memactors.store.health import WriteHealth, disk_full_cause
from support import run_record


def _can_mount() -> bool:
    return os.geteuid() == 0 and Path("/proc/filesystems").read_text().find("tmpfs") >= 0


@contextmanager
def small_tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path`, unmounted whatever happens."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem has no byte left; returns it (delete it to free the space)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):  # big chunks, then smaller, until not even one byte fits
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                          text=True, timeout=120, check=False)


def readyz(daemon: Daemon) -> tuple[int, str]:
    url = daemon.info["metrics"].replace("/metrics", "/readyz")
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 -- loopback, our daemon
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root (the test machines run as root)")
def test_a_full_disk_is_resource_exhausted_and_every_health_surface_says_so(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(run_record(run_id="a")))
    second.write_text(json.dumps(run_record(run_id="b")))
    with small_tmpfs(tmp_path / "state") as state, daemon_process(tmp_path) as daemon:
        db = state / "memactors.db"
        assert cli(daemon, "runs", "ingest", str(first)).returncode == 0
        assert cli(daemon, "memory", "status").returncode == 0
        filler = fill(state)

        refused = cli(daemon, "runs", "ingest", str(second))
        assert refused.returncode == EXIT_RESOURCE == 8, refused.stderr
        assert "Traceback" not in refused.stderr
        assert refused.stderr.startswith(f"memactors: RESOURCE_EXHAUSTED: store {db} is not writable: ")
        assert "bytes free on its filesystem" in refused.stderr and "refused with the call, not stored" in refused.stderr

        status = cli(daemon, "memory", "status", "--json")
        assert status.returncode == cli_memory.EXIT_STORE_UNWRITABLE == 16, status.stderr
        store = json.loads(status.stdout)["store"]
        assert store["writable"] is False and store["path"] == str(db) and store["free_bytes"] < 1024 * 1024
        assert "database or disk is full" in store["error"]
        text = cli(daemon, "memory", "status")
        assert "NOT WRITABLE" in text.stdout and f"store {db} is not writable" in text.stderr

        doctor = cli(daemon, "doctor", "--json")
        assert doctor.returncode == 1
        row = next(r for r in json.loads(doctor.stdout)["rows"] if r["name"] == "memory store")
        assert row["status"] == "fail" and str(db) in row["message"] and "RESOURCE_EXHAUSTED" in row["message"]
        code, body = readyz(daemon)
        assert code == 503 and f"store {db} is not writable" in body

        filler.unlink()  # space is back: every surface says so before anything has written again
        assert readyz(daemon)[0] == 200
        assert cli(daemon, "memory", "status").returncode == 0
        again = cli(daemon, "runs", "ingest", str(second))
        assert again.returncode == 0 and "1 recorded" in again.stdout, again.stderr
        doctor = cli(daemon, "doctor", "--json")
        row = next(r for r in json.loads(doctor.stdout)["rows"] if r["name"] == "memory store")
        assert row["status"] == "pass" and "is writable" in row["message"]
        assert "rpc handler failed" not in daemon.log_text()  # never INTERNAL


def test_disk_full_errors_are_recognised_through_their_chain(tmp_path: Path) -> None:
    import sqlean

    try:
        raise RuntimeError("wrapped") from sqlean.OperationalError("database or disk is full")
    except RuntimeError as exc:
        assert disk_full_cause(exc) is exc.__cause__
    assert disk_full_cause(OSError(errno.ENOSPC, "No space left on device")) is not None
    assert disk_full_cause(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full_cause(sqlean.OperationalError("database is locked")) is None
    health = WriteHealth(tmp_path / "m.db")
    other = ValueError("not about space")
    assert health.failed(other) is other and health.snapshot()["writable"] is True
    full = health.failed(OSError(errno.ENOSPC, "No space left on device"))
    assert full.code == "RESOURCE_EXHAUSTED" and str(tmp_path / "m.db") in str(full)  # type: ignore[attr-defined]
    assert full.__cause__ is not None
    health.succeeded()
    assert health.snapshot()["writable"] is True


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root (the test machines run as root)")
def test_a_restart_on_a_full_disk_says_disk_full_and_the_intact_store_serves_once_space_is_back(
        tmp_path: Path) -> None:
    record = tmp_path / "a.json"
    record.write_text(json.dumps(run_record(run_id="a")))
    with small_tmpfs(tmp_path / "state") as state:
        with daemon_process(tmp_path) as daemon:
            assert cli(daemon, "runs", "ingest", str(record)).returncode == 0
        filler = fill(state)
        for _ in range(2):
            done = subprocess.run([sys.executable, "-m", "memactors.cli", "serve"], env=daemon.env,
                                  capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
            said = done.stdout + done.stderr
            assert done.returncode == EXIT_RESOURCE, said[-3000:]
            assert "Traceback" not in said and "damaged" not in said and "restore" not in said, said[-3000:]
            assert f"memactors: disk full: cannot start on {state}" in said and "0 bytes free" in said, said[-3000:]
        filler.unlink()
        with daemon_process(tmp_path) as daemon:
            shown = cli(daemon, "memory", "episodes", "--json")
            assert shown.returncode == 0 and '"a"' in shown.stdout, shown.stderr
