"""The daemon as a process under hostile conditions: giving up cleanly, fd limits, connection floods."""

from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
import trio

from fix_daemon import start_daemon
from fix_providers import FaultFiles, fault_toml, poll
from memactors.config import load_config
from memactors.daemon import EXIT_GAVE_UP, run_daemon
from support import write_config


@pytest.mark.slow
def test_a_memory_service_that_gives_up_exits_with_one_line_and_a_distinct_status(tmp_path: Path) -> None:
    """A child that crashes on every restart (here: the store lost a table its loop reads) is restarted
    with backoff until its burst is spent; then the daemon logs one clear line and exits 75, so a
    service manager restarts it, instead of logging a traceback every 0.1 s."""
    first = start_daemon(tmp_path)
    assert first.stop() == 0
    db = sqlite3.connect(first.state / "memactors.db")
    db.execute("DROP TABLE pending")
    db.commit()
    db.close()
    daemon = start_daemon(tmp_path, wait=False)
    try:
        code = daemon.proc.wait(timeout=120)
    finally:
        daemon.stop()
    log = daemon.log_text()
    assert code == EXIT_GAVE_UP, log[-3000:]
    assert "Traceback" not in log
    gave_up = [line for line in log.splitlines() if "memory service gave up" in line]
    assert len(gave_up) == 1, log[-3000:]
    assert "child 'retention'" in gave_up[0] and "exit_status=75" in gave_up[0]
    restarts = [line for line in log.splitlines() if "restarting after backoff" in line]
    assert 1 <= len(restarts) <= 6  # one burst with backoff, not a storm
    assert not (daemon.state / "daemon.json").exists()


def test_the_soft_fd_limit_is_raised_to_the_hard_limit() -> None:
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    script = (f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (64, {hard}));"
              "from memactors.daemon import raise_nofile_limit; print(*raise_nofile_limit())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert tuple(map(int, out.stdout.split())) == (hard, hard)


async def test_readyz_follows_the_provider_and_healthz_stays_up(tmp_path: Path) -> None:
    """/readyz is 200 with a ready provider and 503 naming the state with an incompatible one."""
    for name, extra, expected in (
        ("ready", "", (200, "ready\n")),
        ("broken", fault_toml(FaultFiles(tmp_path / "fault"), "omit_contract"),
         (503, "not ready: provider fault is incompatible\n")),
    ):
        (tmp_path / name).mkdir()
        path = write_config(tmp_path / name, extra)
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(
                lambda task_status, path=path: run_daemon(lambda: load_config(path), task_status=task_status))
            base = listening.metrics.removesuffix("/metrics")
            async with httpx2.AsyncClient() as http:
                assert (await http.get(base + "/healthz")).status_code == 200

                async def settled(http: httpx2.AsyncClient = http, base: str = base,
                                  expected: tuple[int, str] = expected) -> bool:
                    response = await http.get(base + "/readyz")
                    return (response.status_code, response.text) == expected

                await poll(settled, what=f"/readyz {expected}")
            nursery.cancel_scope.cancel()


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (the kernel's SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signum - 1)))


@pytest.mark.slow
def test_a_sighup_during_start_up_is_queued_and_applied_once_the_daemon_serves(tmp_path: Path) -> None:
    """A SIGHUP within half a second of the operator port opening killed the daemon (SIGHUP's
    default action: the handlers were installed after the listeners). The daemon as a process; SIGHUP
    sent as soon as the process catches it (before that, as for any program, the kernel's default
    applies: the test watches /proc's SigCgt mask, no sleep) and then again and again through the whole
    start-up — config load, store, provider, the three listeners — until daemon.json appears, and once
    more. The daemon survives, serves, and applies the reload once it serves."""
    daemon = start_daemon(tmp_path, wait=False)
    try:
        pid = daemon.proc.pid
        guard = time.monotonic() + 120  # hang guards, not timings: a loaded machine starts slowly
        while not _catches(pid, signal.SIGHUP) and daemon.proc.poll() is None and time.monotonic() < guard:
            time.sleep(0.001)
        assert daemon.proc.poll() is None, daemon.log_text()[-3000:]
        sent = 0
        state = daemon.state / "daemon.json"
        while time.monotonic() < guard:  # until it serves
            os.kill(pid, signal.SIGHUP)
            sent += 1
            assert daemon.proc.poll() is None, f"killed by SIGHUP number {sent}:\n{daemon.log_text()[-3000:]}"
            try:
                if json.loads(state.read_text()).get("pid") == pid:
                    break
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.002)
        os.kill(pid, signal.SIGHUP)  # and one while serving
        lines: list[str] = []
        while time.monotonic() < guard:  # the queued reload is applied once serving, and then the last one
            lines = daemon.log_text().splitlines()
            serving = next((i for i, line in enumerate(lines) if "memactors serving" in line), None)
            if serving is not None and any("configuration reloaded" in line for line in lines[serving:]):
                break
            assert daemon.proc.poll() is None, daemon.log_text()[-3000:]
            time.sleep(0.01)
        assert daemon.proc.poll() is None and sent > 1
        serving = next(i for i, line in enumerate(lines) if "memactors serving" in line)
        assert any("configuration reload queued until start-up completes" in line for line in lines[:serving])
        assert not any("configuration reloaded" in line for line in lines[:serving])  # queued, not applied early
        assert any("configuration reloaded" in line for line in lines[serving:])
        assert "Traceback" not in daemon.log_text()
    finally:
        code = daemon.stop()
    assert code == 0, daemon.log_text()[-3000:]  # and SIGTERM still stops it gracefully


