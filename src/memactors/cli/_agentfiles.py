"""What `memactors install` / `uninstall` write into an agent's configuration files, computed as changes.

Pure planning: every function here reads the files it would change and returns :class:`Change` values
(the file's text before and after); ``cli/install.py`` shows them (``--dry-run``) or writes them. Each
change merges into what is there: only memactors' own entries are added, replaced or removed, the
user's other servers, permissions, hooks and keys stay as they were (a TOML file keeps its comments
and layout: tomlkit round-trips it). Installing twice gives the same files but for the new token;
uninstalling removes exactly what installing added, and a file left empty is removed.

Where things go (docs/connect-an-agent.md has the why):

==============  ===================================================  ======================================
agent / scope   MCP server entry                                      allow-list, token, hook
==============  ===================================================  ======================================
claude-code     ``DIR/.mcp.json`` (the header reads the token from    ``DIR/.claude/settings.local.json``:
--project DIR   ``${MEMACTORS_RESIDENT_TOKEN}``: no secret in a file   ``env`` (the token), ``permissions.allow``,
                a project may commit)                                 ``enabledMcpjsonServers``, ``hooks.SessionEnd``
claude-code     ``~/.claude.json`` ``mcpServers`` (user scope, as     ``~/.claude/settings.json``:
--user          ``claude mcp add -s user`` writes it)                  ``permissions.allow``, ``hooks.SessionEnd``
codex --project ``DIR/.codex/config.toml`` ``[mcp_servers.memactors]``: url, bearer header, approval mode;
                ``[[hooks.SessionStart]]`` and ``[[hooks.SessionEnd]]`` (``_codex_hooks``)
codex --user    ``$CODEX_HOME/config.toml`` (default ``~/.codex/config.toml``), the same tables
==============  ===================================================  ======================================

``$CLAUDE_CONFIG_DIR`` moves Claude Code's user files (``.claude.json`` and ``settings.json`` both live
in it then), as it does for Claude Code itself.

Standard library at the top (the CLI's start-up budget); tomlkit is imported when a TOML file is read.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters.kinds import KINDS
from . import _agentfiles_more as _more
from ._codex_hooks import codex_config_path, merge_hooks
from ._core import CliError
from ._jsonfile import BOM, dumps_like, loads_object, read_exact
from ._session_start import TOKEN_ENV
from ._session_start import claude_files as _claude_files
from .agents import CLAUDE_ALLOW, claude_server, codex_server
from .agents import SERVER_NAME as SERVER

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
EXCLUDE_MARK = "# memactors install: holds a gateway token, keep out of version control"
TOKEN_PLACEHOLDER = "<token minted by install>"
AGENTS = tuple(KINDS)


@dataclass(frozen=True)
class Change:
    """One file's text before and after (None: absent / to be removed); ``private`` files hold the token
    and are written 0600."""

    path: Path
    before: str | None
    after: str | None
    private: bool
    what: str

    @property
    def action(self) -> str:
        if self.before == self.after:
            return "unchanged"
        if self.after is None:
            return "remove"
        return "create" if self.before is None else "update"


@dataclass(frozen=True)
class Target:
    """Where an agent's configuration lives for one install: a project directory, or the user's."""

    agent: str
    project: Path | None  # None: --user

    @property
    def scope(self) -> str:
        return "user" if self.project is None else "project"


# -- where the files are ----------------------------------------------------------------------------------


def claude_files(target: Target, env: Mapping[str, str]) -> tuple[Path, Path]:
    """(the file holding the MCP server entry, the settings file) for Claude Code."""
    return _claude_files(target.project, env)


def codex_file(target: Target, env: Mapping[str, str]) -> Path:
    return codex_config_path(target.project, env)


# -- JSON -------------------------------------------------------------------------------------------------

def read_text(path: Path) -> str | None:
    """A file's text, None when it does not exist."""
    return _read(path)


def _read(path: Path) -> str | None:
    return read_exact(path)


def _json(path: Path, text: str | None) -> dict[str, Any]:
    return loads_object(path, text)


def _dump(data: dict[str, Any], like: str | None = None) -> str | None:
    return dumps_like(data, like) if data else None


def _dumps(data: dict[str, Any], like: str | None) -> str:
    return dumps_like(data, like)


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
        return _dumps(data, text)
    _prune(data, "mcpServers")
    return _dump(data, text)


# -- TOML (Codex) -----------------------------------------------------------------------------------------

def _codex_config(path: Path, text: str | None, server: dict[str, Any] | None, *, end_command: str = "",
                  start_command: str = "") -> str | None:
    """``text`` without memactors' table and hooks, then (``server`` given) with them added again: install's
    output depends only on the file without memactors' entries, so installing twice gives the same file but
    for the token, and uninstalling gives back that file."""
    clean = _codex_merge(path, text, None)
    if server is None:
        return clean
    return _codex_merge(path, clean, server, end_command=end_command, start_command=start_command)


