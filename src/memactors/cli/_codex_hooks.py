"""Codex's hooks for a resident: where config.toml is, the tables install merges, the session-start hook.

Codex (0.169.0, the pinned one, and 0.171.0) runs command hooks declared in its ``config.toml`` (``[[hooks.<Event>]]``
tables, or a ``hooks.json`` beside it). Two of its events serve a resident:

- ``SessionEnd``: once, when the session's main thread ends (``codex exec`` when its run is done, the TUI when the
  user leaves). Its input on stdin names ``session_id``, ``transcript_path`` (the session's rollout file,
  ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``) and ``cwd``. The hook reads the rollout
  (``agents/codex_rollout.py``, the reader ``memactors import codex`` uses) into the run record — edited files,
  verify calls with their exit status, the last answer, the model — and hands it to the daemon, or spools it
  when no daemon answers (``memactors hook codex session-end``, in ``cli/agents.py`` beside Claude Code's, whose
  spool-when-down rule it shares: ``agents.deliver_session``).
- ``SessionStart``: before the session's first model request; what the hook prints as
  ``hookSpecificOutput.additionalContext`` Codex adds to the session as a developer message. The hook pulls this
  resident's briefing from the gateway with the token install wrote into the same ``config.toml``
  (``memactors hook codex session-start``, here; ``_session_start.brief_session``, shared with Claude Code's).

Why not Codex's ``notify`` program: it runs after every turn (``agent-turn-complete``), never at a session's
end, and a closed run is recorded once (the first record wins), so a turn-by-turn record would keep only the
first turn; ``notify`` is also one program per configuration, which a user's own would have to share.

Codex runs a hook only once the user has trusted its exact definition (``/hooks`` in the TUI; ``codex exec
--dangerously-bypass-hook-trust`` for automation that vets its hooks), and a project's hooks only in a trusted
project; ``install`` says so. Where Codex keeps its configuration is here (:func:`codex_config_path`), so
install's planning (``_layout_codex``) and these hooks agree. Standard library at the top (a hook's start-up is
part of every session's start and end); tomlkit only when install merges the tables.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["END_MARK", "START_MARK", "codex_config_path", "merge_hooks", "register_session_start",
           "rollout_of"]

#: Recognise the handlers install writes (whatever interpreter or --config they name).
END_MARK = "hook codex session-end"
START_MARK = "hook codex session-start"
#: Seconds Codex gives each handler (its ``timeout``). The session-start hook's own exchange with the gateway
#: gives up far sooner (agents/session_start.TIMEOUT_SECONDS). Codex allows a SessionEnd handler 3 s at most
#: (it clamps a longer timeout, with a warning; without one it allows 1 s): the session-end hook spools the
#: record first and then sends the spool (agents.CODEX_SEND_SECONDS).
START_TIMEOUT = 10
END_TIMEOUT = 3
_EVENTS = (("SessionStart", START_MARK, START_TIMEOUT), ("SessionEnd", END_MARK, END_TIMEOUT))


def codex_config_path(project: Path | None, env: Mapping[str, str]) -> Path:
    """Codex's ``config.toml`` for a project (``DIR/.codex/config.toml``) or the user (``$CODEX_HOME``, else
    ``~/.codex``)."""
    if project is not None:
        return project / ".codex" / "config.toml"
    codex_home = env.get("CODEX_HOME")
    if codex_home:
        return Path(codex_home) / "config.toml"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".codex" / "config.toml"


# -- install's part: the [[hooks.<Event>]] tables, merged with tomlkit ----------------------------------------

def _ours(handler: Any, mark: str) -> bool:
    return isinstance(handler, dict) and mark in str(handler.get("command", ""))


def merge_hooks(doc: Any, *, end_command: str, start_command: str) -> None:
    """Take memactors' handlers out of ``doc``'s ``hooks`` (a tomlkit document), then add a SessionStart group
    running ``start_command`` and a SessionEnd group running ``end_command`` (each when not empty). The user's
    own groups, handlers and events stay as they were; an event, or the ``hooks`` table, left empty goes."""
    import tomlkit
    from tomlkit.items import AoT

    from ._core import CliError

    hooks = doc.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise CliError("INVALID_ARGUMENT", "hooks in Codex's config.toml is not a table; nothing was changed")
    commands = {"SessionStart": start_command, "SessionEnd": end_command}
    for event, mark, timeout in _EVENTS:
        groups = hooks.get(event) if hooks is not None else None
        if groups is not None and not isinstance(groups, list):
            raise CliError("INVALID_ARGUMENT", f"hooks.{event} in Codex's config.toml is not a list of groups; "
                                               "nothing was changed")
        if hooks is not None and groups is not None:  # groups come from hooks
            for n in reversed(range(len(groups))):
                group = groups[n]
                handlers = group.get("hooks") if isinstance(group, dict) else None
                if not isinstance(handlers, list) or not any(_ours(h, mark) for h in handlers):
                    continue
                for k in reversed(range(len(handlers))):
                    if _ours(handlers[k], mark):
                        del handlers[k]
                if not handlers:
                    del groups[n]
            if not groups:
                del hooks[event]
        if commands[event]:
            created = hooks is None
            if hooks is None:
                hooks = tomlkit.table(is_super_table=True)
                doc["hooks"] = hooks
            handler = tomlkit.inline_table()
            handler.update({"type": "command", "command": commands[event], "timeout": timeout})
            handlers = tomlkit.array()
            handlers.append(handler)
            existing = hooks.get(event)
            if existing is not None and not isinstance(existing, AoT):  # the user's inline array of groups
                inline = tomlkit.inline_table()
                inline["hooks"] = handlers
                existing.append(inline)
                continue
            group = tomlkit.table()
            group["hooks"] = handlers
            if not created:
                # A blank line before a table added among others (tomlkit puts one before a new [hooks] only).
                group.trivia.indent = "\n"
            if existing is None:
                hooks[event] = tomlkit.aot()
            hooks[event].append(group)
    if hooks is not None and not hooks:
        del doc["hooks"]


# -- the hooks themselves ---------------------------------------------------------------------------------

def register_session_start(codex: Any) -> None:
    """``memactors hook codex session-start`` (``cli/agents.py`` registers ``session-end`` beside it)."""
    from ._session_start import add_session_start

    add_session_start(codex, cmd_hook_codex_session_start)


def rollout_of(session_id: str, env: Mapping[str, str]) -> Path | None:
    """The rollout file of ``session_id`` under ``$CODEX_HOME/sessions`` (for a hook input without a
    transcript_path: Codex sends null when it keeps no rollout)."""
    root = codex_config_path(None, env).parent / "sessions"
    found = sorted(root.glob(f"*/*/*/rollout-*-{session_id}.jsonl")) if session_id else []
    return found[-1] if found else None


def _resident_gateway(args: argparse.Namespace) -> tuple[str, str]:
    """(gateway URL, token) as install wrote them into Codex's config.toml for this place (never argv)."""
    import tomllib

    path = codex_config_path(Path(args.project) if args.project else None, os.environ)
    try:
        server = tomllib.loads(path.read_text(encoding="utf-8"))["mcp_servers"]["memactors"]
        url, header = server["url"], server["http_headers"]["Authorization"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"{path} has no [mcp_servers.memactors] with a token (run `memactors install codex`)"
                           ) from None
    return str(url), str(header).removeprefix("Bearer ").strip()


def cmd_hook_codex_session_start(args: argparse.Namespace) -> int:
    """Codex's SessionStart hook: the resident's briefing, fenced, as ``additionalContext``; nothing (at once)
    when the daemon is down or slow, and the failure counted for doctor."""
    from ._session_start import brief_session

    return brief_session(args, _resident_gateway)
