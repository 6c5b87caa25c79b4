"""`memactors install gemini-cli|opencode`: where those agents keep their MCP servers, and the changes.

Pure planning like ``_agentfiles``, whose ``plan`` calls :func:`plan` for these agents and makes a
``Change`` of each answer (this module does not import it: ``_agentfiles`` imports this one): each reads
the JSON file it would change, merges only memactors' own entry into it and leaves everything else as
it was.

==================  ==========================================================================================
agent / scope       MCP server entry (private, mode 0600: it holds the token; kept out of git in a project)
==================  ==========================================================================================
gemini-cli          ``DIR/.gemini/settings.json`` ``mcpServers.memactors``: ``type: http``, the URL, the
--project DIR       bearer header, ``trust: true`` (a headless ``gemini -p`` refuses a tool it would ask about)
gemini-cli --user   ``~/.gemini/settings.json`` (``$GEMINI_CLI_HOME`` moves the home, as for Gemini CLI)
opencode            ``DIR/opencode.json`` ``mcp.memactors``: ``type: remote``, the URL, the bearer header,
--project DIR       ``oauth: false``, ``enabled: true``
opencode --user     ``$XDG_CONFIG_HOME/opencode/opencode.json`` (default ``~/.config/opencode/opencode.json``)
==================  ==========================================================================================

The gateway serves only ``recall`` and ``briefing``, both read-only, so trusting the server trusts
exactly those.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._core import CliError
from .agents import SERVER_NAME as SERVER

__all__ = ["AGENTS", "gemini_file", "gemini_server", "opencode_file", "opencode_server", "plan"]

AGENTS = ("gemini-cli", "opencode")


def gemini_server(url: str, token: str) -> dict[str, Any]:
    """The gateway's entry in Gemini CLI's ``mcpServers``."""
    return {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {token}"}, "trust": True}


def opencode_server(url: str, token: str) -> dict[str, Any]:
    """The gateway's entry in OpenCode's ``mcp`` table (``adapters.opencode.gateway_config``'s shape)."""
    return {"type": "remote", "url": url, "headers": {"Authorization": f"Bearer {token}"}, "oauth": False,
            "enabled": True}


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def gemini_file(project: Path | None, env: Mapping[str, str]) -> Path:
    if project is not None:
        return project / ".gemini" / "settings.json"
    home = env.get("GEMINI_CLI_HOME")
    return (Path(home) if home else _home(env)) / ".gemini" / "settings.json"


def opencode_file(project: Path | None, env: Mapping[str, str]) -> Path:
    if project is not None:
        return project / "opencode.json"
    config = env.get("XDG_CONFIG_HOME")
    return (Path(config) if config else _home(env) / ".config") / "opencode" / "opencode.json"


def _merge(path: Path, text: str | None, key: str, entry: dict[str, Any] | None) -> str | None:
    """``text`` (a JSON object) with ``data[key][memactors]`` set to ``entry`` (or removed for None)."""
    data: dict[str, Any] = {}
    if text is not None and text.strip():
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CliError("INVALID_ARGUMENT", f"{path} is not valid JSON ({exc}); fix or move it, then run "
                                               "again (nothing was changed)") from None
        if not isinstance(data, dict):
            raise CliError("INVALID_ARGUMENT", f"{path} does not hold a JSON object; nothing was changed")
    servers = data.setdefault(key, {})
    if not isinstance(servers, dict):
        raise CliError("INVALID_ARGUMENT", f"{path}: {key} is not an object; nothing was changed")
    servers.pop(SERVER, None)
    if entry is not None:
        servers[SERVER] = entry
    if not servers:
        del data[key]
    if not data or (set(data) == {"$schema"} and entry is None):
        return None
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError("INVALID_ARGUMENT", f"cannot read {path}: {exc.strerror}") from None


def plan(agent: str, project: Path | None, env: Mapping[str, str], *, install: bool, url: str,
         token: str) -> list[tuple[Path, str | None, str | None, bool, str]]:
    """The changes installing (or uninstalling) memactors for ``agent`` makes: (path, text before, text
    after, private, what) for each file."""
    if agent == "gemini-cli":
        path, key, entry = gemini_file(project, env), "mcpServers", gemini_server(url, token)
        what = f"mcpServers.{SERVER} with its token, trusted"
    elif agent == "opencode":
        path, key, entry = opencode_file(project, env), "mcp", opencode_server(url, token)
        what = f"mcp.{SERVER} (remote) with its token"
    else:
        raise CliError("INVALID_ARGUMENT", f"agent must be one of {', '.join(AGENTS)}, not {agent!r}")
    before = _read(path)
    after = _merge(path, before, key, entry if install else None)
    return [(path, before, after, True, what if install else f"{key}.{SERVER} removed")]
