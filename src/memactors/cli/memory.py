"""The `memory` group, as REQ-19 names it: `status`, `episodes`, `recall`, `briefing`, `forget`,
`provider check|schema`; and `provider serve-builtin` (REQ-11's provider over stdio)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..humanize import mb
from . import _core as core
from ._core import EXIT_FAILED, JSON_HELP, CliError, call, confirm
from ._readable import readable

#: `memory status` exit codes (docs/operations.md): the daemon answered, but its provider is down / incompatible.
EXIT_PROVIDER_DOWN = 10


EXIT_PROVIDER_INCOMPATIBLE = 11
#: ... the provider is up, but recall is degraded: its breaker is open, or the last recalls in a row
#: came back without episodes.
EXIT_DEGRADED = 15
#: ... the store cannot write: its disk is full (ingests and records are refused).
EXIT_STORE_UNWRITABLE = 16


def status_exit(st: dict[str, Any]) -> int:
    """`memory status`'s exit code from the Status document (docs/operations.md): the worst problem."""
    code = {"down": EXIT_PROVIDER_DOWN, "incompatible": EXIT_PROVIDER_INCOMPATIBLE}.get(st["state"], 0)
    if code:
        return code
    if not (st.get("store") or {}).get("writable", True):
        return EXIT_STORE_UNWRITABLE
    return EXIT_DEGRADED if st.get("degraded") else 0


def cmd_status(args: argparse.Namespace) -> int:
    st = call(args, "Status", {})
    code = status_exit(st)
    if args.json:
        core.print_json(st)
        return code
    info = st.get("provider_info") or {}
    print(f"provider   {st['provider']} ({st['transport']})  {info.get('name', '')} {info.get('version', '')}".rstrip())
    # The provider's real state: the breaker only for a ready provider (one that is down never reaches
    # it, so it would say "closed" through any outage), else since when and the last error.
    condition = st.get("condition") or f"{st['state']}, breaker {st['breaker']}"
    print(f"state      {condition}  contract {st['contract']}")
    c = st["counts"]
    if c is not None:
        print(f"episodes   {c['live_episodes']} live, {c['episodes'] - c['live_episodes']} forgotten, "
              f"{c['indexed_ids']} indexed ids")
    p = st["pending"]
    if p is not None:
        print(f"pending    {p['records']} records, {p['forgets']} forgets; failed: {p['record_failed']} records, "
              f"{p['forget_failed']} forgets"
              + (f"; quarantined: {p['record_quarantined']} records (unreadable; see doctor)"
                 if p.get("record_quarantined") else ""))
    store = st.get("store")
    if store:
        free = store.get("free_bytes")
        state = ("UNREACHABLE" if not store.get("reachable", True) else "DAMAGED" if store.get("damaged")
                 else "writable" if store["writable"] else "NOT WRITABLE")
        print(f"store      {store.get('where') or store['path']}  {state}"
              + ("" if free is None else f", {mb(free)} free")
              + (f"  daemon {store['daemon_id']}" if store.get("daemon_id") else ""))
    emb = st.get("embeddings")
    if emb and emb.get("off"):
        fix = (emb.get("runtime") or {}).get("install_command")
        print(f"embeddings off: {emb['off']} (BM25 only" + (f"; install it: {fix}, then restart the daemon)" if fix else ")"))
    elif emb:
        runtime = emb.get("runtime") or {}
        where = ("embedded, " + ("loaded, " + f"{runtime['weights_mb']} MB of weights" if runtime.get("loaded")
                                 else "not loaded yet") if emb.get("source") == "embedded" else "model API")
        print(f"embeddings {emb['model']} ({where})  {emb['with_vector']} of {emb['episodes']} episodes"
              f" with a vector, {emb['pending']} pending")
    elif st.get("embeddings", 0) is None:
        print("embeddings off (BM25 only)")
    for i in st.get("installs") or ():
        print(f"install    {i['agent']} {i['scope']} ({i['harness']}): "
              + ("working" if i["ok"] else "SILENT") + f"; last session {i.get('last_session_at') or 'never'},"
              f" last briefing {i.get('last_briefing_at') or 'never'}")
    if code in (EXIT_PROVIDER_DOWN, EXIT_PROVIDER_INCOMPATIBLE):
        print(f"memactors: provider {st['provider']} is {st['state']} for {int(st['state_for_seconds'])} s: "
              f"{st.get('last_error') or 'no detail'}", file=sys.stderr)
    elif code == EXIT_STORE_UNWRITABLE and store.get("damaged"):
        print(f"memactors: {store.get('error')}", file=sys.stderr)
    elif code == EXIT_STORE_UNWRITABLE:
        print(f"memactors: store {store['path']} is not writable: {store.get('error')}; "
              f"{store.get('free_bytes')} bytes free", file=sys.stderr)
    elif code == EXIT_DEGRADED:
        print(f"memactors: recall is degraded: {st['degraded']}", file=sys.stderr)
    return code


