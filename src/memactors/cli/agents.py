"""CLI commands that connect agents memactors does not spawn (residents) to it.

- ``memactors token mint <harness>``: a run token for the gateway (control tier, ``MintRunToken``).
- ``memactors mcp-config <harness>``: the same token inside a ready-to-paste MCP client configuration
  (Claude Code's ``.mcp.json``, Cursor's ``mcp.json``, or plain JSON).
- ``memactors hook claude-code session-end``: Claude Code's ``SessionEnd`` hook; reads the hook input on
  stdin and ingests the session's transcript as a run record (control tier, ``IngestRun``).

A resident gets its briefing only through the gateway's tool and resource (REQ-15): none of these
commands types anything into an agent.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._core import call, load, read_daemon_file

__all__ = ["client_config", "register"]

#: The server name the gateway gets in client configurations (Claude Code shows ``mcp__memactors__recall``).
SERVER_NAME = "memactors"
DEFAULT_TTL = "7d"
FORMATS = ("claude-code", "cursor", "json")


def register(sub: Any) -> None:
    """Add ``token``, ``mcp-config`` and ``hook`` to the top-level subcommands."""
    token = sub.add_parser("token", help="gateway run tokens for resident agents (control tier)").add_subparsers(
        dest="token_command", required=True)
    p = token.add_parser("mint", help="mint a run token the gateway accepts as Authorization: Bearer <token>")
    _mint_args(p)
    p.add_argument("--json", action="store_true", help="print {harness, run_id, token, expires_at, gateway}")
    p.set_defaults(fn=cmd_token_mint)

    p = sub.add_parser("mcp-config", help="print an MCP client configuration for a resident agent (mints a token)")
    _mint_args(p)
    p.add_argument("--format", choices=FORMATS, default="claude-code",
                   help="claude-code (.mcp.json), cursor (~/.cursor/mcp.json) or json (default: claude-code)")
    p.set_defaults(fn=cmd_mcp_config)

    hook = sub.add_parser("hook", help="agent hooks that record resident sessions").add_subparsers(
        dest="hook_agent", required=True)
    claude = hook.add_parser("claude-code", help="Claude Code hooks").add_subparsers(dest="hook_event", required=True)
    p = claude.add_parser("session-end", help="SessionEnd hook: ingest the session's transcript as a run record")
    p.add_argument("--harness", help="the [harness.<name>] the session belongs to (default: $MEMACTORS_HARNESS)")
    p.add_argument("--json", action="store_true", help="print IngestRun's result")
    p.set_defaults(fn=cmd_hook_claude_session_end)


def _mint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("harness", help="a configured [harness.<name>]")
    p.add_argument("--run", metavar="ID", help="the run id the token speaks for (default: resident-<random>)")
    p.add_argument("--ttl", metavar="D", default=DEFAULT_TTL,
                   help=f"how long the token lives, a duration like 12h or 30d (default {DEFAULT_TTL})")
    p.add_argument("--workdir", metavar="DIR",
                   help="the directory the agent works in, for its repository (default: the current directory)")


def _harness_config(config: Any, harness: str) -> Any:
    """The ``[harness.<name>]`` table, or an error naming the key and the configured harnesses."""
    from ..errors import ConfigError

    if harness not in config.harness:
        known = ", ".join(sorted(config.harness)) or "none configured"
        raise ConfigError(f'harness "{harness}" is not configured: add [harness.{harness}] to harness.toml'
                          f" (configured: {known})", key=f"harness.{harness}")
    return config.harness[harness]


def _mint(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Mint over MintRunToken; returns the result and the gateway URL the daemon serves."""
    from ..config import parse_duration

    config = load(args)
    _harness_config(config, args.harness)
    ttl = parse_duration(args.ttl)
    workdir = str(Path(args.workdir or os.getcwd()).resolve())
    run_id = args.run or f"resident-{secrets.token_hex(4)}"
    result = call(args, "MintRunToken", {"harness": args.harness, "run_id": run_id, "workdir": workdir,
                                         "ttl_seconds": ttl}, tier="control")
    found = read_daemon_file(config.store.path) or {}
    gateway = str(found.get("gateway") or f"http://{config.gateway.address}/mcp")
    return result, gateway


