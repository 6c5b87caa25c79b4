"""`store export`, `store import` (memory as versioned JSON lines, `store.portable`) and `store backup`,
`store restore` (an online copy of the SQLite store, `store.backup`): docs/operations.md.

Not RPC commands: they read or write the store itself. `export` and `backup` read it while the daemon
serves (SQLite's WAL lets a reader in beside the writer). `import` into a SQLite store and `restore`
take the state directory's lock, as the daemon does, and refuse while a daemon holds it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _core as core
from ._core import EXIT_FAILED, EXIT_OK, JSON_HELP, CliError

if TYPE_CHECKING:
    from ..config import Config

DB_NAME = "memactors.db"


def _target(config: Config, given: str | None) -> Path | str:
    """The store a command works on: `given` (a SQLite path or a postgresql:// URL), else the daemon's."""
    from ..store import is_store_url

    if given:
        return given if is_store_url(given) else Path(given)
    return config.store.url or config.store.path / DB_NAME


def _lock(path: Path, what: str) -> int:
    """The state directory's lock for a SQLite store at `path` (its directory), or FAILED_PRECONDITION
    naming the daemon's pid."""
    from ..daemon import lock_state_dir
    from ..errors import ConfigError

    try:
        return lock_state_dir(path.parent)
    except ConfigError as exc:
        raise CliError("FAILED_PRECONDITION", f"{exc.message}; stop it before `store {what}`") from None


#: The state directory's file these commands' log lines go to (the store code logs as the daemon does).
LOG = "store-maintenance.log"


def _quiet_logs(config: Any) -> None:
    """The store code's log lines go to the state directory's store-maintenance.log, never the terminal
    (stdout carries the export), in the daemon's key=value format; ``MEMACTORS_LOG_LEVEL`` sets the level."""
    from ..logs import configure_logging

    config.store.path.mkdir(parents=True, exist_ok=True)
    configure_logging(os.environ.get("MEMACTORS_LOG_LEVEL", "INFO"), sink=str(config.store.path / LOG))


def cmd_export(args: argparse.Namespace) -> int:
    import trio

    from ..errors import MemactorsError
    from ..repo import repo_key
    from ..store.engines import open_store
    from ..store.portable import ExportFilter, export_lines
    from .importing import since_of

    config = core.load(args)
    target = _target(config, args.store)
    if isinstance(target, Path) and not target.exists():
        raise CliError("NOT_FOUND", f"no SQLite store at {target}")
    filt = ExportFilter(repo=repo_key(args.repo) if args.repo else None, since=since_of(args.since))
    _quiet_logs(config)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    line = core.StatusLine(sys.stderr.isatty())
    counts: dict[str, Any] = {}

    async def main() -> None:
        store = await open_store(target, daemon_id="export")
        try:
            n = 0
            async for text in export_lines(store, filt):
                out.write(text + "\n")
                n += 1
                if n % 1000 == 0:
                    line.show(f"{n} lines")
                if text.startswith('{"type":"end"'):
                    import json

                    counts.update(json.loads(text)["counts"])
        finally:
            store.close()

    try:
        trio.run(main)
    except MemactorsError as exc:
        raise CliError(exc.code, str(exc)) from None
    finally:
        line.clear()
        if out is not sys.stdout:
            out.close()
        else:
            sys.stdout.flush()
    print("exported " + ", ".join(f"{v} {k}(s)" for k, v in counts.items()), file=sys.stderr)
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    import trio

    from .._limits import MAX_IMPORT_LINE_BYTES
    from ..errors import MemactorsError
    from ..service.import_rows import check_row
    from ..store.engines import open_store
    from ..store.portable import PortableError, import_lines, read_lines

    config = core.load(args)
    target = _target(config, args.to)
    lock = _lock(target, "import") if isinstance(target, Path) else None
    bar = core.StatusLine(sys.stderr.isatty() and not args.json)
    source = sys.stdin if args.file == "-" else None
    try:
        if source is None:
            try:
                source = open(args.file, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
            except OSError as exc:
                raise CliError("NOT_FOUND", f"{args.file}: {exc.strerror}") from None
        _quiet_logs(config)

        async def main() -> Any:
            store = await open_store(target, daemon_id="import")
            try:
                return await import_lines(store, read_lines(source, MAX_IMPORT_LINE_BYTES),
                                          provider=config.memory.provider, check=check_row,
                                          limit=MAX_IMPORT_LINE_BYTES,
                                          progress=lambda n: bar.show(f"{n} lines imported"))
            finally:
                store.close()

        try:
            result = trio.run(main)
        except PortableError as exc:
            raise CliError("INVALID_ARGUMENT", f"{args.file}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise CliError("INVALID_ARGUMENT", f"{args.file}: not UTF-8 text ({exc.reason})") from None
        except MemactorsError as exc:
            raise CliError(exc.code, str(exc)) from None
    finally:
        bar.clear()
        if source is not None and source is not sys.stdin:
            source.close()
        if lock is not None:
            os.close(lock)
    summary = {"file": args.file, "added": result.added, "present": result.present, "forgotten": result.forgotten,
               "queued_for_provider": result.queued, "refused": result.refused, "cut_short": result.cut_short,
               "exported_at": result.header.get("exported_at"), "from_engine": result.header.get("engine")}
    if args.json:
        core.print_json(summary)
    else:
        added = ", ".join(f"{v} {k}(s)" for k, v in result.added.items()) or "nothing"
        present = sum(result.present.values())
        print(f"imported {added}; {present} already there; {result.forgotten} forgotten here as in the export; "
              f"{result.queued} episode(s) queued for the provider (recorded when the daemon runs); "
              f"{len(result.refused)} line(s) refused")
    for refused in result.refused[:REFUSALS_SHOWN]:
        print(f"memactors: {args.file}: line {refused['line']} refused"
              + (f" ({refused['type']})" if refused["type"] else "") + f": {refused['reason']}", file=sys.stderr)
    if len(result.refused) > REFUSALS_SHOWN:
        print(f"memactors: {args.file}: {len(result.refused) - REFUSALS_SHOWN} more line(s) refused "
              "(--json lists every one)", file=sys.stderr)
    if result.cut_short:
        raise CliError("INVALID_ARGUMENT", f"{args.file}: the file ends before its end line: it was cut short "
                       "(what it held is imported; import the whole file again)")
    return EXIT_FAILED if result.refused else EXIT_OK


#: Refused lines named on stderr (all of them are in --json).
REFUSALS_SHOWN = 20


def _sqlite_store(config: Config, what: str) -> Path:
    if config.store.url:
        raise CliError("FAILED_PRECONDITION", f"`store {what}` copies a SQLite store; this daemon's store is "
                       "PostgreSQL: use pg_dump or point-in-time recovery (docs/operations.md, Backup and restore)")
    return config.store.path / DB_NAME


def cmd_backup(args: argparse.Namespace) -> int:
    from ..store.backup import BackupError, backup_sqlite

    config = core.load(args)
    store = _sqlite_store(config, "backup")
    try:
        done = backup_sqlite(store, Path(args.path))
    except BackupError as exc:
        raise CliError("FAILED_PRECONDITION", str(exc)) from None
    if args.json:
        core.print_json({"path": str(done.path), "bytes": done.bytes, "seconds": round(done.seconds, 3),
                         "integrity": done.integrity})
    else:
        print(f"backed up {store} to {done.path} ({done.bytes} bytes, {done.seconds:.1f} s); "
              f"integrity_check: {done.integrity}")
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    from ..store.backup import BackupError, restore_sqlite

    config = core.load(args)
    store = _sqlite_store(config, "restore")
    lock = _lock(store, "restore")
    try:
        moved = restore_sqlite(Path(args.path), store)
    except BackupError as exc:
        raise CliError("FAILED_PRECONDITION", str(exc)) from None
    finally:
        os.close(lock)
    if args.json:
        core.print_json({"restored": str(args.path), "store": str(store), "previous": str(moved) if moved else None})
    else:
        print(f"restored {args.path} to {store}" + (f"; the store it replaced is {moved}" if moved else ""))
    return EXIT_OK


def register(store: Any) -> None:
    p = store.add_parser(
        "export", help="write episodes, runs, index rows, facts and tombstones as versioned JSON lines",
        description="Write the store's memory to stdout (or --output) as JSON lines: a header with the format's "
                    "version, then runs, their paths, episodes (forgotten ones as tombstones), index rows and "
                    "facts, then an end line. Works while the daemon serves. Import it with `store import`.")
    p.add_argument("--repo", metavar="KEY", help="only this repository's (key or remote URL; facts: its project scope)")
    p.add_argument("--since", metavar="WHEN", help="only what started since: a duration (90d) or an RFC 3339 time")
    p.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--store", metavar="PATH|URL", help="the store to read (default: the daemon's)")
    p.set_defaults(fn=cmd_export)

    p = store.add_parser(
        "import", help="read a `store export` file into a store (stop a SQLite store's daemon first)",
        description="Add an export's runs, episodes, index rows, facts and tombstones to the store (default: the "
                    "daemon's; --to another). What the store holds already wins: importing twice adds nothing. "
                    "A forgotten episode stays forgotten, and one the file says is forgotten is forgotten here. "
                    "Live episodes are queued for the configured provider and recorded when the daemon runs.")
    p.add_argument("file", metavar="FILE", help="the export (- for stdin)")
    p.add_argument("--to", metavar="PATH|URL", help="the store to write (a SQLite file or postgresql:// URL)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_import)

    p = store.add_parser(
        "backup", help="copy the SQLite store to PATH while the daemon serves, checked by integrity_check",
        description="An online, consistent copy of the SQLite store (SQLite's backup API): every transaction "
                    "committed before it began is in it. Written beside PATH and moved onto it only once PRAGMA "
                    "integrity_check says ok. PostgreSQL: use pg_dump or PITR (docs/operations.md).")
    p.add_argument("path", metavar="PATH", help="the backup file to write")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_backup)

    p = store.add_parser(
        "restore", help="put a backup in place of the SQLite store (refused while a daemon runs on it)",
        description="Check the backup (integrity_check), move the store aside (memactors.db.before-restore, with "
                    "its -wal and -shm) and put the backup in its place. Refused while a daemon holds the state "
                    "directory. Also the way back after an upgrade: migrations are forward-only.")
    p.add_argument("path", metavar="PATH", help="a file `store backup` wrote")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_restore)


__all__ = ["register"]
