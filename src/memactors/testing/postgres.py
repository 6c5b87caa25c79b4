"""A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` and `pg_ctl` in a temporary
directory, listening on 127.0.0.1 on a free port (and a Unix socket in its own directory).

The server is Debian's (`/usr/lib/postgresql/<version>/bin`, or wherever `pg_config --bindir` says);
`make test` installs it when it is missing. When this process runs as root (CI does) the server runs as
the `postgres` user (`initdb` refuses root) through `runuser`, with a data directory it owns.

Daemons connect as the role `memactors` with a password over TCP (so the password path is the one
users have); the harness itself connects as the superuser over the socket.

    with Cluster() as cluster:
        url = cluster.create_database("t1")     # postgresql://memactors:…@127.0.0.1:PORT/t1
        cluster.stop(); cluster.start()          # an outage, same port
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

#: The role daemons connect as, and the prefix of its password.
ROLE = "memactors"


def server_bindir() -> Path:
    """Where `initdb`, `pg_ctl` and `postgres` are. Raises RuntimeError naming what to install."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=10)
            candidates.append(Path(out.stdout.strip()))
    base = Path("/usr/lib/postgresql")
    if base.is_dir():
        versions = sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        candidates += [v / "bin" for v in versions]
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's `postgresql` "
                       "package (`make test` does it)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One PostgreSQL server in a temporary directory; `close()` (or leaving the `with`) removes it.

    ``durable=False`` (tests) turns fsync off: nothing here must survive a power cut. Benchmarks pass
    ``durable=True``: fsync on, `synchronous_commit = off` — the durability SQLite's WAL with
    ``synchronous = NORMAL`` has (a crash of the machine may lose the last commits, never corrupts).
    """

    def __init__(self, *, durable: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.bindir = server_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="memactors-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.password = f"pw-{secrets.token_hex(12)}"
        self.durable = durable
        self.extra = extra
        self._as_postgres = os.geteuid() == 0
        self._running = False
        self._databases = 0
        self._init()

    # -- process control ---------------------------------------------------------------------------
    def _run(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)

    def _init(self) -> None:
        self.sockets.mkdir()
        if self._as_postgres:
            info = pwd.getpwnam("postgres")
            for path in (self.root, self.sockets):
                os.chown(path, info.pw_uid, info.pw_gid)
        os.chmod(self.root, 0o755)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8",
                  "--locale=C.UTF-8", "--no-sync", "--auth-local=trust", "--auth-host=scram-sha-256")
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.sockets}'",
            "max_connections = 300",
            "shared_buffers = 64MB",
            "fsync = on" if self.durable else "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = on" if self.durable else "full_page_writes = off",
            "log_min_messages = warning",
            *self.extra,
        ]
        conf = self.data / "postgresql.conf"
        self._append(conf, "\n".join(settings) + "\n")
        self.start()
        self.admin(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{self.password}' CREATEDB")

    def _append(self, path: Path, text: str) -> None:
        if self._as_postgres:
            subprocess.run(["runuser", "-u", "postgres", "--", "tee", "-a", str(path)], input=text, text=True,
                           capture_output=True, check=True)
        else:
            with path.open("a", encoding="utf-8") as f:
                f.write(text)

    def start(self) -> None:
        """Start the server (again) on the same port; waits until it accepts connections."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "start")
        self._running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: clients are disconnected, as when an operator stops it)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                  check=False)
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    # -- databases ---------------------------------------------------------------------------------
    def admin(self, sql: str, dbname: str = "postgres") -> list[Any]:
        """Run one statement as the superuser (over the socket); returns its rows, if any."""
        import psycopg

        with psycopg.connect(host=str(self.sockets), port=self.port, user="postgres", dbname=dbname,
                             autocommit=True) as conn:
            cur = conn.execute(sql.encode())
            return cur.fetchall() if cur.description else []

    def url(self, dbname: str, *, password: bool = True) -> str:
        """The URL a daemon is configured with: the `memactors` role, its password, TCP on 127.0.0.1."""
        secret = f":{self.password}" if password else ""
        return f"postgresql://{ROLE}{secret}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database owned by the `memactors` role; returns its URL."""
        if name is None:
            self._databases += 1
            name = f"t{os.getpid()}_{self._databases}"
        self.admin(f'CREATE DATABASE "{name}" OWNER {ROLE}')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        if self._running:
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
