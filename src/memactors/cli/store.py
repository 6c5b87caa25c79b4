"""The `store` group: `store migrate --to postgresql://…` (docs/fleet.md); `store export` /
`store import` (versioned JSON lines) and `store backup` / `store restore` (docs/operations.md),
in `store_portable`.

Not an RPC command: it moves the daemon's own store, so the daemon must not be running on it. It takes
the state directory's lock (as the daemon does) for the copy and refuses, naming the pid, while a
daemon holds it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from . import _core as core
from ._core import EXIT_FAILED, JSON_HELP, CliError


class _Bar(core.StatusLine):
    """`store migrate`'s progress: rows copied of rows to copy, and the table."""

    def __call__(self, table: str, done: int, total: int) -> None:
        self.show(f"{core.bar(done, total)} rows  {table}")


#: The file in the state directory that `store migrate`'s log lines go to.
MIGRATE_LOG = "store-migrate.log"


def _log_to_file(state_dir: Path) -> Path:
    """Route the log lines of the code `store migrate` runs in-process (opening both stores, applying
    PostgreSQL's migrations, the copy) to ``<state dir>/store-migrate.log`` in the daemon's key=value
    format, so stdout and stderr carry only the command's own lines (its report, its progress, its
    error) and never loguru's default lines among them. ``MEMACTORS_LOG_LEVEL`` sets the level."""
    import os

    from ..logs import configure_logging

    path = state_dir / MIGRATE_LOG
    state_dir.mkdir(parents=True, exist_ok=True)
    configure_logging(os.environ.get("MEMACTORS_LOG_LEVEL", "INFO"), sink=str(path))
    return path


def cmd_migrate(args: argparse.Namespace) -> int:
    import trio

    from ..builtin.index_pg import copy_vectors
    from ..config import store_url_problem
    from ..daemon import lock_state_dir
    from ..errors import ConfigError, MemactorsError
    from ..store import ensure_daemon_id
    from ..store.engines import open_store
    from ..store.migrate import migrate
    from ..urls import mask_url

    config = core.load(args)
    url = args.to
    reason = store_url_problem(url)  # also refuses anything but a PostgreSQL URL
    if reason is not None:
        raise CliError("INVALID_ARGUMENT", f"--to {mask_url(url)}: {reason}")
    state_dir = Path(args.source).parent if args.source else config.store.path
    source_path = Path(args.source) if args.source else config.store.path / "memactors.db"
    if not source_path.exists():
        raise CliError("NOT_FOUND", f"no SQLite store at {source_path} (use --from PATH)")
    try:
        lock = lock_state_dir(state_dir)
    except ConfigError as exc:
        raise CliError("FAILED_PRECONDITION", f"{exc.message}; stop it before `store migrate`") from None
    bar = _Bar(sys.stderr.isatty() and not args.json)
    log_path = _log_to_file(state_dir)

    async def main() -> list[Any]:
        source = await open_store(source_path, daemon_id="migrate")
        try:
            target = await open_store(url, daemon_id="migrate")
            try:
                return await migrate(source, target, source_id=ensure_daemon_id(state_dir),
                                     copy_vectors=copy_vectors, progress=bar)
            finally:
                target.close()
        finally:
            source.close()

    try:
        verified = trio.run(main)
    except MemactorsError as exc:
        raise CliError(exc.code, f"{exc} (its log: {log_path})") from None
    finally:
        bar.clear()
        import os

        os.close(lock)
    ok = all(v.ok for v in verified)
    if args.json:
        core.print_json({"source": str(source_path), "target": mask_url(url), "ok": ok,
                         "tables": [{"table": v.table, "source": v.source, "target": v.target, "ok": v.ok}
                                    for v in verified]})
    else:
        print(f"copied {source_path} to {mask_url(url)}")
        width = max(len(v.table) for v in verified) if verified else 5
        print(f"{'table':<{width}}  {'source':>8}  {'target':>8}")
        for v in verified:
            print(f"{v.table:<{width}}  {v.source:>8}  {v.target:>8}  {'ok' if v.ok else 'MISSING'}")
        print("verified: every source row is in the target" if ok else "NOT verified: rows are missing")
    return 0 if ok else EXIT_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    """`store check`: SQLite's ``PRAGMA integrity_check`` of the store file, read-only (the daemon may
    serve or be stopped): exit 0 when it says ok, else 1 with its findings and what to do."""
    from ..store.backup import integrity
    from ..store.sqlite import RECOVER
    from .store_portable import DB_NAME

    config = core.load(args)
    if config.store.url:
        raise CliError("FAILED_PRECONDITION", "`store check` checks a SQLite store; this daemon's store is "
                       "PostgreSQL: use amcheck / pg_amcheck on the server (docs/operations.md)")
    path = config.store.path / DB_NAME
    if not path.is_file():
        raise CliError("NOT_FOUND", f"store {path} does not exist")
    size = path.stat().st_size
    found = integrity(path) if size else "the file is empty (0 bytes): the daemon refuses to start on it"
    ok = found == "ok"
    if args.json:
        core.print_json({"path": str(path), "bytes": size, "ok": ok, "integrity": found})
    elif ok:
        print(f"store {path} ({size} bytes): integrity_check ok")
    else:
        print(f"store {path} ({size} bytes) is damaged: {found}", file=sys.stderr)
        print(f"memactors: {RECOVER.replace('check it with `memactors store check`; ', '')}", file=sys.stderr)
    return 0 if ok else EXIT_FAILED


def register(sub: Any) -> None:
    from . import store_portable

    store = sub.add_parser("store", help="the daemon's store: move it to PostgreSQL (docs/fleet.md); export, "
                                         "import, backup, restore").add_subparsers(
        dest="store_command", required=True, metavar="COMMAND")
    store_portable.register(store)
    p = store.add_parser(
        "check", help="check the SQLite store file page by page (integrity_check); exit 1 naming what is damaged",
        description="Run SQLite's PRAGMA integrity_check on the store file, read-only: safe while the daemon "
                    "serves and when it will not start. Exit 0 when it says ok, 1 with its findings and how to "
                    "restore a backup (`store restore`).")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_check)
    p = store.add_parser(
        "migrate", help="copy the SQLite store into a PostgreSQL one (stop the daemon first)",
        description="Copy every table of the SQLite store (the state directory's memactors.db, or --from) into "
                    "the PostgreSQL database of --to, keeping every id and time; the built-in provider's "
                    "documents are re-indexed there. Safe to run twice; several hosts' stores can be moved into "
                    "one database. Ends with a verification count per table. Then set [store] url (or "
                    "MEMACTORS_STORE_URL) to the same URL and start the daemon. Its log lines go to "
                    f"{MIGRATE_LOG} in the state directory, not to the terminal.")
    p.add_argument("--to", required=True, metavar="URL", help="postgresql://user[:password]@host:port/dbname")
    p.add_argument("--from", dest="source", metavar="PATH", help="the SQLite file (default: the state directory's)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_migrate)
