"""``memactors hook gemini-cli …`` and ``memactors hook opencode …``: what a resident Gemini CLI or OpenCode runs
at a session's start and end (issue 26), as ``memactors install`` wrote it into the agent's configuration.

- ``hook gemini-cli session-start``: Gemini CLI's ``SessionStart`` hook. Its stdout, ``{"hookSpecificOutput":
  {"hookEventName": "SessionStart", "additionalContext": <fenced briefing>}}``, is what Gemini CLI puts
  before the session's first prompt (headless: prepended to the prompt, inside ``<hook_context>``).
- ``hook gemini-cli session-end``: Gemini CLI's ``SessionEnd`` hook; reads the session file its input names
  (``transcript_path``) into a run record (``agents.resident_sessions``).
- ``hook opencode session-start``: run by memactors' OpenCode plugin at a session's first model request, with
  ``{"source": "startup" | "resume"}`` on stdin; prints the same JSON, whose fenced briefing the plugin adds
  to the system prompt.
- ``hook opencode session-end``: run by the plugin when OpenCode exits, the session's parts on stdin.

The briefing comes from the gateway with the resident's own token, read from the file install wrote
(never from argv), by the same code as Claude Code's and Codex's session-start hooks (``_session_start.
brief_session``: REQ-15's tool semantics; the daemon down or slow gives nothing at once, counted for
doctor). The record goes the way theirs do (``agents.deliver_session``: the daemon, else the spool). Every
hook exits 0 on those paths: a session never waits or fails for memactors; stdout carries nothing but the
hook's JSON (Gemini CLI parses it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._core import load

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``gemini-cli`` and ``opencode`` to ``memactors hook`` (``cli.agents`` makes that group)."""
    from ._session_start import add_session_start

    hook = sub.choices["hook"]
    [groups] = [a for a in hook._actions if isinstance(a, argparse._SubParsersAction)]
    for agent, start_help, end_help in (
            ("gemini-cli", "SessionStart hook: this resident's briefing, fenced, as the session's additional context",
             "SessionEnd hook: the session file (transcript_path) as a run record"),
            ("opencode", "run by memactors' OpenCode plugin: print this resident's briefing, fenced",
             "run by memactors' OpenCode plugin at exit: the session's parts (stdin) as a run record")):
        events = groups.add_parser(agent, help=f"{agent} hooks").add_subparsers(dest="hook_event", required=True)
        add_session_start(events, cmd_session_start, help=start_help, agent=agent)
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


def cmd_session_start(args: argparse.Namespace) -> int:
    """The briefing as the hook's ``additionalContext``; on any failure nothing, exit 0, the failure counted."""
    from ._session_start import brief_session

    return brief_session(args, _gateway)


# -- session end ---------------------------------------------------------------------------------------------

def _record(args: argparse.Namespace, harness: str, hook: dict[str, Any]) -> dict[str, Any]:
    from ..agents.resident_sessions import gemini_session, opencode_session, resident_record
    from ..errors import InvalidArgument
    from ..store import iso
    from ._hook_io import open_transcript
    from .agents import harness_config

    cfg = harness_config(load(args), harness)
    now = iso(datetime.now(UTC))
    if args.agent == "gemini-cli":
        for field in ("session_id", "transcript_path"):
            if not isinstance(hook.get(field), str) or not hook[field]:
                raise InvalidArgument(f"the hook input has no {field}", field=field)
        with open_transcript(hook["transcript_path"]) as lines:
            session = gemini_session(lines)
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
    from .agents import deliver_session, hook_input, session_end_harness

    harness = session_end_harness(args)
    if harness is None:
        return 0
    record = _record(args, harness, hook_input())
    return deliver_session(args, record, f"{args.agent} session-end {record['run_id']}", out=sys.stderr)
