"""A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` and `pg_ctl` in a temporary
directory, listening on 127.0.0.1 on a free port (and a Unix socket in its own directory).

Two servers:

* Debian's (`/usr/lib/postgresql/<version>/bin`, or wherever `pg_config --bindir` says), for every test
  but the pgvector ones; `make test` installs it when it is missing.
* With ``pgvector=True``: a private copy of Debian's server with pgvector compiled here for any x86-64
  CPU (`memactors.testing.pgvector_build`, run by `make postgres`: ``<virtualenv>/pgvector``), for the
  hybrid-ranking tests — Debian 12 has no pgvector package, and a server without it would leave the
  vector path untested. Nothing is installed into Debian's own directories.

When this process runs as root (CI does) the server runs as the `postgres` user (`initdb` refuses root)
through `runuser`, with a data directory it owns. A server tree where that user cannot reach it (a
virtualenv under a 0700 home) is staged into the cluster's own directory first (hard links where the
files are world-readable, else copies): the layout is kept, since PostgreSQL finds its lib and share
directories relative to its programs. When that user cannot enter the temporary directory itself (a
0700 TMPDIR), the cluster's directory goes to /var/tmp.

Daemons connect as the role `memactors` with a password over TCP (so the password path is the one
users have); the harness itself connects as the superuser over the socket.

    with Cluster() as cluster:
        url = cluster.create_database("t1")     # postgresql://memactors:…@127.0.0.1:PORT/t1
        cluster.stop(); cluster.start()          # an outage, same port

A streaming standby of a cluster: `pg_basebackup -R` from the primary into a second cluster,
optionally synchronous (the primary's commits wait for the standby's flush), and what a failover does
to them:

    standby = primary.standby(synchronous=True)
    url = primary.failover_url(standby, "t1")   # postgresql://…@127.0.0.1:P1,127.0.0.1:P2/t1?target_session_attrs=read-write
    primary.kill()                               # kill -9 of the postmaster and every backend
    standby.promote()
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

from memactors.testing.pg_binaries import link_or_copy, server_bindir

#: The role daemons connect as, and the prefix of its password.
ROLE = "memactors"




#: What the pgvector tests need of the server tree (keys of its stamp, `pgvector_build.STAMP`).
_PGVECTOR_PROGRAMS = ("initdb", "pg_ctl", "postgres")


def _tree_files(tree: Path) -> list[Path]:
    """The files of a pgvector server tree the tests use: its programs, pgvector's library and control
    file, and the snowball dictionaries initdb loads. Raises RuntimeError when the tree has no stamp."""
    from memactors.testing.pgvector_build import read_stamp

    stamp = read_stamp(tree)
    if stamp is None:
        raise RuntimeError(f"the PostgreSQL server with pgvector is missing at {tree}: build it with "
                           "`make postgres` (`make test` does it; python -m memactors.testing.pgvector_build)")
    bindir = tree / stamp["bindir"]
    return [*(bindir / p for p in _PGVECTOR_PROGRAMS), tree / stamp["vector_so"], tree / stamp["vector_control"],
            tree / stamp["pkglibdir"] / "dict_snowball.so"]


def tree_bindir(tree: Path) -> Path:
    """Where a pgvector server tree's programs are."""
    from memactors.testing.pgvector_build import read_stamp

    stamp = read_stamp(tree)
    if stamp is None:
        raise RuntimeError(f"{tree} is not a pgvector server tree (no stamp): `make postgres` builds one")
    bindir = stamp["bindir"]
    if not isinstance(bindir, str):
        raise RuntimeError(f"{tree}'s stamp names no bindir: `python -m memactors.testing.pgvector_build --force` rebuilds it")
    return tree / bindir


