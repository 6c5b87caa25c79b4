"""The daemon as a real process: one `Daemon`, started one way, for every test that needs `memactors serve`.

``start_daemon``/``daemon_process`` run ``memactors serve`` in a child Python with port-0 listeners; the
daemon is ready once its ``daemon.json`` names its pid (the file holds the addresses it bound). Its stdout
and stderr go to a log file (a pipe nobody drains would stall it). ``daemon_process`` stops it with SIGTERM
and, unless told otherwise (``clean_exit=False``, for a test that kills or starves it), asserts it exited 0
without a traceback. ``serving_env`` starts one from an environment the test built itself;
``daemon_in_process`` runs the daemon in the test's own trio loop instead.

Knobs that make hostile conditions quick to reach without faking them:

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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from memactors.config import load_config
from memactors.daemon import Listening, run_daemon
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

#: The CLI as a user runs it, in this interpreter.
CLI = [sys.executable, "-m", "memactors.cli"]


@attrs.frozen
class Completed:
    """A finished CLI call: exit status and decoded output."""

    returncode: int
    stdout: str
    stderr: str


@attrs.define
class Daemon:
    """A running ``memactors serve``: its process, state directory, ``daemon.json`` (``info``: the operator,
    gateway, metrics and console URLs it bound), log file and environment (HARNESS_CONFIG set)."""

    proc: subprocess.Popen[bytes]
    state: Path
    info: dict[str, Any]
    log: Path
    env: dict[str, str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def gateway(self) -> str:
        return str(self.info["gateway"])

    @property
    def operator(self) -> str:
        return str(self.info["operator"])

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def token(self, tier: str) -> str:
        return (self.state / f"operator-{tier}.token").read_text(encoding="utf-8").strip()

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    @staticmethod
    def cli_argv() -> list[str]:
        return list(CLI)

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``memactors <args>`` against this daemon as a user would (from a synchronous test)."""
        return subprocess.run([*CLI, *args], env=self.env, input=stdin, capture_output=True, text=True,
                              timeout=120, check=False)

    async def acli(self, *args: str) -> Completed:
        """The same from an async test, without blocking its loop (a fake API may be serving in it)."""
        done = await trio.run_process([*CLI, *args], env=self.env, stdin=b"", capture_stdout=True,
                                      capture_stderr=True, check=False)
        return Completed(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))

    def stop(self) -> int:
        """SIGTERM (a graceful stop, as SIGINT is), then SIGKILL if it has not exited within 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def assert_clean_exit(self) -> None:
        """It exited 0 and its log holds no traceback."""
        assert self.proc.returncode == 0, f"daemon exited {self.proc.returncode}:\n{self.log_text()[-3000:]}"
        assert "Traceback" not in self.log_text(), self.log_text()[-3000:]


def _limit(nofile: int | None) -> Any:
    if nofile is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return apply


def launch(argv: list[str], env: dict[str, str], state: Path, log: Path, *, wait: bool = True,
           nofile: int | None = None, cwd: Path | None = None) -> Daemon:
    """Start ``argv`` (a ``memactors serve``) with ``env`` as its whole environment, in ``cwd`` (relative
    provider paths resolve there), its output appended to ``log``, and wait (unless not ``wait``) until
    ``state``/daemon.json names its pid."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "daemon.json").unlink(missing_ok=True)
    with log.open("ab") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT,
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


def start_daemon(tmp_path: Path, extra_config: str = "", *, nofile: int | None = None, thread_idle: float = 0.0,
                 handshake: float = 0.0, body: float = 0.0, constants: dict[str, Any] | None = None,
                 config: Path | None = None, wait: bool = True, command: list[str] | None = None,
                 env: dict[str, str] | None = None) -> Daemon:
    """Start the daemon on ``config`` (default: `write_config(tmp_path, extra_config)`), state in
    tmp_path/state, HOME tmp_path; ``env`` (default: this process's) with HARNESS_CONFIG and HOME added.

    ``command``: another `memactors serve` to start instead of this interpreter's (an installed wheel's,
    tests/project/test_packaging.py)."""
    config = config or write_config(tmp_path, extra_config)
    env = {**(os.environ if env is None else env), "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    argv = command or [sys.executable, "-c", _BOOT, str(thread_idle), str(handshake), str(body),
                       json.dumps(constants or {})]
    return launch(argv, env, tmp_path / "state", tmp_path / f"daemon-{time.monotonic_ns()}.log", wait=wait,
                  nofile=nofile)


@contextmanager
def daemon_process(tmp_path: Path, extra_config: str = "", *, clean_exit: bool = True,
                   **options: Any) -> Iterator[Daemon]:
    """`start_daemon(tmp_path, extra_config, **options)` for the block; stopped after it, and then (unless
    ``clean_exit`` is False) it must have exited 0 without a traceback."""
    daemon = start_daemon(tmp_path, extra_config, **options)
    try:
        yield daemon
    finally:
        daemon.stop()
    if clean_exit:
        daemon.assert_clean_exit()


@contextmanager
def serving_env(env: dict[str, str], state: Path, log: Path, *,
                cwd: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """`memactors serve` with ``env`` as its whole environment (HARNESS_CONFIG in it), state in ``state``, its
    output appended to ``log``, started in ``cwd``: its process, stopped with SIGTERM after the block."""
    daemon = launch([*CLI, "serve"], env, state, log, cwd=cwd)
    try:
        yield daemon.proc
    finally:
        daemon.stop()


@asynccontextmanager
async def daemon_in_process(tmp_path: Path, extra: str = "") -> AsyncIterator[tuple[Path, Listening]]:
    """The daemon in this test's own trio loop (`run_daemon` on `write_config(tmp_path, extra)`), serving on
    port-0 listeners for the block: (its config file, the addresses it bound). Cancelled after the block."""
    path = write_config(tmp_path, extra)
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(lambda task_status: run_daemon(lambda: load_config(path),
                                                                       task_status=task_status))
        yield path, listening
        nursery.cancel_scope.cancel()
