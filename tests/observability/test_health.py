"""Health that says what is wrong.

An open breaker or a run of degraded recalls is a WARN in `doctor` and a non-zero `memory status` (status
exited 0 and doctor's provider row said PASS), and the log does not repeat the same degraded-recall
lines for every recall (2 WARNING + 1 INFO each, ~1,090 lines per 40 s): a small throttle folds them into
one line per 10 s with a count. The daemon runs as a process with a real stdio provider that is told to
hang on recall; the CLI runs as a subprocess.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fix_daemon import Daemon, daemon_process
from fix_providers import FaultFiles, fault_toml
from memactors.cli.memory import EXIT_DEGRADED, status_exit
from memactors.config import load_config
from memactors.doctor import doctor_rows
from support import run_record, write_config


def _status(**overrides: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "provider": "fault", "transport": "stdio", "state": "ready", "contract": 1, "breaker": "closed",
        "last_error": None, "state_for_seconds": 10.0, "degraded": None,
        "pending": {"records": 0, "forgets": 0, "record_failed": 0, "forget_failed": 0},
        "store": {"path": "/s/memactors.db", "writable": True, "free_bytes": 5 << 30, "error": None},
        "recalls": {"degraded_in_a_row": 0, "degraded_24h": 0, "last_degraded_seconds_ago": None},
    }
    return status | overrides


def test_status_exit_names_the_worst_problem() -> None:
    assert status_exit(_status()) == 0
    assert status_exit(_status(degraded="breaker open: …")) == EXIT_DEGRADED == 15
    assert status_exit(_status(store={"writable": False})) == 16
    assert status_exit(_status(state="down", degraded="x", store={"writable": False})) == 10
    assert status_exit(_status(state="incompatible")) == 11


def test_doctor_warns_for_an_open_breaker_and_passes_the_store(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path), env={"HOME": str(tmp_path)})
    args = {"oldest_pending_seconds": {}, "degraded_recalls_24h": 0, "episodes_missing_vectors": 0}
    rows = {r.name: r for r in doctor_rows(config, _status(breaker="open"), **args)}
    assert rows["memory provider"].status == "warn"
    assert "recalls are answered without episodes" in rows["memory provider"].message
    assert rows["memory store"].status == "pass" and "5.0 GiB free" in rows["memory store"].message
    healthy = {r.name: r for r in doctor_rows(config, _status(), **args)}
    assert healthy["memory provider"].status == "pass"


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                          text=True, timeout=120, check=False)


def recall(daemon: Daemon) -> None:
    done = cli(daemon, "memory", "recall", "ledger", "--repo", "forge.example/acme/api", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["degraded"] == "provider_unavailable"


@pytest.mark.slow
def test_a_run_of_degraded_recalls_and_an_open_breaker_warn_and_fail_memory_status(tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    config = write_config(tmp_path, fault_toml(files, provider_timeout="0.3s"))
    (tmp_path / "r.json").write_text(json.dumps(run_record()))
    with daemon_process(tmp_path, config=config) as daemon:
        assert cli(daemon, "runs", "ingest", str(tmp_path / "r.json")).returncode == 0
        assert cli(daemon, "memory", "status").returncode == 0
        files.control.write_text("hang_recall")  # from now on every recall times out
        began = time.monotonic()

        for _ in range(3):  # three in a row: the breaker (5 failures) is still closed
            recall(daemon)
        status = cli(daemon, "memory", "status", "--json")
        assert status.returncode == EXIT_DEGRADED, status.stderr
        doc = json.loads(status.stdout)
        assert doc["breaker"] == "closed" and doc["recalls"]["degraded_in_a_row"] == 3
        assert doc["degraded"].startswith("the last 3 recalls were degraded")
        rows = {r["name"]: r for r in json.loads(cli(daemon, "doctor", "--json").stdout)["rows"]}
        assert rows["memory recall degraded"]["status"] == "warn"
        assert "the last 3 in a row" in rows["memory recall degraded"]["message"]

        for _ in range(17):  # the breaker opens after five failures; the rest are refused at once
            recall(daemon)
        text = cli(daemon, "memory", "status")
        assert text.returncode == EXIT_DEGRADED
        assert "breaker open" in text.stdout
        assert text.stderr.startswith("memactors: recall is degraded: breaker open")
        rows = {r["name"]: r for r in json.loads(cli(daemon, "doctor", "--json").stdout)["rows"]}
        assert rows["memory provider"]["status"] == "warn", rows["memory provider"]
        assert "breaker open" in rows["memory provider"]["message"]
        log = daemon.log_text()
        windows = math.ceil((time.monotonic() - began) / 10)  # 10 s windows the recalls spanned (load)
    # 20 degraded recalls: one INFO "recall served" each (as for any recall), but each repeated warning
    # once per error type (a timeout, then the open breaker) per 10 s window, not once per recall; a
    # line written after a window says how many it stands for.
    assert log.count("recall served") == 20
    degraded = [line for line in log.splitlines() if "episodes degraded: provider unavailable" in line]
    failed = [line for line in log.splitlines() if "handler failed" in line and "ProviderCall" in line]
    for lines in (degraded, failed):
        assert 1 <= len(lines) <= 2 * (windows + 1), (lines, windows)  # 20 before; two error types per window
        assert all("suppressed=" in line for line in lines)
