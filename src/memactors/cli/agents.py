"""CLI commands that connect agents memactors does not spawn (residents) to it.

- ``memactors token mint <harness>``: a run token for the gateway (control tier, ``MintRunToken``).
- ``memactors mcp-config <harness>``: the same token inside a ready-to-paste MCP client configuration
  (Claude Code's ``.mcp.json``, Cursor's ``mcp.json``, or plain JSON).
- ``memactors hook claude-code session-end``: Claude Code's ``SessionEnd`` hook; reads the hook input on
  stdin and ingests the session's transcript as a run record (control tier, ``IngestRun``). When no
  daemon answers, the record goes to the state directory's spool (``memactors.agents.spool``) instead, and is
  sent by the next hook that reaches the daemon, by ``memactors spool send``, or by the daemon at start.
- ``memactors hook codex session-end|session-start``: the same for Codex's ``SessionEnd`` and
  ``SessionStart`` hooks (``cli/_codex_hooks.py`` says which events and why): the session's rollout file
  becomes the run record.
- ``memactors spool [send]``: what the spool holds, and sending it now.

``memactors install`` / ``uninstall`` (``cli/install.py``) write these into an agent's own configuration
files. A resident gets its briefing only through the gateway's tool and resource (REQ-15): none of these
commands types anything into an agent, and the daemon never writes an agent's configuration itself.
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

from ._core import CliError, call, load, read_daemon_file

__all__ = ["client_config", "deliver_session", "register"]

#: The server name the gateway gets in client configurations (Claude Code shows ``mcp__memactors__recall``).
SERVER_NAME = "memactors"
DEFAULT_TTL = "7d"
FORMATS = ("claude-code", "codex", "cursor", "json")
#: The gateway's tools (gateway.GATEWAY_TOOLS, not imported: it would load the MCP SDK).
MEMORY_TOOLS = ("recall", "briefing")
#: What Claude Code's ``permissions.allow`` needs so a headless ``claude -p`` may call them.
CLAUDE_ALLOW = tuple(f"mcp__{SERVER_NAME}__{tool}" for tool in MEMORY_TOOLS)
#: The hook's own deadline for its RPC: shorter than the 30 s timeout its settings entry declares, so a
#: daemon that accepts but does not answer still leaves the hook time to spool the session.
HOOK_RPC_SECONDS = 15.0


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
                   help="claude-code (.mcp.json; the permissions.allow entries on stderr), codex (a config.toml "
                        "table), cursor (~/.cursor/mcp.json) or json (default: claude-code)")
    p.set_defaults(fn=cmd_mcp_config)

    hook = sub.add_parser("hook", help="agent hooks that record resident sessions").add_subparsers(
        dest="hook_agent", required=True)
    from ._codex_hooks import register_session_start as register_codex_session_start
    from ._session_start import register_session_start

    for agent, title, session_file, end, register_start in (
            ("claude-code", "Claude Code hooks", "transcript", cmd_hook_claude_session_end, register_session_start),
            ("codex", "Codex hooks", "rollout file", cmd_hook_codex_session_end, register_codex_session_start)):
        events = hook.add_parser(agent, help=title).add_subparsers(dest="hook_event", required=True)
        p = events.add_parser("session-end", help=f"SessionEnd hook: ingest the session's {session_file} as a run record")
        p.add_argument("--harness", help="the [harness.<name>] the session belongs to (default: $MEMACTORS_HARNESS)")
        p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON (outcome, episode)")
        p.set_defaults(fn=end)
        register_start(events)

    p = sub.add_parser("spool", help="sessions a hook spooled while the daemon was down (see `spool send`)")
    p.add_argument("--json", action="store_true", help="print {path, pending, rejected}")
    p.set_defaults(fn=cmd_spool)
    spool = p.add_subparsers(dest="spool_command")
    q = spool.add_parser("send", help="send the spooled sessions to the daemon now (control tier)")
    q.add_argument("--json", action="store_true", help="print the counts by outcome")
    q.set_defaults(fn=cmd_spool_send)


def _mint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("harness", help="a configured [harness.<name>]")
    p.add_argument("--run", metavar="ID", help="the run id the token speaks for (default: resident-<random>)")
    p.add_argument("--ttl", metavar="D", default=DEFAULT_TTL,
                   help=f"how long the token lives, a duration like 12h or 30d (default {DEFAULT_TTL})")
    p.add_argument("--workdir", metavar="DIR",
                   help="the directory the agent works in, for its repository (default: the current directory)")


def harness_config(config: Any, harness: str) -> Any:
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
    from ..errors import ConfigError

    config = load(args)
    harness_config(config, args.harness)
    try:
        ttl = parse_duration(args.ttl)
    except ConfigError as exc:  # name the flag (the message has the value and the limit)
        raise CliError("INVALID_ARGUMENT", f"--ttl {exc.message}") from None
    workdir = str(Path(args.workdir or os.getcwd()).resolve())
    run_id = args.run or f"resident-{secrets.token_hex(4)}"
    result = call(args, "MintRunToken", {"harness": args.harness, "run_id": run_id, "workdir": workdir,
                                         "ttl_seconds": ttl}, tier="control")
    return result, gateway_url(config)


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
    """The MCP client configuration for the gateway in ``fmt`` (one of :data:`FORMATS`; ``codex`` is the
    ``[mcp_servers.memactors]`` table as a dict, :func:`codex_toml` renders it)."""
    headers = {"Authorization": f"Bearer {token}"}
    if fmt == "claude-code":
        return {"mcpServers": {SERVER_NAME: claude_server(url, token)}}
    if fmt == "codex":
        return {"mcp_servers": {SERVER_NAME: codex_server(url, token)}}
    if fmt == "cursor":
        return {"mcpServers": {SERVER_NAME: {"url": url, "headers": headers}}}
    if fmt == "json":
        return {"name": SERVER_NAME, "transport": "streamable-http", "url": url, "headers": headers,
                "harness": harness, "run_id": run_id, "expires_at": expires_at,
                "tools": list(MEMORY_TOOLS), "claude_code_allow": list(CLAUDE_ALLOW)}
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def claude_server(url: str, token: str) -> dict[str, Any]:
    """The gateway's entry in Claude Code's ``mcpServers`` (``.mcp.json``, ``~/.claude.json``); ``token``
    may be a ``${VAR}`` reference, which Claude Code expands."""
    from ..adapters.kinds import kind

    return kind("claude-code").server(url, token)


def codex_server(url: str, token: str) -> dict[str, Any]:
    """The gateway's ``[mcp_servers.memactors]`` table in Codex's ``config.toml``. Codex runs `exec` (and
    any session started with approval policy never) without asking: a tool call that configuration does
    not approve is refused, so the memory tools are approved here."""
    from ..adapters.kinds import kind

    return kind("codex").server(url, token)


def gateway_url(config: Any) -> str:
    """The gateway URL the running daemon serves (its daemon.json), else the configured listen address's."""
    found = read_daemon_file(config.store.path) or {}
    return str(found.get("gateway") or f"http://{config.gateway.address}/mcp")