def _codex_merge(path: Path, text: str | None, server: dict[str, Any] | None, *, end_command: str = "",
                 start_command: str = "") -> str | None:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        doc = tomlkit.parse(text or "")
    except TOMLKitError as exc:
        raise CliError("INVALID_ARGUMENT", f"{path} is not valid TOML ({exc}); nothing was changed") from None
    servers = doc.get("mcp_servers")
    if servers is not None and not isinstance(servers, dict):
        raise CliError("INVALID_ARGUMENT", f"{path}: mcp_servers is not a table; nothing was changed")
    if servers is not None and SERVER in servers:
        del servers[SERVER]
    if server is not None:
        if servers is None:
            servers = tomlkit.table(is_super_table=True)
            doc["mcp_servers"] = servers
        table = tomlkit.table()
        table["url"] = server["url"]
        headers = tomlkit.inline_table()
        headers.update(server["http_headers"])
        table["http_headers"] = headers
        table["default_tools_approval_mode"] = server["default_tools_approval_mode"]
        servers[SERVER] = table
    elif servers is not None and not servers:
        del doc["mcp_servers"]
    # The SessionStart / SessionEnd hooks (`_codex_hooks`): with server None, only taken out.
    merge_hooks(doc, end_command=end_command if server is not None else "",
                start_command=start_command if server is not None else "")
    out = tomlkit.dumps(doc)
    if server is None and text is not None and out != text:
        # tomlkit keeps the blank line install put before the table it removed: a file ends as it did
        # before (with one line break, or none), never with a blank line more.
        out = out.rstrip("\n") + ("\n" if text.endswith("\n") else "")
    return out if out.strip() else None


# -- byte-exact uninstall ----------------------------------------------------------------------------------

def same_content(path: Path, a: str | None, b: str | None) -> bool:
    """Whether two texts of ``path`` hold the same data (JSON or TOML parsed; any other file compared by
    its lines), whatever their layout: a file install found holding none of memactors' entries."""
    if a is None or b is None:
        return a is b
    try:
        if path.suffix == ".json":
            data_a: object = json.loads(a.removeprefix(BOM) or "{}")
            data_b: object = json.loads(b.removeprefix(BOM) or "{}")
            return data_a == data_b
        if path.suffix == ".toml":
            import tomllib

            return tomllib.loads(a) == tomllib.loads(b)
    except ValueError:
        return a == b
    return a.splitlines() == b.splitlines()


def holds_ours(text: str) -> bool:
    """Whether a file's text holds anything install writes: every entry names the server (``memactors``:
    the server key, ``mcp__memactors__…``, ``memactors.cli`` hook commands, ``MEMACTORS_RESIDENT_TOKEN``,
    the exclude mark) or, for OpenCode, its plugin file."""
    return SERVER in text.lower() or _more.PLUGIN_SUFFIX in text or _more.PI_SUFFIX in text


def missing_dirs(path: Path) -> list[Path]:
    """The directories above ``path`` that do not exist yet (outermost first): what writing it creates."""
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing[::-1]


# -- git: a file holding the token stays out of version control ----------------------------------------------