def cmd_reindex(args: argparse.Namespace) -> int:
    """`memory reindex`: have the daemon embed every episode without a vector (`--all`: every episode
    again) and follow it with a progress bar on stderr until none is pending."""
    import time

    st = call(args, "Reindex", {"all": bool(args.all)}, tier="control")
    total = max(int(st.get("episodes", 0)), 1)
    started = time.monotonic()
    last = ""
    while True:
        done = int(st.get("with_vector", 0))
        width = 30
        filled = width * done // total
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{st.get('episodes', 0)} episodes embedded"
        if line != last and sys.stderr.isatty() or not last:
            print(line, end="", file=sys.stderr, flush=True)
        last = line
        if int(st.get("pending", 0)) == 0 and not st.get("running"):
            break
        if st.get("last_error"):
            print(f"\nmemactors: the embedder failed ({st['last_error']}); it tries again by itself; "
                  f"{st.get('pending')} episodes still without a vector", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(0.5)  # ok: the CLI is synchronous (no trio loop); polls the daemon twice a second
        st = call(args, "Status", {}).get("embeddings") or {}
    seconds = time.monotonic() - started
    print(f"\n{st.get('with_vector', 0)} of {st.get('episodes', 0)} episodes have a vector for {st.get('model')}"
          f" ({seconds:.1f} s)", file=sys.stderr)
    if args.json:
        core.print_json(st)
    return 0


def cmd_episodes(args: argparse.Namespace) -> int:
    if args.episode_id:
        ep = call(args, "GetEpisode", {"episode_id": args.episode_id})
        if args.json:
            core.print_json(ep)
        else:
            print(ep.get("text") or f"episode {ep['episode_id']} (forgotten {ep['forgotten_at']})", end="")
        return 0
    params: dict[str, Any] = {k: v for k, v in {"harness": args.harness, "repo": args.repo, "since": args.since,
                                                "after": args.after}.items() if v}
    params["limit"] = args.limit
    result = call(args, "ListEpisodes", params)
    core.notice(result)
    if args.json:
        core.print_json(result)
        return 0
    rows = result["episodes"]
    if not rows:
        print("no episodes")
    print_table([[r["episode_id"], r["started_at"][:19], r["harness"], r["run_id"], r["outcome"],
                  f"{r['repo']}@{r['branch']}", r.get("gist") or ""] for r in rows],
                ["EPISODE", "STARTED", "HARNESS", "RUN", "OUTCOME", "REPOSITORY", "WHAT WAS DONE"])
    total = result.get("total")
    if total is not None and rows:
        line = f"-- {len(rows)} shown of {total}"
        if result.get("next_cursor"):
            line += f"; next page: --after {result['next_cursor']}"
        print(line)
    return 0


#: Widest the last (free-text) column of a table is on a terminal; a pipe gets it whole.
TEXT_COLUMN = 80


def print_table(rows: list[list[str]], header: list[str]) -> None:
    """Rows in columns as wide as their widest cell (any run id: a UUID, 40 hex), a header above; the
    last column is free text, cut on a terminal."""
    if not rows:
        return
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    tty = sys.stdout.isatty()
    for row in [header, *rows]:
        last = str(row[-1])
        if tty and len(last) > TEXT_COLUMN:
            last = last[:TEXT_COLUMN - 1] + "…"
        print("  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + last)


def _no_harness_table(name: str, what: str = "--as") -> str:
    """The error for `--as NAME` (or a briefing preview of NAME) without a `[harness.NAME]` table:
    episodes may well list the harness (runs record their harness name), but only a configured table
    says what it sees."""
    subject = f"--as {name}" if what == "--as" else f"a briefing for {name}"
    hint = "\nor recall as the repository: --repo forge.example/acme/api" if what == "--as" else ""
    return (f"{subject} needs a [harness.{name}] table in the global harness.toml (episodes may list "
            f"{name}, but only a configured harness has a view); for example:\n"
            f"  [harness.{name}]\n  harness = \"claude-code\"\n  workdir = \"~/src/api\"{hint}")


def _for_people(args: argparse.Namespace) -> bool:
    """The human format: asked for (`--human`), or by default on a terminal; `--raw` (and any pipe or
    file, which scripts read) gets the agent's document byte for byte."""
    if args.raw:
        return False
    return bool(args.human) or sys.stdout.isatty()


def cmd_recall(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"query": args.query, "limit": args.limit}
    if args.repo:
        params["repo"] = args.repo
    if args.as_harness:
        params["as"] = args.as_harness
    if args.paths:
        params["paths"] = args.paths
    try:
        result = call(args, "Recall", params)
    except CliError as exc:
        if exc.code == "INVALID_ARGUMENT" and args.as_harness and "params.as names no configured" in exc.message:
            raise CliError(exc.code, _no_harness_table(args.as_harness)) from None
        raise
    core.notice(result)
    if args.json:
        core.print_json(result)
        return 0
    if _for_people(args) and result.get("structured") is not None:
        print(readable(result), end="")
        return 0
    if result.get("document") is not None:
        print(result["document"])
        return 0
    if result.get("degraded"):
        print(f"(degraded: {result['degraded']})")
    for item in result.get("episodes", []):
        print(f"- episode {item['episode_id']} · provider {item['provider']} · run {item['run_id']} · "
              f"harness {item['harness']} · {item['outcome']} · {item['repo']}@{item['branch']}")
        for line in item["text"].splitlines()[:12]:
            print(f"    {line}")
    if not result.get("episodes"):
        print("no episodes")
    return 0


def cmd_briefing(args: argparse.Namespace) -> int:
    """`memory briefing H`: the operator preview (GetBriefing) — no cache, no exposure."""
    try:
        result = call(args, "GetBriefing", {"harness": args.harness})
    except CliError as exc:
        if exc.code == "INVALID_ARGUMENT" and "params.harness names no configured" in exc.message:
            raise CliError(exc.code, _no_harness_table(args.harness, "briefing")) from None
        raise
    if args.json:
        core.print_json(result)
        return 0
    if _for_people(args) and result.get("structured") is not None:
        print(f"Briefing for {result['harness']}: what it would get now", end="\n\n")
        print(readable(result) if result["document"] else "(empty: nothing to brief yet)\n", end="")
        return 0
    if result["document"]:
        print(result["document"])
    else:
        print(f"(empty briefing for {result['harness']})")
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    if not confirm(f"Forget episode {args.episode_id} everywhere (stored text, summary and every provider's "
                   "copies)? This cannot be undone.", assume_yes=args.yes):
        print("not forgotten", file=sys.stderr)
        return EXIT_FAILED
    result = call(args, "Forget", {"episode_id": args.episode_id}, tier="control")
    if args.json:
        core.print_json(result)
        return 0
    print(f"forgotten {result['episode_id']} at {result['forgotten_at']}: {result['ids']} provider id(s),"
          f" {result['forgotten']} forgotten, {result['pending']} pending, {result['failed']} failed")
    return 0


def cmd_provider_check(args: argparse.Namespace) -> int:
    from ..conformance import CheckResult, ConformanceReport, format_report

    params = {"provider": args.provider} if args.provider else {}
    result = call(args, "CheckProvider", params, tier="control")
    if args.json:
        core.print_json(result)
    else:
        checks = tuple(CheckResult(**c) for c in result["checks"])
        fields = {k: result.get(k) for k in ("provider", "contract", "provider_name", "provider_version", "help")}
        print(format_report(ConformanceReport(checks=checks, unforgotten_ids=tuple(result.get("unforgotten_ids", ())),
                                              stderr_tail=tuple(result.get("stderr_tail") or ()), **fields)))
    return 0 if result["ok"] else 1


def cmd_provider_schema(args: argparse.Namespace) -> int:
    from ..contract import schema_document

    core.print_json(schema_document())
    return 0


def cmd_serve_builtin(args: argparse.Namespace) -> int:
    """The built-in provider over stdio on a store: `--db` (a SQLite file, or a PostgreSQL store URL),
    else the configured one (`[store] url` / MEMACTORS_STORE_URL, else the state directory's file)."""
    import trio

    from ..builtin.stdio import serve_builtin_stdio
    from ..config import store_url_problem
    from ..service import DB_NAME
    from ..store import is_store_url
    from ..urls import mask_url

    target: Path | str
    if args.db and "://" in args.db:  # a URL, never taken for a file name: only PostgreSQL's is a store
        if not is_store_url(args.db):
            raise CliError("INVALID_ARGUMENT", f"--db {mask_url(args.db)}: not a store: give a SQLite file path"
                                               " or a PostgreSQL URL (postgresql://user@host:5432/dbname)")
        reason = store_url_problem(args.db)
        if reason is not None:
            raise CliError("INVALID_ARGUMENT", f"--db {mask_url(args.db)}: {reason}")
        target = args.db
    elif args.db:
        target = Path(args.db)
    else:
        store = core.load(args).store
        target = store.url or store.path / DB_NAME
    trio.run(serve_builtin_stdio, target)
    return 0


def _register_providers(sub: Any, memory: Any) -> None:
    """`memory forget`, `memory provider check|schema` and `provider serve-builtin` (REQ-3, 4, 10, 11)."""
    p = memory.add_parser("forget", help="forget an episode everywhere (control tier); asks first")
    p.add_argument("episode_id", help="the episode to forget (ep_…, from `memory episodes`)")
    p.add_argument("--yes", "-y", action="store_true",
                   help="do not ask for confirmation (required when stdin is not a terminal)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_forget)

    prov = memory.add_parser("provider", help="the memory provider").add_subparsers(
        dest="provider_command", required=True)
    p = prov.add_parser("check", help="run the conformance suite (control tier); non-zero on any fail")
    p.add_argument("--provider", metavar="NAME", help="a global [mcp.<name>] upstream, or builtin")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_provider_check)
    p = prov.add_parser("schema", help="print the contract's JSON Schemas")
    p.set_defaults(fn=cmd_provider_schema)

    top = sub.add_parser("provider", help="memory providers").add_subparsers(dest="provider_command", required=True)
    p = top.add_parser("serve-builtin", help="serve the built-in provider over stdio (an [mcp.<name>] upstream)")
    p.add_argument("--stdio", action="store_true", required=True, help="serve over stdin/stdout (the only transport)")
    p.add_argument("--db", metavar="FILE|URL",
                   help="the store: a SQLite file or a postgresql:// URL (default: the configured store, "
                        "[store] url, else the state directory's memactors.db)")
    p.set_defaults(fn=cmd_serve_builtin)


def _output_flags(p: Any) -> None:
    """`--human`, `--raw`, `--json`: who reads the answer (default: a person on a terminal, else `--raw`)."""
    how = p.add_mutually_exclusive_group()
    how.add_argument("--human", action="store_true",
                     help="for a person: date, harness, outcome, what was done, files, one line of provenance "
                          "(the default when stdout is a terminal)")
    how.add_argument("--raw", action="store_true",
                     help="the exact document the agent reads (the default when stdout is not a terminal)")
    how.add_argument("--json", action="store_true", help=JSON_HELP)


def register(sub: Any) -> None:
    memory = sub.add_parser("memory", help="episodic memory").add_subparsers(dest="memory_command", required=True)
    p = memory.add_parser("status", help="provider, contract, state, counts, pending")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_status)

    p = memory.add_parser("reindex", help="embed the episodes without a vector now, with progress (--all: every one)")
    p.add_argument("--all", action="store_true",
                   help="embed every episode again (texts unchanged since come back from the cache)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_reindex)

    p = memory.add_parser("episodes", help="list episodes (newest first, paged), or show one by id")
    p.add_argument("episode_id", nargs="?", help="show this episode instead of listing")
    p.add_argument("--harness", help="only episodes of this harness")
    p.add_argument("--repo", help="only episodes of this repository (key, remote URL, or owner/name)")
    p.add_argument("--since", help="a duration back from now (7d, 12h) or an RFC 3339 time")
    p.add_argument("--limit", type=core.positive, default=100, help="episodes per page (default 100, at most 1000)")
    p.add_argument("--after", metavar="CURSOR", help="the next-page cursor printed by the previous page")
    p.add_argument("--json", action="store_true", help=JSON_HELP + " ({episodes, total, next_cursor})")
    p.set_defaults(fn=cmd_episodes)

    p = memory.add_parser("recall", help="recall as a repository or harness would")
    p.add_argument("query", help="words to recall by")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--repo", help="as this repository: key (forge.example/acme/api), remote URL, or owner/name")
    who.add_argument("--as", dest="as_harness", metavar="HARNESS",
                     help="as the harness configured in [harness.HARNESS] would")
    p.add_argument("--paths", nargs="+", metavar="P", help="paths the caller works on (boosts episodes touching them)")
    p.add_argument("--limit", type=core.positive, default=8, help="episodes at most (default 8)")
    _output_flags(p)
    p.set_defaults(fn=cmd_recall)

    p = memory.add_parser("briefing", help="preview the briefing a harness would receive now")
    p.add_argument("harness", help="a configured [harness.<name>]")
    _output_flags(p)
    p.set_defaults(fn=cmd_briefing)
    _register_providers(sub, memory)