def codex_toml(config: dict[str, Any]) -> str:
    """``client_config("codex", …)`` as the ``config.toml`` text Codex reads (standard library only: the
    values are strings, so JSON string escapes are TOML basic strings)."""
    server = config["mcp_servers"][SERVER_NAME]
    headers = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in server["http_headers"].items())
    return (f"[mcp_servers.{SERVER_NAME}]\n"
            f"url = {json.dumps(server['url'])}\n"
            f"http_headers = {{ {headers} }}\n"
            f"default_tools_approval_mode = {json.dumps(server['default_tools_approval_mode'])}\n")


def cmd_mcp_config(args: argparse.Namespace) -> int:
    result, gateway = _mint(args)
    config = client_config(args.format, url=gateway, token=result["token"], harness=result["harness"],
                           run_id=result["run_id"], expires_at=result["expires_at"])
    if args.format == "codex":
        print(f"# memactors gateway for harness {result['harness']} (run {result['run_id']}, expires "
              f"{result['expires_at'] or 'never'}): add to $CODEX_HOME/config.toml (~/.codex/config.toml)")
        print(codex_toml(config), end="")
        return 0
    print(json.dumps(config, indent=2))
    if args.format == "claude-code":
        # stdout stays a valid .mcp.json; the permission a headless `claude -p` needs goes with it on stderr
        allow = json.dumps({"permissions": {"allow": list(CLAUDE_ALLOW)}})
        print(f"memactors: a headless session (claude -p) may call the memory tools only when they are allowed: "
              f"add {allow} to .claude/settings.local.json (or pass --allowedTools {' '.join(CLAUDE_ALLOW)}); "
              "`memactors install claude-code` writes both files", file=sys.stderr)
    return 0


