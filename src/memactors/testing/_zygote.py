"""A fork server for the fault provider, so a test suite pays for importing it (mcp's types: ~1.3 s of
CPU) once per test process instead of once per provider process.

Only for tests, and only when ``MEMACTORS_FAULT_ZYGOTE`` names a running server's socket (the suite's
conftest starts one per pytest process); without it ``fault_provider_params`` runs the provider with
``-m`` as before.

* ``serve <socket>``: imports the fault provider, then for each launcher that connects forks a child
  that takes over the launcher's stdin, stdout and stderr (passed over the socket) and runs the
  provider's ``main`` with the launcher's arguments, environment and working directory. It reports the
  child's pid, then its exit status; it kills the child if the launcher goes away first.
* ``launch <socket> <provider args...>`` (run with ``python -I -S``: stdlib only, ~20 ms): hands its
  three standard fds to the server and closes its own copies, so the child alone holds the pipes (EOF
  and broken pipes behave as with a direct child); forwards SIGTERM/SIGINT/SIGHUP to the child and
  exits as the child did (the same code, or killed by the same signal).

The provider is still a separate process speaking MCP over real pipes; what is shared is only the
imported code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import TypedDict

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _launch(path: str, args: list[str]) -> None:
    import time

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 60
    while True:  # the server may still be importing (the suite starts it without waiting for it)
        try:
            conn.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                sys.exit(f"memactors fault provider: no fork server at {path} after 60 s")
            time.sleep(0.01)  # ok: the launcher is a plain synchronous process, no trio loop
    payload = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [payload], [0, 1, 2])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    reader = conn.makefile("rb")
    pid = int(reader.readline())

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    line = reader.readline()
    if not line:
        os._exit(1)
    status = int(line)
    if os.WIFSIGNALED(status):
        killed_by = os.WTERMSIG(status)
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


class _Request(TypedDict):
    """What a launcher sends beside its three fds (`_launch`'s payload)."""

    args: list[str]
    env: dict[str, str]
    cwd: str


def _child(fds: list[int], request: _Request, inherited: list[int]) -> None:
    try:
        for fd in inherited:  # the server's own: its wake-up pipe, other launchers' connections
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (*_FORWARDED, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in any Python process
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(request["env"])
        from memactors.testing.fault_provider import main

        args = [str(a) for a in request["args"]]
        sys.argv = ["memactors.testing.fault_provider", *args]
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # ok: the forked child's last frame: report anything, exit 1 (no trio here)
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve(path: str) -> None:
    import select

    import memactors.testing.fault_provider  # noqa: F401 -- the point: imported once, before any fork

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(64)
    os.rename(path + ".tmp", path)  # launchers find the path only once it accepts
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    children: dict[int, socket.socket] = {}
    while True:
        watched: list[socket.socket | int] = [server, wake_r, 0, *children.values()]
        readable, _, _ = select.select(watched, [], [])
        for ready in readable:
            if ready == 0:  # stdin: the pytest process that started us is gone (EOF)
                if not os.read(0, 4096):
                    sys.exit(0)
            elif ready is server:
                conn, _ = server.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(message)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    server.close()
                    conn.close()
                    _child(fds, request, [wake_r, wake_w, *(c.fileno() for c in children.values())])
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                children[pid] = conn
            elif ready == wake_r:
                os.read(wake_r, 4096)
            else:  # a launcher went away (killed) before its child: the child goes too
                for pid, conn in list(children.items()):
                    if conn is ready:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                        conn.close()
                        del children[pid]  # reaped below, its status told to no one
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            launcher = children.pop(pid, None)
            if launcher is not None:
                try:
                    launcher.sendall(f"{status}\n".encode())
                except OSError:
                    pass
                launcher.close()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve(sys.argv[2])
    else:
        _launch(sys.argv[2], sys.argv[3:])
