"""Codex's ``config.toml`` as `memactors install` / `uninstall` change it.

``DIR/.codex/config.toml`` (``--project DIR``) or ``$CODEX_HOME/config.toml`` (``--user``; default
``~/.codex/config.toml``; where it is is ``_codex_hooks.codex_config_path``): the ``[mcp_servers.memactors]``
table (url, bearer header, approval mode) and the ``[[hooks.SessionStart]]`` / ``[[hooks.SessionEnd]]``
tables (``_codex_hooks``). The file keeps its comments and layout (tomlkit round-trips it); tomlkit is
imported when a file is merged, not at the CLI's start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._codex_hooks import codex_config_path, merge_hooks
from ._core import CliError
from ._install_change import Change, Target
from ._jsonfile import read_exact
from .agents import SERVER_NAME as SERVER
from .agents import codex_server

__all__ = ["plan_codex"]


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


def plan_codex(target: Target, env: Mapping[str, str], *, install: bool, url: str, token: str,
                hook_command: str = "", start_command: str = "") -> list[Change]:
    path = codex_config_path(target.project, env)
    server = codex_server(url, token) if install else None
    before = read_exact(path)
    after = _codex_config(path, before, server, end_command=hook_command, start_command=start_command)
    hooks = (", SessionEnd hook (records the session)" if hook_command else "") + (
        ", SessionStart hook (the briefing)" if start_command else "")
    return [Change(path, before, after, private=True,
                   what=f"[mcp_servers.{SERVER}] with its token, tools approved{hooks}" if install
                   else f"[mcp_servers.{SERVER}] and memactors' hooks removed")]
