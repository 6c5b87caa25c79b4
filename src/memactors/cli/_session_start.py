"""``memactors hook claude-code session-start``: the SessionStart hook ``memactors install`` writes.

It reads the gateway URL and the resident's token from the files install wrote (``claude_files``: never
from argv, which ``ps`` shows), asks the gateway for the briefing (``agents/session_start.py``) and prints it
fenced as Claude Code's ``additionalContext``. Where Claude Code keeps its files is here, so ``_layout_claude``
(install's planning) and this hook agree without importing each other's neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["START_HELP", "TOKEN_ENV", "add_session_start", "brief_session", "claude_files",
           "cmd_hook_claude_session_start", "register_session_start"]

#: The variable a project's settings.local.json sets to the token and its .mcp.json header reads. Not
#: MEMACTORS_RUN_TOKEN: that one is a supervised run's own (adapters), which settings must not shadow.
TOKEN_ENV = "MEMACTORS_RESIDENT_TOKEN"


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def claude_files(project: Path | None, env: Mapping[str, str]) -> tuple[Path, Path]:
    """(the file holding the MCP server entry, the settings file) for Claude Code, per project or user."""
    if project is not None:
        return project / ".mcp.json", project / ".claude" / "settings.local.json"
    config_dir = env.get("CLAUDE_CONFIG_DIR")
    if config_dir:
        return Path(config_dir) / ".claude.json", Path(config_dir) / "settings.json"
    return _home(env) / ".claude.json", _home(env) / ".claude" / "settings.json"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8-sig")  # a BOM the user's file had is kept by install
    except OSError:
        return None


#: The help of a session-start hook whose agent prints the briefing as the session's additional context.
START_HELP = ("SessionStart hook: this resident's briefing, fenced, as the session's additional context "
              "(nothing when the daemon is down)")


def add_session_start(events: Any, fn: Callable[[argparse.Namespace], int], *, help: str = START_HELP,
                      **defaults: Any) -> None:
    """``memactors hook <agent> session-start --harness NAME (--project DIR | --user)``, for every agent: the
    arguments say which install's files hold the gateway and the token (never argv)."""
    p = events.add_parser("session-start", help=help)
    p.add_argument("--harness", required=True, help="the [harness.<name>] the resident runs as")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--project", metavar="DIR", help="installed with --project DIR (its token is read there)")
    where.add_argument("--user", action="store_true", help="installed with --user")
    p.set_defaults(fn=fn, **defaults)


def register_session_start(claude: Any) -> None:
    """``memactors hook claude-code session-start``: the SessionStart hook install writes."""
    add_session_start(claude, cmd_hook_claude_session_start)


def _resident_gateway(args: argparse.Namespace) -> tuple[str, str]:
    """(gateway URL, token) as install wrote them into Claude Code's files for this place."""
    project = Path(args.project) if args.project else None
    servers_path, settings_path = claude_files(project, os.environ)
    try:
        entry = json.loads(_read(servers_path) or "{}")["mcpServers"]["memactors"]
        url, header = entry["url"], entry["headers"]["Authorization"]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"{servers_path} has no memactors server (run `memactors install`)") from None
    token = str(header).removeprefix("Bearer ").strip()
    if token.startswith("${"):  # a project's .mcp.json reads it from settings.local.json's env
        token = os.environ.get(TOKEN_ENV) or ""
        if not token:
            try:
                token = json.loads(_read(settings_path) or "{}")["env"][TOKEN_ENV]
            except (ValueError, KeyError, TypeError):
                raise RuntimeError(f"{settings_path} has no {TOKEN_ENV}") from None
    return str(url), str(token)


def cmd_hook_claude_session_start(args: argparse.Namespace) -> int:
    """Claude Code's SessionStart hook: print the resident's briefing, fenced, as additionalContext."""
    return brief_session(args, _resident_gateway)


def _project_install(args: argparse.Namespace, hook: Any,
                     gateway: Callable[[argparse.Namespace], tuple[str, str]]) -> Path | None:
    """For a ``--user`` hook: the directory of the session (its ``cwd``, or one above it) where this agent
    has a ``--project`` install of its own, if any. Both hooks fire in such a session; the project's, the
    more specific, briefs it, so the user's stays silent (one briefing a session)."""
    if not getattr(args, "user", False):
        return None
    try:
        mine: tuple[str, str] | None = gateway(args)
    except (RuntimeError, OSError):
        mine = None
    cwd = hook.get("cwd") if isinstance(hook, dict) else None
    start = Path(cwd if isinstance(cwd, str) and cwd else os.getcwd())
    for place in (start, *start.parents):
        try:
            found = gateway(argparse.Namespace(**{**vars(args), "user": False, "project": str(place)}))
        except (RuntimeError, OSError):
            continue
        # The home directory's "project" file can be the user's own (Gemini CLI's ~/.gemini/settings.json,
        # Codex's ~/.codex/config.toml): the same install, whose token is the same.
        if found != mine:
            return place
    return None


def brief_session(args: argparse.Namespace, gateway: Callable[[argparse.Namespace], tuple[str, str]]) -> int:
    """A SessionStart hook (Claude Code's, Codex's, Gemini CLI's, OpenCode's): the hook input on stdin, the
    briefing from the gateway ``gateway(args)`` names (URL, token) for this install, printed fenced.

    Always exit 0 and never wait long: on any failure (no token, the daemon down or slow) it prints nothing
    — the session starts at once without a briefing — and the failure is counted for doctor. A ``--user``
    hook in a project with its own install of the agent leaves the session to that one's hook."""
    from datetime import UTC, datetime

    from ..agents.prompt import fence_briefing
    from ..agents.session_start import (
        BriefingUnavailable,
        additional_context,
        fetch_briefing,
        inside_a_run,
        record_failure,
    )

    if inside_a_run():
        return 0  # a `memactors run`: its prompt carries its briefing already (REQ-16)
    from ..errors import InvalidArgument
    from ._hook_io import read_stdin_json

    try:
        hook = read_stdin_json(empty={})
    except InvalidArgument:
        hook = {}  # the briefing does not depend on the input: a bad one only loses its `source`
    source = hook.get("source") if isinstance(hook, dict) else None
    if _project_install(args, hook, gateway) is not None:
        return 0
    try:
        url, token = gateway(args)
        # A new session (startup, /clear) gets its briefing composed afresh; resume and compact the
        # session's own, already composed (REQ-15: once per session).
        text = fetch_briefing(url, token, refresh=source in (None, "startup", "clear"))
    except (BriefingUnavailable, RuntimeError) as exc:
        try:
            from ._core import config_for

            state_dir = config_for(args, "read").store.path
            record_failure(state_dir, at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
                           harness=args.harness, error=str(exc))
        except Exception:  # noqa: BLE001 -- ok: counting must never stop a session from starting
            pass
        print(f"memactors: no briefing at session start: {exc}", file=sys.stderr)
        return 0
    if text.strip():
        print(additional_context(fence_briefing(text)))
    return 0
