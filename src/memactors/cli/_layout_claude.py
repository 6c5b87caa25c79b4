"""Claude Code's files as `memactors install` / `uninstall` change them: its MCP server file and its settings.

==============  ===================================================  ======================================
scope           MCP server entry                                      allow-list, token, hook
==============  ===================================================  ======================================
--project DIR   ``DIR/.mcp.json`` (the header reads the token from    ``DIR/.claude/settings.local.json``:
                ``${MEMACTORS_RESIDENT_TOKEN}``: no secret in a file   ``env`` (the token), ``permissions.allow``,
                a project may commit)                                 ``enabledMcpjsonServers``, ``hooks.SessionEnd``
--user          ``~/.claude.json`` ``mcpServers`` (user scope, as     ``~/.claude/settings.json``:
                ``claude mcp add -s user`` writes it)                  ``permissions.allow``, ``hooks.SessionEnd``
==============  ===================================================  ======================================

``$CLAUDE_CONFIG_DIR`` moves Claude Code's user files (``.claude.json`` and ``settings.json`` both live
in it then), as it does for Claude Code itself; where they are is ``_session_start.claude_files``, which the
session-start hook reads too. Each merge keeps the user's other servers, permissions, hooks and keys as
they were. Standard library only (the CLI's start-up budget).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._core import CliError
from ._install_change import Change, Target
from ._jsonfile import dumps_like, loads_object, read_exact
from ._session_start import TOKEN_ENV, claude_files
from .agents import CLAUDE_ALLOW, claude_server
from .agents import SERVER_NAME as SERVER

__all__ = ["HOOK_MARK", "START_MARK", "plan_claude"]

#: Recognises the SessionEnd hook entry install writes (whatever interpreter or --config it names).
HOOK_MARK = "hook claude-code session-end"
#: Recognises the SessionStart hook entry install writes (the briefing at session start).
START_MARK = "hook claude-code session-start"
#: The SessionStart hook's declared timeout: its own exchange with the gateway gives up far sooner
#: (agents/session_start.TIMEOUT_SECONDS), so a daemon down or slow never holds a session up.
START_TIMEOUT = 10
#: Claude Code gives SessionEnd hooks 1.5 s in all unless one declares a timeout: the hook's start-up and
#: one RPC need more on a busy machine (it spools before its own 15 s RPC deadline).
HOOK_TIMEOUT = 30


def _json(path: Path, text: str | None) -> dict[str, Any]:
    return loads_object(path, text)


def _dump(data: dict[str, Any], like: str | None = None) -> str | None:
    return dumps_like(data, like) if data else None


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """``data[key]`` as an object (created when absent); a value of another type is an error naming it."""
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise CliError("INVALID_ARGUMENT", f"{path}: {key} is not an object; nothing was changed")
    return value


def _list(data: dict[str, Any], key: str, path: Path) -> list[Any]:
    value = data.setdefault(key, [])
    if not isinstance(value, list):
        raise CliError("INVALID_ARGUMENT", f"{path}: {key} is not a list; nothing was changed")
    return value


def _prune(data: dict[str, Any], *keys: str) -> None:
    """Drop ``keys`` from ``data`` when they hold an empty object or list (left so by an uninstall)."""
    for key in keys:
        if key in data and data[key] in ({}, []):
            del data[key]


def _is_our_hook(entry: Any, mark: str = HOOK_MARK) -> bool:
    return isinstance(entry, dict) and SERVER in str(entry.get("command", "")) and mark in str(
        entry.get("command", ""))


def _without_our_hooks(settings: dict[str, Any], path: Path) -> None:
    hooks = settings.get("hooks")
    if not isinstance(hooks, dict):
        return
    for event, mark in (("SessionEnd", HOOK_MARK), ("SessionStart", START_MARK)):
        if not isinstance(hooks.get(event), list):
            continue
        kept = []
        for group in hooks[event]:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                remaining = [h for h in group["hooks"] if not _is_our_hook(h, mark)]
                if not remaining:
                    continue
                group = {**group, "hooks": remaining}
            kept.append(group)
        hooks[event] = kept
        _prune(hooks, event)
    _prune(settings, "hooks")


def _claude_settings(path: Path, text: str | None, *, install: bool, hook_command: str, token: str | None,
                     project: bool, start_command: str = "") -> str | None:
    settings = _json(path, text)
    _without_our_hooks(settings, path)
    permissions = _table(settings, "permissions", path)
    allow = _list(permissions, "allow", path)
    allow[:] = [a for a in allow if a not in CLAUDE_ALLOW]
    if project:
        enabled = _list(settings, "enabledMcpjsonServers", path)
        enabled[:] = [s for s in enabled if s != SERVER]
        env = _table(settings, "env", path)
        env.pop(TOKEN_ENV, None)
    if install:
        allow.extend(CLAUDE_ALLOW)
        if project:
            settings["enabledMcpjsonServers"].append(SERVER)
            settings["env"][TOKEN_ENV] = token
        hooks = _table(settings, "hooks", path)
        session_end = _list(hooks, "SessionEnd", path)
        session_end.append({"hooks": [{"type": "command", "command": hook_command, "timeout": HOOK_TIMEOUT}]})
        if start_command:
            session_start = _list(hooks, "SessionStart", path)
            session_start.append({"hooks": [{"type": "command", "command": start_command,
                                             "timeout": START_TIMEOUT}]})
    _prune(permissions, "allow")
    _prune(settings, "permissions", "enabledMcpjsonServers", "env")
    return _dump(settings, text)


def _claude_servers(path: Path, text: str | None, entry: dict[str, Any] | None) -> str | None:
    data = _json(path, text)
    servers = _table(data, "mcpServers", path)
    servers.pop(SERVER, None)
    if entry is not None:
        servers[SERVER] = entry
    if path.name == ".claude.json":  # Claude Code's own state file: never removed, even when "empty"
        return dumps_like(data, text)
    _prune(data, "mcpServers")
    return _dump(data, text)


def plan_claude(target: Target, env: Mapping[str, str], *, install: bool, url: str, token: str,
                 hook_command: str, start_command: str = "") -> list[Change]:
    servers_path, settings_path = claude_files(target.project, env)
    project = target.project is not None
    entry = None
    if install:
        entry = claude_server(url, f"${{{TOKEN_ENV}}}" if project else token)
    before = read_exact(servers_path)
    what = f"MCP server {SERVER}" + (f" (token from ${TOKEN_ENV})" if project else " (with its token)")
    servers = Change(servers_path, before, _claude_servers(servers_path, before, entry), private=not project,
                     what=what if install else f"MCP server {SERVER} removed")
    before = read_exact(settings_path)
    after = _claude_settings(settings_path, before, install=install, hook_command=hook_command, token=token,
                             project=project, start_command=start_command)
    what = ("token in env, " if project else "") + f"allow {' and '.join(CLAUDE_ALLOW)}, SessionEnd hook" + (
        ", SessionStart hook (the briefing)" if start_command else "")
    settings = Change(settings_path, before, after, private=project,
                      what=what if install else "memactors' token, allow entries and hook removed")
    return [servers, settings]