def cmd_token_mint(args: argparse.Namespace) -> int:
    result, gateway = _mint(args)
    if args.json:
        print(json.dumps({**result, "gateway": gateway}, indent=2, sort_keys=True))
    else:
        print(result["token"])
        print(f"run {result['run_id']} of {result['harness']}, expires {result['expires_at']}, gateway {gateway}",
              file=sys.stderr)
    return 0


def client_config(fmt: str, *, url: str, token: str, harness: str, run_id: str, expires_at: str | None
                  ) -> dict[str, Any]:
    """The MCP client configuration for the gateway in ``fmt`` (one of :data:`FORMATS`)."""
    headers = {"Authorization": f"Bearer {token}"}
    if fmt == "claude-code":
        return {"mcpServers": {SERVER_NAME: {"type": "http", "url": url, "headers": headers}}}
    if fmt == "cursor":
        return {"mcpServers": {SERVER_NAME: {"url": url, "headers": headers}}}
    if fmt == "json":
        return {"name": SERVER_NAME, "transport": "streamable-http", "url": url, "headers": headers,
                "harness": harness, "run_id": run_id, "expires_at": expires_at}
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def cmd_mcp_config(args: argparse.Namespace) -> int:
    result, gateway = _mint(args)
    print(json.dumps(client_config(args.format, url=gateway, token=result["token"], harness=result["harness"],
                                   run_id=result["run_id"], expires_at=result["expires_at"]), indent=2))
    return 0


def cmd_hook_claude_session_end(args: argparse.Namespace) -> int:
    """Claude Code's SessionEnd hook input on stdin → the session's run record → IngestRun.

    Exit 0 when the record was ingested or deliberately skipped (IngestRun's outcome is printed); a
    missing harness, unreadable input or transcript is exit 2 with a message naming what is wrong.
    """
    from ..errors import InvalidArgument
    from ..store import iso
    from ..transcript import read_claude_transcript, run_record_from_transcript

    harness = args.harness or os.environ.get("MEMACTORS_HARNESS")
    if not harness:
        raise InvalidArgument("the session's harness is unknown: pass --harness NAME or set MEMACTORS_HARNESS",
                              field="--harness")
    cfg = _harness_config(load(args), harness)
    try:
        hook = json.loads(sys.stdin.read() or "null")
    except ValueError as exc:
        raise InvalidArgument(f"the hook input on stdin is not JSON ({exc.msg} at line {exc.lineno})",
                              field="stdin") from None
    if not isinstance(hook, dict):
        raise InvalidArgument("the hook input on stdin must be a JSON object", field="stdin")
    for field in ("session_id", "transcript_path"):
        if not isinstance(hook.get(field), str) or not hook[field]:
            raise InvalidArgument(f"the hook input has no {field}", field=field)
    try:
        with open(hook["transcript_path"], encoding="utf-8", errors="replace") as f:
            session = read_claude_transcript(f, cfg.verify_patterns)
    except OSError as exc:
        raise InvalidArgument(f"cannot read transcript_path: {exc.strerror}", field="transcript_path") from None
    record = run_record_from_transcript(
        session, harness=harness, fallback_session_id=hook["session_id"],
        fallback_cwd=str(hook.get("cwd") or os.getcwd()), ended_at=iso(datetime.now(UTC)))
    result = call(args, "IngestRun", {"record": record, "source": f"claude-code session-end {hook['session_id']}"},
                  tier="control")
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        detail = result.get("episode_id") or result.get("reason", "")
        print(f"session {record['run_id']}: {result.get('outcome')} {detail}".rstrip())
    return 0
