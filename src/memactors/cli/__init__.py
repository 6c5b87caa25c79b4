"""The `memactors` command line. Every operator command goes through MemoryService over the websocket
RPC (the CLI has no private path); `--json` prints the raw result for scripts. The top layer: it may
import anything below it, lazily, so each command loads only what it needs (tests/cli/test_cli.py).

One module per command group over one small shared core (`_core`: configuration, the daemon's address
and token, the RPC call, output, exit statuses): `runs` (runs ingest), `supervised` (run, runs
list|show|wait|cancel|logs), `memory` (REQ-19's memory
commands), `feeds` (facts, pull requests, presence, votes), `agents` (tokens, MCP client
configurations, hooks and the session spool for residents), `install` (install / uninstall a resident's
configuration), `ops` (serve, doctor, tui, completion), `describe` (a harness and its prompt source),
`store` (store migrate, and in `store_portable` export, import, backup and restore: the commands that work
on the store itself), `importing` (import git|claude-code|codex: past history sent as run records), `demo`
(the packaged example records into the running daemon), `service` (install / uninstall / status of the
daemon as a systemd user unit or a launchd agent).

The CLI finds the daemon the way the daemon finds its state: `--config` (before or after the
subcommand), else `$HARNESS_CONFIG`, else `$XDG_CONFIG_HOME/harness/harness.toml` (default
`~/.config/harness/harness.toml`); the state directory named there holds `daemon.json` (the addresses
actually bound) and the operator token files.

Start-up cost matters (`memactors --help` is typed by people): these modules import only the standard
library at the top; each command imports what it needs when it runs, so an RPC command never loads the
service, the store or the MCP SDK. `bench/cli_startup.py` measures it.

Exit codes (docs/operations.md has the table): 0 ok; 1 the command ran and reports a failure (doctor,
provider check, rejected records); 2 usage error (argparse); 3 daemon unavailable; 4 not found;
5 invalid argument or configuration; 6 permission denied or unauthenticated; 7 internal error;
8 the daemon is out of a resource (its disk is full); 130 interrupted (Ctrl-C). A daemon that is down
or a connection that drops is one line on stderr and exit 3, never a traceback (`_core.explain`).
"""

from __future__ import annotations

import sys

# First thing in the process's entry, before the command line's imports and parser: `memactors serve`
# keeps a SIGHUP from here on (a reload once the daemon serves), never SIGHUP's default action, which
# ends the process (`_hangup`).
from .._hangup import keep_for_serve

keep_for_serve(sys.argv[1:])

import argparse  # noqa: E402 -- after the SIGHUP disposition, on purpose
from collections.abc import Iterator, Sequence  # noqa: E402

from .._version import __version__  # noqa: E402
from . import (  # noqa: E402
    agents,
    demo,
    describe,
    feeds,
    importing,
    install,
    memory,
    ops,
    residents,
    runs,
    service,
    store,
)
from ._core import CODE_EXITS, EXIT_INVALID, EXIT_UNAVAILABLE, explain  # noqa: E402
from ._suggest import SuggestingParser  # noqa: E402

__all__ = ["CODE_EXITS", "EXIT_INVALID", "EXIT_UNAVAILABLE", "build_parser", "main", "subparsers"]


CONFIG_HELP = ("global harness.toml (default: $HARNESS_CONFIG, else $XDG_CONFIG_HOME/harness/harness.toml, "
               "else ~/.config/harness/harness.toml); accepted before or after the subcommand")



def subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under `parser` (itself included), each once."""
    seen: set[int] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())



def _config_everywhere(parser: argparse.ArgumentParser) -> None:
    """Let `--config` follow any subcommand too. Default SUPPRESS, so a subcommand that does not see it
    leaves the top-level value alone."""
    for p in subparsers(parser):
        if p is not parser and "--config" not in p._option_string_actions:
            p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP)



def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="memactors", description="Episodic memory and briefings for fleets of coding agents (SPEC-0030).",
        epilog="Exit codes: 0 ok, 1 the command reports a failure, 2 usage, 3 daemon unavailable, 4 not found, "
               "5 invalid argument or configuration, 6 permission denied, 7 internal error, 8 daemon out of a "
               "resource (disk full), 130 interrupted.")
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    parser.add_argument("--version", action="version", version=f"memactors {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (ops, runs, memory, feeds, agents, residents, install, describe, store, importing, demo, service):
        group.register(sub)
    _config_everywhere(parser)
    parser.set_defaults(root_parser=parser)  # `completion` completes the whole tree (cli.ops)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.fn(args))
    except SystemExit:
        raise
    except BaseException as exc:  # ok: the CLI's one edge; what it cannot explain is re-raised
        explained = explain(exc)
        hook_agent = getattr(args, "hook_agent", None)
        if explained is None and isinstance(exc, Exception) and hook_agent:
            # A hook runs inside the user's agent, which shows its stderr: a bug there is one line, not a
            # traceback, and the session goes on (cli/_hook_io.py reads its input the safe way).
            explained = 1, f"memactors: the {hook_agent} hook failed ({type(exc).__name__}: {exc})"
        if explained is None:
            raise
        status, line = explained
        if line:
            print(line, file=sys.stderr)
        return status