def pgvector_install() -> Path:
    """The server tree with pgvector that `make postgres` builds (`memactors.testing.pgvector_build`:
    Debian's PostgreSQL with a portable pgvector, in ``<virtualenv>/pgvector``). Raises RuntimeError
    naming the command, or the file the tree lacks, when there is no such server here."""
    from memactors.testing.pgvector_build import tree_path

    root = tree_path()
    missing = [str(f) for f in _tree_files(root) if not f.exists()]
    if missing:
        raise RuntimeError(f"the pgvector server tree at {root} lacks {', '.join(missing)}: rebuild it with "
                           "`make postgres`")
    return root


def _postgres_can_use(paths: list[Path]) -> bool:
    """Whether the `postgres` user can reach and run (or read) each of `paths`."""
    checks = " && ".join(f"test -{'x' if os.access(p, os.X_OK) and p.is_file() else 'r'} '{p}'" for p in paths)
    done = subprocess.run(["runuser", "-u", "postgres", "--", "sh", "-c", checks], capture_output=True, timeout=30,
                          check=False)
    return done.returncode == 0


def _cluster_root(as_postgres: bool) -> Path:
    """A new directory for one cluster: in the temporary directory, unless (under root) the `postgres`
    user cannot enter that — a 0700 TMPDIR (pam_tmpdir's /tmp/user/0, or a /tmp made 0700) — then in
    /var/tmp."""
    base = tempfile.gettempdir()
    if as_postgres:
        done = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", base], capture_output=True,
                              timeout=30, check=False)
        if done.returncode != 0:
            base = "/var/tmp"
    return Path(tempfile.mkdtemp(prefix="memactors-pg-", dir=base))