#: A sitecustomize for the daemon under test (on its PYTHONPATH): when the command line's first command
#: module is imported, it writes whether SIGHUP is already caught. Run by `site`, before any of ours.
_SITECUSTOMIZE = '''
import os, sys, _signal
_OUT = os.environ["MEMACTORS_TEST_HANGUP_PROBE"]
def _probe(event, args):
    if event == "import" and args[0] == "memactors.cli._core" and not os.path.exists(_OUT):
        with open(_OUT, "w") as out:
            out.write("caught" if _signal.getsignal(_signal.SIGHUP) not in (0, None) else "default")
sys.addaudithook(_probe)
'''


@pytest.mark.slow
def test_sighups_from_the_first_moments_of_memactors_serve_never_kill_it(tmp_path: Path) -> None:
    """A SIGHUP in the first ~0.1 s after launch killed the daemon: `memactors serve` caught it
    only once the command line's modules were imported and its parser built. It is caught first thing
    now, at the top of `memactors.cli`: by the time the CLI's first command module loads, SIGHUP is
    already caught (a probe run by `site` records it). Then `memactors serve` as a user types it (the
    installed entry point) is started again and again, and SIGHUPs are sent from the first moment the
    process catches them (before that the interpreter itself is starting, and the kernel's default
    applies to any program), each start's first one later than the last's, then every few
    milliseconds until it serves: every daemon comes up (`/readyz`), and applies the reload."""
    memactors = Path(sys.executable).parent / "memactors"
    assert memactors.exists(), f"{memactors}: the installed entry point is missing"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    for start in range(8):
        home = tmp_path / f"start-{start}"
        home.mkdir()
        config = write_config(home)
        state = home / "state"
        probe = home / "probe"
        log = home / "daemon.log"
        env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(home), "PYTHONPATH": str(site),
               "MEMACTORS_TEST_HANGUP_PROBE": str(probe), "MEMACTORS_CONFIG_POLL_SECONDS": "0"}
        with log.open("wb") as sink:
            proc = subprocess.Popen([str(memactors), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=sink)
        try:
            guard = time.monotonic() + 120  # hang guards, not timings: a loaded machine starts slowly
            while not _catches(proc.pid, signal.SIGHUP) and proc.poll() is None and time.monotonic() < guard:
                time.sleep(0.0005)
            first = time.monotonic() + start * 0.03  # this start's first SIGHUP: later each time
            sent = 0
            while time.monotonic() < guard:
                if time.monotonic() >= first:
                    proc.send_signal(signal.SIGHUP)
                    sent += 1
                assert proc.poll() is None, f"start {start} killed by SIGHUP {sent}:\n{log.read_text()[-3000:]}"
                try:
                    if json.loads((state / "daemon.json").read_text()).get("pid") == proc.pid:
                        break
                except (FileNotFoundError, ValueError):
                    pass
                time.sleep(0.005)
            metrics = json.loads((state / "daemon.json").read_text())["metrics"]
            ready = metrics.removesuffix("/metrics") + "/readyz"
            while time.monotonic() < guard:  # it serves, and the reload asked for during start-up is applied
                if httpx2.get(ready).status_code == 200 and "configuration reloaded" in log.read_text():
                    break
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.02)
            assert proc.poll() is None and sent >= 1
            assert httpx2.get(ready).status_code == 200
            assert "configuration reloaded" in log.read_text() and "Traceback" not in log.read_text()
            assert probe.read_text() == "caught"  # before the command line's own modules were imported
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


@pytest.mark.parametrize(("argv", "serve"), [
    (["serve"], True), (["--config", "serve", "serve"], True), (["--config=h.toml", "serve"], True),
    (["serve", "--config", "h.toml"], True), (["--config", "serve"], False), (["memory", "status"], False),
    (["run", "serve"], False), (["--help"], False), ([], False),
])
def test_only_the_serve_command_line_catches_sighup_before_its_imports(argv: list[str], serve: bool) -> None:
    """The early SIGHUP disposition is the daemon's alone: any other command keeps SIGHUP's default (a
    hung-up terminal still ends `memactors run --wait`), and `--config`'s value is not a command."""
    from memactors._hangup import names_serve

    assert names_serve(argv) is serve
