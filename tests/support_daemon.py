"""The daemon as a real process for the hardening tests: optional fd limit, faster trio thread retirement.

``daemon_process`` runs ``memactors serve`` in a child Python. Two knobs make hostile conditions quick
to reach without faking them:

* ``nofile``: the child's ``RLIMIT_NOFILE`` (soft and hard), set before exec, as ``ulimit -n`` would;
* ``thread_idle``: trio's worker-thread idle timeout (10 s in trio) for the child, so threads retire
  within a test's idle gap. The daemon's code is unchanged; only how soon trio retires idle threads is.
* ``handshake``: the listeners' request-head timeout (``net.listen.HANDSHAKE_TIMEOUT``, 5 s) for the
  child, so a test holds a flood past it in less real time. Only the constant's value changes.
* ``body``: the listeners' request-body deadline (``net.listen.BODY_TIMEOUT``, 10 s), likewise.
* ``constants``: any other module constants for the child, ``{"memactors.module.NAME": value}``; each
  must exist (a renamed constant fails the start loudly).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from support import write_config

_BOOT = """
import sys
idle = float(sys.argv[1])
if idle > 0:
    import trio._core._thread_cache as cache
    cache.IDLE_TIMEOUT = idle
handshake = float(sys.argv[2])
if handshake > 0:
    import memactors.net.listen as listen
    import memactors.rpc.server as rpc  # serve_rpc reads it there
    assert listen.HANDSHAKE_TIMEOUT and rpc.HANDSHAKE_TIMEOUT  # both read it: fail loudly if renamed
    listen.HANDSHAKE_TIMEOUT = rpc.HANDSHAKE_TIMEOUT = handshake
body = float(sys.argv[3])
if body > 0:
    import memactors.net.listen as listen
    assert listen.BODY_TIMEOUT
    listen.BODY_TIMEOUT = body
import importlib, json
for dotted, value in json.loads(sys.argv[4]).items():
    module, name = dotted.rsplit(".", 1)
    assert hasattr(importlib.import_module(module), name), dotted
    setattr(importlib.import_module(module), name, value)
from memactors.cli import main
sys.exit(main(["serve"]))
"""


@attrs.define
class Daemon:
    proc: subprocess.Popen[bytes]
    state: Path
    info: dict[str, Any]
    log: Path
    env: dict[str, str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def token(self, tier: str) -> str:
        return (self.state / f"operator-{tier}.token").read_text(encoding="utf-8").strip()

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _limit(nofile: int | None) -> Any:
    if nofile is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return apply


def start_daemon(tmp_path: Path, *, nofile: int | None = None, thread_idle: float = 0.0, handshake: float = 0.0,
                 body: float = 0.0, constants: dict[str, Any] | None = None, extra_config: str = "",
                 config: Path | None = None, wait: bool = True, command: list[str] | None = None,
                 env: dict[str, str] | None = None) -> Daemon:
    """Start the daemon and wait (on its daemon.json) until it serves; its log goes to a file.

    ``command``: another `memactors serve` to start instead of this interpreter's (an installed wheel's,
    tests/project/test_packaging.py), with ``env`` as its whole environment (HARNESS_CONFIG and HOME added)."""
    config = config or write_config(tmp_path, extra_config)
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "daemon.json").unlink(missing_ok=True)
    env = {**(os.environ if env is None else env), "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    log = tmp_path / f"daemon-{time.monotonic_ns()}.log"
    with log.open("wb") as sink:
        argv = command or [sys.executable, "-c", _BOOT, str(thread_idle), str(handshake), str(body),
                           json.dumps(constants or {})]
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=_limit(nofile))  # noqa: PLW1509
    daemon = Daemon(proc=proc, state=state, info={}, log=log, env=env)
    if not wait:
        return daemon
    deadline = time.monotonic() + 300  # a hang guard: a loaded machine takes a minute to start a daemon
    while time.monotonic() < deadline:
        try:
            daemon.info = json.loads((state / "daemon.json").read_text(encoding="utf-8"))
            if daemon.info.get("pid") == proc.pid:
                return daemon
        except (FileNotFoundError, ValueError):
            pass
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}:\n{daemon.log_text()[-4000:]}")
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError("daemon did not start within 300 s")


@contextmanager
def daemon_process(tmp_path: Path, **options: Any) -> Iterator[Daemon]:
    daemon = start_daemon(tmp_path, **options)
    try:
        yield daemon
    finally:
        daemon.stop()