def _stage(install: Path, into: Path) -> Path:
    """The server tree `install` copied to `into` (hard links where it can), layout kept (PostgreSQL
    finds its lib and share directories relative to its programs); returns the staged tree."""
    shutil.copytree(install, into, symlinks=True, copy_function=link_or_copy)
    for directory, _, _ in os.walk(into):
        os.chmod(directory, 0o755)
    return into


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


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

    def __init__(self, *, durable: bool = False, extra: tuple[str, ...] = (), pgvector: bool = False,
                 install: Path | None = None, primary: Cluster | None = None) -> None:
        #: The pgvector server tree this cluster's server comes from (``pgvector=True``), else None.
        self.install = (install or pgvector_install()) if pgvector or install is not None else None
        self.bindir = tree_bindir(self.install) if self.install is not None else server_bindir()
        self._as_postgres = os.geteuid() == 0
        self.root = _cluster_root(self._as_postgres)
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.password = f"pw-{secrets.token_hex(12)}"
        self.durable = durable
        self.extra = extra
        self._running = False
        self._databases = 0
        if primary is not None:  # a standby: the primary's roles, so its password
            self.password = primary.password
        try:
            self._init() if primary is None else self._init_standby(primary)
        except BaseException:  # ok: a half-started cluster is stopped and removed, then the error goes on
            self.close()
            raise

    # -- process control ---------------------------------------------------------------------------
    def _run(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run one of the server's programs (as `postgres` under root). A failure raises RuntimeError
        with what the program said, and the server log's last lines: a test fails naming the cause."""
        cmd = list(argv)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()[-5:]
            log: list[str] = []
            with contextlib.suppress(OSError):
                log = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"PostgreSQL's {Path(argv[0]).name} ({self.bindir}) failed with exit "
                               f"{done.returncode}: {' | '.join(said) or 'no output'}"
                               + (f"; server log: {' | '.join(log)}" if log else ""))
        return done

    def _init(self) -> None:
        self.sockets.mkdir()
        if self._as_postgres:
            info = pwd.getpwnam("postgres")
            for path in (self.root, self.sockets):
                os.chown(path, info.pw_uid, info.pw_gid)
        os.chmod(self.root, 0o755)
        if self.install is not None and self._as_postgres:
            if not _postgres_can_use(_tree_files(self.install)):  # e.g. a virtualenv under /root
                self.install = _stage(self.install, self.root / "server")
                self.bindir = tree_bindir(self.install)
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

    def _init_standby(self, primary: Cluster) -> None:
        """This cluster as a streaming standby of `primary`: a base backup with WAL streamed and
        ``standby.signal`` + ``primary_conninfo`` written (`-R`), on its own port and socket directory."""
        self.sockets.mkdir()
        if self._as_postgres:
            info = pwd.getpwnam("postgres")
            for path in (self.root, self.sockets):
                os.chown(path, info.pw_uid, info.pw_gid)
        os.chmod(self.root, 0o755)
        self._run(str(self.bindir / "pg_basebackup"), "-h", str(primary.sockets), "-p", str(primary.port),
                  "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync")
        # The copied postgresql.conf is the primary's: later lines win, so this cluster's port and
        # sockets go last (postgresql.auto.conf is the primary's ALTER SYSTEM, made before any here).
        self._append(self.data / "postgresql.conf",
                     f"port = {self.port}\nunix_socket_directories = '{self.sockets}'\nhot_standby = on\n")
        self.start()

    def standby(self, *, synchronous: bool = False) -> Cluster:
        """A new cluster streaming from this one (see the module docstring). ``synchronous``: this
        primary's commits wait until the standby has flushed them (``synchronous_standby_names = '*'``,
        ``synchronous_commit = on``), so whatever it acknowledged survives its loss; otherwise they
        stream asynchronously (the last commits before a crash may be lost)."""
        standby = Cluster(durable=self.durable, install=self.install, primary=self)
        if synchronous:
            # After the base backup, so the standby (a primary once promoted) does not wait for a standby
            # of its own that does not exist.
            self.admin("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.admin("ALTER SYSTEM SET synchronous_commit = 'on'")
            self.admin("SELECT pg_reload_conf()")
            standby.wait_streaming(self, synchronous=True)
        return standby

    def wait_streaming(self, primary: Cluster, *, synchronous: bool = False, timeout: float = 60) -> None:
        """Wait until `primary` shows this standby streaming (``sync`` when `synchronous`)."""
        import time

        deadline = time.monotonic() + timeout
        want = "sync" if synchronous else None
        while True:
            rows = primary.admin("SELECT state, sync_state FROM pg_stat_replication")
            if any(state == "streaming" and (want is None or sync == want) for state, sync in rows):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby on port {self.port} is not streaming from {primary.port}: {rows}")
            time.sleep(0.1)  # ok: a blocking test helper (called through a thread), polls the primary's view of its standbys

    def promote(self) -> None:
        """Promote this standby to a primary (`pg_ctl promote`, waiting until it accepts writes)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def follow(self, primary: Cluster) -> None:
        """Make this (stopped, cleanly shut down) former primary a standby of `primary` — a switchover:
        it restarts in recovery and streams `primary`'s new timeline."""
        self._append(self.data / "postgresql.auto.conf",
                     f"primary_conninfo = 'host={primary.sockets} port={primary.port} user=postgres'\n"
                     "recovery_target_timeline = 'latest'\nsynchronous_standby_names = ''\n")
        self._run("touch", str(self.data / "standby.signal"))

    def kill(self) -> None:
        """kill -9 the server: its postmaster and every process it started (as a host that dies takes
        them all); the kernel closes their sockets. Waits until they are gone."""
        import signal
        import time

        pid = int((self.data / "postmaster.pid").read_text(encoding="utf-8").split()[0])
        children = Path(f"/proc/{pid}/task/{pid}/children")
        pids = [pid, *(int(c) for c in children.read_text().split())] if children.exists() else [pid]
        for one in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(one, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{one}").exists() and _alive(one) for one in pids) and time.monotonic() < deadline:
            time.sleep(0.02)  # ok: a blocking test helper (called through a thread), polls the processes' state
        self._running = False

    def failover_url(self, standby: Cluster, dbname: str) -> str:
        """A libpq multi-host URL naming this server and `standby`, asking for the read-write one."""
        return (f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port},127.0.0.1:{standby.port}/{dbname}"
                "?target_session_attrs=read-write")

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
