"""`memactors store backup` / `store restore`: a backup taken while the daemon ingests (the CLI's
`runs ingest` in a loop beside it) passes `PRAGMA integrity_check` and, restored, holds every episode
acknowledged before the backup began; restore is refused while the daemon runs; a corrupt backup is
refused and the store left as it was."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fix_daemon import daemon_process
from support import run_record, write_config

pytestmark = pytest.mark.slow


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False, timeout=300)


def episode_ids(db: Path) -> set[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return {r[0] for r in conn.execute("SELECT episode_id FROM episodes")}


def test_backup_under_ingest_load_restores_every_acknowledged_episode(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    backup = tmp_path / "backups" / "memactors-backup.db"
    backup.parent.mkdir()
    acknowledged: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    batches = threading.Semaphore(0)

    def load(env: dict[str, str]) -> None:
        """`runs ingest` of 20 new records at a time until told to stop; each answered id is acknowledged."""
        n = 0
        while not stop.is_set():
            folder = tmp_path / "records" / f"batch-{n}"
            folder.mkdir(parents=True)
            for i in range(20):
                (folder / f"{i}.json").write_text(json.dumps(run_record(
                    run_id=f"load-{n}-{i}", result_text=f"ledger batch {n} run {i} fixed the rounding")))
            done = cli(env, "runs", "ingest", str(folder), "--json")
            if done.returncode != 0:
                errors.append(done.stderr)
                return
            acknowledged.extend(r["episode_id"] for r in json.loads(done.stdout) if r.get("episode_id"))
            n += 1
            batches.release()

    with daemon_process(tmp_path, config=config) as daemon:
        worker = threading.Thread(target=load, args=(daemon.env,))
        worker.start()
        try:
            for _ in range(2):  # two batches acknowledged before the backup starts
                assert batches.acquire(timeout=300), errors
            before = list(acknowledged)  # acknowledged before the backup began
            done = cli(daemon.env, "store", "backup", str(backup), "--json")
            assert batches.acquire(timeout=300), errors  # the load went on during and after the backup
        finally:
            stop.set()
            worker.join(timeout=300)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["integrity"] == "ok" and report["bytes"] > 0
        refused = cli(daemon.env, "store", "restore", str(backup))
        assert refused.returncode == 5 and f"pid {daemon.pid}" in refused.stderr, refused.stderr
        live = episode_ids(daemon.state / "memactors.db")
    assert not errors, errors
    assert len(before) >= 40 and len(acknowledged) > len(before)
    with sqlite3.connect(backup) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    restored = cli(daemon.env, "store", "restore", str(backup), "--json")
    assert restored.returncode == 0, restored.stderr
    moved = Path(json.loads(restored.stdout)["previous"])
    assert episode_ids(moved) == live  # the store it replaced is kept whole beside it
    held = episode_ids(daemon.state / "memactors.db")
    assert set(before) <= held  # every episode acknowledged before the backup began
    assert held <= set(acknowledged)
    with daemon_process(tmp_path, config=config) as again:  # the daemon starts on the restored store
        status = json.loads(cli(again.env, "memory", "status", "--json").stdout)
    assert status["counts"]["episodes"] == len(held)


def test_restore_refuses_a_corrupt_backup_and_leaves_the_store(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env = {"HARNESS_CONFIG": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    with daemon_process(tmp_path, config=config) as daemon:
        record = tmp_path / "r.json"
        record.write_text(json.dumps(run_record()))
        assert cli(daemon.env, "runs", "ingest", str(record)).returncode == 0
    store = tmp_path / "state" / "memactors.db"
    kept = episode_ids(store)
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 4000)
    done = cli(env, "store", "restore", str(bad))
    assert done.returncode == 5 and "integrity" in done.stderr, done.stderr
    assert episode_ids(store) == kept and len(kept) == 1
