"""``memactors hook gemini-cli …`` and ``memactors hook opencode …``: what a resident Gemini CLI or OpenCode runs
at a session's start and end (issue 26), as ``memactors install`` wrote it into the agent's configuration.

- ``hook gemini-cli session-start``: Gemini CLI's ``SessionStart`` hook. Its stdout, ``{"hookSpecificOutput":
  {"hookEventName": "SessionStart", "additionalContext": <fenced briefing>}}``, is what Gemini CLI puts
  before the session's first prompt (headless: prepended to the prompt, inside ``<hook_context>``).
- ``hook gemini-cli session-end``: Gemini CLI's ``SessionEnd`` hook; reads the session file its input names
  (``transcript_path``) into a run record (``agents.resident_sessions``).
- ``hook opencode session-start``: run by memactors' OpenCode plugin at a session's first model request;
  prints the fenced briefing, which the plugin adds to the system prompt.
- ``hook opencode session-end``: run by the plugin when OpenCode exits, the session's parts on stdin.

The briefing comes from the gateway with the resident's own token, read from the file install wrote
(never from argv), as ``hook claude-code session-start`` does (REQ-15's tool semantics); the daemon down
or slow gives nothing at once, counted for doctor. A record the daemon cannot take now is spooled, as
``hook claude-code session-end`` does. Every hook exits 0 on those paths: a session never waits or fails
for memactors; Gemini CLI's stdout carries nothing but the hook's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._core import CliError, load

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``gemini-cli`` and ``opencode`` to ``memactors hook`` (``cli.agents`` makes that group)."""
    hook = sub.choices["hook"]
    [groups] = [a for a in hook._actions if isinstance(a, argparse._SubParsersAction)]
    for agent, start_help, end_help in (
            ("gemini-cli", "SessionStart hook: this resident's briefing, fenced, as the session's additional context",
             "SessionEnd hook: the session file (transcript_path) as a run record"),
            ("opencode", "run by memactors' OpenCode plugin: print this resident's briefing, fenced",
             "run by memactors' OpenCode plugin at exit: the session's parts (stdin) as a run record")):
        events = groups.add_parser(agent, help=f"{agent} hooks").add_subparsers(dest="hook_event", required=True)
        p = events.add_parser("session-start", help=start_help)
        p.add_argument("--harness", required=True, help="the [harness.<name>] the resident runs as")
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--project", metavar="DIR", help="installed with --project DIR (its token is read there)")
        where.add_argument("--user", action="store_true", help="installed with --user")
        if agent == "opencode":
            p.add_argument("--resume", action="store_true",
                           help="a session OpenCode did not create now: its earlier briefing is served")
        p.set_defaults(fn=cmd_session_start, agent=agent)
        p = events.add_parser("session-end", help=end_help)
        p.add_argument("--harness", help="the [harness.<name>] the session belongs to (default: $MEMACTORS_HARNESS)")
        p.set_defaults(fn=cmd_session_end, agent=agent)


# -- session start -------------------------------------------------------------------------------------------

def _gateway(args: argparse.Namespace) -> tuple[str, str]:
    """(gateway URL, token) of the memactors server entry install wrote for this place."""
    from ._agentfiles_more import gemini_file, opencode_file

    project = Path(args.project) if args.project else None
    path, key = ((gemini_file(project, os.environ), "mcpServers") if args.agent == "gemini-cli"
                 else (opencode_file(project, os.environ), "mcp"))
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))[key]["memactors"]
        url, header = entry["url"], entry["headers"]["Authorization"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"{path} has no memactors server (run `memactors install {args.agent}`)") from None
    return str(url), str(header).removeprefix("Bearer ").strip()


def _hook_input() -> dict[str, Any]:
    try:
        data = json.loads(sys.stdin.read() or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def cmd_session_start(args: argparse.Namespace) -> int:
    """Print the briefing (Gemini CLI: as its hook JSON); on any failure nothing, exit 0, failure counted."""
    from ..agents.prompt import fence_briefing
    from ..agents.session_start import BriefingUnavailable, additional_context, fetch_briefing, record_failure

    if args.agent == "gemini-cli":
        source = _hook_input().get("source")
        refresh = source in (None, "startup", "clear")  # resume: the session's own briefing, already composed
    else:
        refresh = not args.resume
    try:
        url, token = _gateway(args)
        text = fetch_briefing(url, token, refresh=refresh)
    except (BriefingUnavailable, RuntimeError) as exc:
        try:
            from ._core import config_for

            record_failure(config_for(args, "read").store.path, harness=args.harness, error=str(exc),
                           at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"))
        except Exception:  # noqa: BLE001 -- ok: counting must never stop a session from starting
            pass
        print(f"memactors: no briefing at session start: {exc}", file=sys.stderr)
        return 0
    if text.strip():
        fenced = fence_briefing(text)
        print(additional_context(fenced) if args.agent == "gemini-cli" else fenced)
    return 0


# -- session end ---------------------------------------------------------------------------------------------

def _record(args: argparse.Namespace, harness: str, hook: dict[str, Any]) -> dict[str, Any]:
    from ..agents.resident_sessions import gemini_session, opencode_session, resident_record
    from ..errors import InvalidArgument
    from ..store import iso
    from .agents import harness_config

    cfg = harness_config(load(args), harness)
    now = iso(datetime.now(UTC))
    if args.agent == "gemini-cli":
        for field in ("session_id", "transcript_path"):
            if not isinstance(hook.get(field), str) or not hook[field]:
                raise InvalidArgument(f"the hook input has no {field}", field=field)
        try:
            with open(hook["transcript_path"], encoding="utf-8", errors="replace") as f:
                session = gemini_session(f)
        except OSError as exc:
            raise InvalidArgument(f"cannot read transcript_path: {exc.strerror}", field="transcript_path") from None
        transcript, started, ended = session.transcript, session.started_at, session.ended_at
        session_id, cwd = str(hook["session_id"]), str(hook.get("cwd") or os.getcwd())
    else:
        if not isinstance(hook.get("session_id"), str) or not hook["session_id"]:
            raise InvalidArgument("the plugin's input has no session_id", field="session_id")
        transcript, started, ended = opencode_session(hook)
        session_id, cwd = hook["session_id"], str(hook.get("directory") or os.getcwd())
    return resident_record(transcript, harness=harness, adapter=args.agent, cfg=cfg, session_id=session_id,
                           cwd=cwd, started_at=started or now, ended_at=ended or now)


def cmd_session_end(args: argparse.Namespace) -> int:
    """The session's run record → IngestRun; spooled when no daemon answers. Nothing on stdout."""
    from ..errors import InvalidArgument
    from .agents import _hook_call, _send_spool_quietly, _spool_record

    harness = args.harness or os.environ.get("MEMACTORS_HARNESS")
    if not harness:
        raise InvalidArgument("the session's harness is unknown: pass --harness NAME or set MEMACTORS_HARNESS",
                              field="--harness")
    record = _record(args, harness, _hook_input())
    source = f"{args.agent} session-end {record['run_id']}"
    try:
        result = _hook_call(args, "IngestRun", {"record": record, "source": source})
    except CliError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        path = _spool_record(args, record, source)
        print(f"memactors: session {record['run_id']} spooled to {path} ({exc.message}); it is sent when "
              "the daemon is next reached (`memactors spool send`, the next session's hook, or daemon start)",
              file=sys.stderr)
        return 0
    detail = result.get("episode_id") or result.get("reason", "")
    print(f"memactors: session {record['run_id']}: {result.get('outcome')} {detail}".rstrip(), file=sys.stderr)
    _send_spool_quietly(args)
    return 0