def session_end_harness(args: argparse.Namespace) -> str | None:
    """The harness a session-end hook records the session as (``--harness``, else ``MEMACTORS_HARNESS``);
    None, said on stderr, inside a ``memactors run``, which the daemon records itself. Every agent's
    session-end hook starts here."""
    from ..agents.session_start import inside_a_run, not_recorded_here
    from ..errors import InvalidArgument

    run = inside_a_run()
    if run:
        print(not_recorded_here(run), file=sys.stderr)
        return None
    harness = args.harness or os.environ.get("MEMACTORS_HARNESS")
    if not harness:
        raise InvalidArgument("the session's harness is unknown: pass --harness NAME or set MEMACTORS_HARNESS",
                              field="--harness")
    return str(harness)


def hook_input() -> dict[str, Any]:
    """A hook's input on stdin: one JSON object, read the one bounded way (``_hook_io``), else
    InvalidArgument naming stdin."""
    from ..errors import InvalidArgument
    from ._hook_io import read_stdin_json

    data = read_stdin_json()
    if not isinstance(data, dict):
        raise InvalidArgument("the hook input on stdin must be a JSON object", field="stdin")
    return data


def cmd_hook_claude_session_end(args: argparse.Namespace) -> int:
    """Claude Code's SessionEnd hook input on stdin → the session's run record → IngestRun.

    Exit 0 when the record was ingested or deliberately skipped (IngestRun's outcome is printed); a
    missing harness, unreadable input or transcript is exit 2 with a message naming what is wrong.
    """
    from ..agents.transcript import read_claude_transcript, run_record_from_transcript
    from ..errors import InvalidArgument
    from ..store import iso
    from ._hook_io import open_transcript

    harness = session_end_harness(args)
    if harness is None:
        return 0
    cfg = harness_config(load(args), harness)
    hook = hook_input()
    for field in ("session_id", "transcript_path"):
        if not isinstance(hook.get(field), str) or not hook[field]:
            raise InvalidArgument(f"the hook input has no {field}", field=field)
    with open_transcript(hook["transcript_path"]) as lines:
        session = read_claude_transcript(lines, cfg.verify_patterns)
    record = run_record_from_transcript(
        session, harness=harness, fallback_session_id=hook["session_id"],
        fallback_cwd=str(hook.get("cwd") or os.getcwd()), ended_at=iso(datetime.now(UTC)))
    return deliver_session(args, record, f"claude-code session-end {hook['session_id']}")