def _git(project: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git: nothing to keep the file out of


def _exclude_change(project: Path, private_files: list[Path], *, install: bool) -> Change | None:
    """The ``.git/info/exclude`` lines that keep ``private_files`` out of commits (install) or that an
    earlier install added (uninstall). Refuses to write a token into a file git already tracks."""
    top = _git(project, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return None
    root = Path(top.stdout.strip())
    found = _git(project, "rev-parse", "--path-format=absolute", "--git-path", "info/exclude")
    if found is None or found.returncode != 0:
        return None
    exclude = Path(found.stdout.strip())
    before = _read(exclude)
    lines = (before or "").splitlines()
    patterns = []
    for path in private_files:
        try:
            relative = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
        if install:
            tracked = _git(root, "ls-files", "--error-unmatch", "--", relative)
            if tracked is not None and tracked.returncode == 0:
                raise CliError("INVALID_ARGUMENT", f"{path} is tracked by git and would hold the gateway token: "
                                                   "untrack it (git rm --cached) or install with --user; nothing "
                                                   "was changed")
        patterns.append(f"/{relative}")
    kept: list[str] = []
    skip_next = False
    for line in lines:  # drop what an earlier install added (its mark and the line after it)
        if skip_next:
            skip_next = False
            continue
        if line == EXCLUDE_MARK:
            skip_next = True
            continue
        kept.append(line)
    if install:
        for pattern in patterns:
            ignored = _git(root, "check-ignore", "-q", "--no-index", "--", pattern.lstrip("/"))
            if ignored is not None and ignored.returncode == 0 and pattern not in lines:
                continue  # the project ignores it already (.gitignore): nothing to add
            kept += [EXCLUDE_MARK, pattern]
    # A file that had no final line break keeps none when uninstall takes memactors' lines out of it.
    end = "\n" if install or (before or "").endswith("\n") else ""
    after = "\n".join(kept) + end if kept else ("" if before is not None else None)
    if after == before or (before is None and not kept):
        return None
    return Change(exclude, before, after, private=False,
                  what="keeps the token's file out of commits" if install else "the lines install added, removed")


# -- the plans -----------------------------------------------------------------------------------------------

def plan(target: Target, *, env: Mapping[str, str], install: bool, url: str = "", token: str = TOKEN_PLACEHOLDER,
         hook_command: str = "", start_command: str = "", plugin_file: Path | None = None,
         tool_command: str = "") -> list[Change]:
    """The changes installing (or uninstalling) memactors for ``target`` makes; raises CliError, naming the
    file, when one cannot be merged (nothing is written then). ``plugin_file``: where OpenCode's plugin goes."""
    layout = KINDS[target.agent].layout if target.agent in KINDS else None
    if layout == "claude":
        changes = _plan_claude(target, env, install=install, url=url, token=token, hook_command=hook_command,
                               start_command=start_command)
    elif layout == "codex":
        changes = _plan_codex(target, env, install=install, url=url, token=token, hook_command=hook_command,
                              start_command=start_command)
    elif layout is not None:  # one JSON settings file (and a plugin or extension): _agentfiles_more
        changes = [Change(path, before, after, private=private, what=what) for path, before, after, private, what
                   in _more.plan(target.agent, target.project, env, install=install, url=url, token=token,
                                 hook_command=hook_command, start_command=start_command, plugin_file=plugin_file,
                                 tool_command=tool_command)]
    else:
        raise CliError("INVALID_ARGUMENT", f"agent must be one of {', '.join(AGENTS)}, not {target.agent!r}")
    if target.project is not None:
        excluded = _exclude_change(target.project, [c.path for c in changes if c.private], install=install)
        if excluded is not None:
            changes.append(excluded)
    return changes


def _plan_claude(target: Target, env: Mapping[str, str], *, install: bool, url: str, token: str,
                 hook_command: str, start_command: str = "") -> list[Change]:
    servers_path, settings_path = claude_files(target, env)
    project = target.project is not None
    entry = None
    if install:
        entry = claude_server(url, f"${{{TOKEN_ENV}}}" if project else token)
    before = _read(servers_path)
    what = f"MCP server {SERVER}" + (f" (token from ${TOKEN_ENV})" if project else " (with its token)")
    servers = Change(servers_path, before, _claude_servers(servers_path, before, entry), private=not project,
                     what=what if install else f"MCP server {SERVER} removed")
    before = _read(settings_path)
    after = _claude_settings(settings_path, before, install=install, hook_command=hook_command, token=token,
                             project=project, start_command=start_command)
    what = ("token in env, " if project else "") + f"allow {' and '.join(CLAUDE_ALLOW)}, SessionEnd hook" + (
        ", SessionStart hook (the briefing)" if start_command else "")
    settings = Change(settings_path, before, after, private=project,
                      what=what if install else "memactors' token, allow entries and hook removed")
    return [servers, settings]


def _plan_codex(target: Target, env: Mapping[str, str], *, install: bool, url: str, token: str,
                hook_command: str = "", start_command: str = "") -> list[Change]:
    path = codex_file(target, env)
    server = codex_server(url, token) if install else None
    before = _read(path)
    after = _codex_config(path, before, server, end_command=hook_command, start_command=start_command)
    hooks = (", SessionEnd hook (records the session)" if hook_command else "") + (
        ", SessionStart hook (the briefing)" if start_command else "")
    return [Change(path, before, after, private=True,
                   what=f"[mcp_servers.{SERVER}] with its token, tools approved{hooks}" if install
                   else f"[mcp_servers.{SERVER}] and memactors' hooks removed")]


def write(change: Change) -> None:
    """Apply one change atomically (a temporary file renamed over the old one); a private file is 0600,
    any other keeps its mode."""
    path = change.path
    if change.after is None:
        path.unlink(missing_ok=True)
        return
    if change.after == change.before:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    if change.private:
        mode = 0o600
    tmp = path.with_name(f".{path.name}.memactors-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:  # the text's own line ends, untranslated
            f.write(change.after)
        os.replace(tmp, path)
    except BaseException:  # ok: no half-written temporary file left beside the user's, then re-raised
        tmp.unlink(missing_ok=True)
        raise