def cmd_hook_codex_session_end(args: argparse.Namespace) -> int:
    """Codex's SessionEnd hook input on stdin → the session's rollout file → its run record → IngestRun
    (spooled when no daemon answers), as Claude Code's. A missing harness, unreadable input or rollout is
    exit 5 (invalid argument), naming what is wrong. Messages go to stderr, leaving stdout to Codex's
    hook protocol. Spooled first, then sent (:func:`_spool_then_send`): Codex stops the hook after 3 s."""
    from ..agents.codex_rollout import read_codex_rollout
    from ..agents.transcript import run_record_from_transcript
    from ..errors import InvalidArgument
    from ._codex_hooks import rollout_of
    from ._hook_io import open_transcript

    harness = session_end_harness(args)
    if harness is None:
        return 0
    cfg = harness_config(load(args), harness)
    hook = hook_input()
    if not isinstance(hook.get("session_id"), str) or not hook["session_id"]:
        raise InvalidArgument("the hook input must be a JSON object with a session_id", field="stdin")
    path = hook.get("transcript_path")
    rollout = Path(path) if isinstance(path, str) and path else rollout_of(hook["session_id"], os.environ)
    if rollout is None:
        raise InvalidArgument(f"session {hook['session_id']} has no rollout file (transcript_path is null and "
                              "none is under $CODEX_HOME/sessions)", field="transcript_path")
    with open_transcript(rollout) as lines:
        session = read_codex_rollout(lines, cfg.verify_patterns)
    record = run_record_from_transcript(
        session, harness=harness, fallback_session_id=hook["session_id"],
        fallback_cwd=str(hook.get("cwd") or os.getcwd()), ended_at=_now())
    record["adapter"] = "codex"
    return _spool_then_send(args, record, f"codex session-end {hook['session_id']}")


#: Codex gives a SessionEnd hook 3 s at most (0.169.0 and 0.171.0 clamp a longer timeout, "clamping SessionEnd
#: hook timeout to 3s") and stops it past that; the send after the spooling must end well before.
CODEX_SEND_SECONDS = 1.5


def _spool_then_send(args: argparse.Namespace, record: dict[str, Any], source: str) -> int:
    """Claude Code's rule (the daemon, else the spool) under Codex's 3 s: the record is spooled first, a
    local append that is durable before any network, and then the spool is sent (IngestRuns). A hook stopped
    while sending loses nothing: the next sender adopts what it had claimed, and ingest is idempotent. A daemon
    down or slow leaves it spooled, for the next session's hook, `memactors spool send` or the daemon's start."""
    path = _spool_record(args, record, source)
    try:
        counts = _send_spool(args, timeout=CODEX_SEND_SECONDS)
    except (CliError, OSError) as exc:
        print(f"memactors: session {record['run_id']} spooled to {path} ({getattr(exc, 'message', exc)}); it is "
              "sent when the daemon is next reached (`memactors spool send`, the next session's hook, or daemon "
              "start)", file=sys.stderr)
        return 0
    print(f"session {record['run_id']}: sent with the spool ({_tally(counts)})", file=sys.stderr)
    return 1 if counts.get("rejected") else 0


def deliver_session(args: argparse.Namespace, record: dict[str, Any], source: str, *, out: Any = None) -> int:
    """Hand a resident session's run record to the daemon (IngestRun), or spool it when no daemon answers;
    then send what earlier hooks spooled. Shared by every agent's session-end hook (Claude Code, Codex), so
    the spool-when-down rule is one rule. ``out``: where the one-line outcome goes (default stdout)."""
    out = out or sys.stdout
    try:
        result = _hook_call(args, "IngestRun", {"record": record, "source": source})
    except CliError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        path = _spool_record(args, record, source)
        # Exit 0: the session is kept, and Claude Code need not show the user a failed hook.
        print(f"memactors: session {record['run_id']} spooled to {path} ({exc.message}); it is sent when "
              "the daemon is next reached (`memactors spool send`, the next session's hook, or daemon start)",
              file=sys.stderr)
        return 0
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2, sort_keys=True), file=out)
    else:
        detail = result.get("episode_id") or result.get("reason", "")
        print(f"session {record['run_id']}: {result.get('outcome')} {detail}".rstrip(), file=out)
    _send_spool_quietly(args)
    return 0


def _now() -> str:
    """Now in the store's one text form of a time (``store.iso``), without importing the store: a quarter
    of a second of a hook's start-up, which Codex allows 3 s in all."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _hook_call(args: argparse.Namespace, method: str, params: dict[str, Any],
               timeout: float = HOOK_RPC_SECONDS) -> Any:
    """A control-tier call under the hook's own deadline (HOOK_RPC_SECONDS); UNAVAILABLE when no daemon."""
    from ..rpc.wsclient import WsRpcError, call_once
    from ._core import config_for, operator_url, token_for

    config = config_for(args, "control")
    token = token_for(config, "control")
    try:
        return call_once(operator_url(config), token, f"harness.v1.MemoryService/{method}", params,
                         timeout=timeout)
    except WsRpcError as exc:
        raise CliError(exc.code, f"{exc.code}: {exc.message}") from None


def _spool_record(args: argparse.Namespace, record: dict[str, Any], source: str) -> Path:
    """Keep the record in the state directory's spool (0600), redacted as an episode would be."""
    from ..agents import spool
    from ..redact import redact_obj

    state = load(args).store.path
    entry = {"record": redact_obj(record), "source": source, "spooled_at": _now()}
    try:
        return spool.append(state, entry)
    except OSError as exc:
        raise CliError("UNAVAILABLE", f"no daemon answered, and the session could not be spooled to "
                                      f"{spool.spool_path(state)}: {exc.strerror or exc}") from None


def _send_spool(args: argparse.Namespace, timeout: float = HOOK_RPC_SECONDS) -> dict[str, int]:
    """Send what the spool holds over IngestRuns; undelivered entries go back. Counts by outcome."""
    from ..agents import spool

    taken = spool.claim(load(args).store.path)
    if taken is None:
        return {}
    counts: dict[str, int] = {"unreadable": taken.unreadable} if taken.unreadable else {}
    refused: list[dict[str, Any]] = []
    sent = 0
    try:
        for batch, records in spool.batches(taken.entries):
            spool.tally(batch, _hook_call(args, "IngestRuns", {"records": records}, timeout)["results"], counts,
                        refused)
            sent += len(batch)
    finally:
        # What was not confirmed goes back (sending it again is harmless: ingest is idempotent).
        taken.done(undelivered=taken.entries[sent:], refused=refused)
    return counts


def _send_spool_quietly(args: argparse.Namespace) -> None:
    """After a hook reached the daemon: send earlier spooled sessions too; a failure here fails nothing."""
    try:
        counts = _send_spool(args)
    except (CliError, OSError) as exc:
        print(f"memactors: spooled sessions not sent yet: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return
    if counts:
        print(f"memactors: sent spooled session(s): {_tally(counts)}", file=sys.stderr)


def _tally(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none"


def cmd_spool(args: argparse.Namespace) -> int:
    """`memactors spool`: where the spool is and how many sessions wait in it (no daemon needed)."""
    from ..agents import spool

    state = load(args).store.path
    rejected = spool.rejected_path(state)
    info = {"path": str(spool.spool_path(state)), "pending": spool.pending(state),
            "rejected": spool.count_lines(rejected), "rejected_path": str(rejected)}
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(f"{info['pending']} session(s) spooled in {info['path']}"
              + (f"; {info['rejected']} refused by the daemon, kept in {rejected}" if info["rejected"] else ""))
    return 0


def cmd_spool_send(args: argparse.Namespace) -> int:
    """`memactors spool send`: exit 0 when everything spooled was sent (or nothing was), 1 when the daemon
    refused some (kept in the rejected file), 3 when no daemon answered (the spool is kept)."""
    counts = _send_spool(args)
    if args.json:
        print(json.dumps(counts, indent=2, sort_keys=True))
    else:
        print(f"spooled session(s) sent: {_tally(counts)}")
    return 1 if counts.get("rejected") or counts.get("unreadable") else 0
