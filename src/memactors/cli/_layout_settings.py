"""The agents with one JSON settings file (Gemini CLI, Qwen Code, OpenCode, pi) as `memactors install` /
`uninstall` change it, with OpenCode's plugin and pi's extension beside it.

Each plan reads the JSON file it would change, merges only memactors' own entries into it and leaves
everything else as it was; ``_install_plan.plan`` calls :func:`plan_settings` for every agent whose
``KINDS`` layout is ``gemini``, ``opencode`` or ``pi`` (an agent in the ``gemini`` layout needs no code
of its own).

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

Besides the server, install makes each session recorded and briefed:

* **gemini-cli**: the same ``settings.json`` gets ``hooks.SessionStart`` (``memactors hook gemini-cli
  session-start``: the briefing as the hook's ``additionalContext``) and ``hooks.SessionEnd`` (``memactors
  hook gemini-cli session-end``: the session file → a run record), each named ``memactors-…``.
* **opencode**: a plugin (``_opencode_plugin``: the briefing through ``experimental.chat.system.transform``,
  the session's parts piped to ``memactors hook opencode session-end`` when OpenCode exits), kept in
  memactors' state directory (``installs/<run id>.opencode-plugin.js``) and named in the same
  ``opencode.json``'s ``plugin`` list as a ``file://`` URL. Not in ``.opencode/plugins/``: OpenCode installs
  its plugin SDK (thousands of files under ``node_modules``) into every ``.opencode`` directory it finds,
  which would leave the user's project changed after uninstall. No token in it: it runs the hook commands,
  which read the token from ``opencode.json``.

The gateway serves only ``recall`` and ``briefing``, both read-only, so trusting the server trusts
exactly those.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..adapters.kinds import KINDS
from ..adapters.pi_extension import extension_source
from ._core import CliError
from ._install_change import Change, Target
from ._jsonfile import dumps_like, loads_object, read_exact
from ._opencode_plugin import plugin_source
from .agents import SERVER_NAME as SERVER

__all__ = ["AGENTS", "GEMINI_MARKS", "PI_SUFFIX", "PLUGIN_SUFFIX", "plan_settings"]

#: The agents planned here: those whose files are not Claude Code's or Codex's.
AGENTS = tuple(k.name for k in KINDS.values() if k.layout not in ("claude", "codex"))
#: Gemini CLI's hook events install adds one entry to, and what recognises that entry (whatever
#: interpreter or --config its command names).
GEMINI_MARKS = {"SessionStart": "hook gemini-cli session-start", "SessionEnd": "hook gemini-cli session-end"}
#: Gemini CLI's hook timeouts are milliseconds. The briefing's own exchange gives up after 3 s; the
#: session end's RPC after 15 s, and then it spools.
_GEMINI_TIMEOUTS = {"SessionStart": 10_000, "SessionEnd": 30_000}
_GEMINI_NAMES = {"SessionStart": "memactors-briefing", "SessionEnd": "memactors-record-session"}
#: How the pi extension's file ends (``installs/<run id>.pi-extension.ts``): what marks install's entry in
#: pi's ``settings.json`` ``extensions``.
PI_SUFFIX = ".pi-extension.ts"
#: How the OpenCode plugin's file ends (``installs/<run id>.opencode-plugin.js``): what marks the ``plugin``
#: entry install wrote.
PLUGIN_SUFFIX = ".opencode-plugin.js"


def _settings_env(path: Path, data: dict[str, Any], pairs: tuple[tuple[str, str], ...], install: bool) -> None:
    """Set (install) or remove (uninstall, where the value is still install's) the agent's ``settings_env``
    in its settings' ``env`` table."""
    env = data.get("env", {})
    if not isinstance(env, dict):
        raise CliError("INVALID_ARGUMENT", f"{path}: env is not an object; nothing was changed")
    for key, value in pairs:
        if install:
            env[key] = value
        elif env.get(key) == value:
            del env[key]
    if env:
        data["env"] = env
    else:
        data.pop("env", None)


def _pi_settings(path: Path, text: str | None, extension: Path | None) -> str | None:
    """``text`` with install's entry in ``extensions`` removed and, for ``extension``, added again."""
    data = loads_object(path, text)
    entries = data.get("extensions", [])
    if not isinstance(entries, list):
        raise CliError("INVALID_ARGUMENT", f"{path}: extensions is not a list; nothing was changed")
    entries = [e for e in entries if not (isinstance(e, str) and e.endswith(PI_SUFFIX)
                                          and "/installs/resident-pi-" in e)]
    if extension is not None:
        entries.append(str(extension))
    if entries:
        data["extensions"] = entries
    else:
        data.pop("extensions", None)
    return dumps_like(data, text) if data else None


def _our_plugin(entry: Any) -> Path | None:
    """The plugin file an ``opencode.json`` ``plugin`` entry names, when install wrote that entry."""
    if isinstance(entry, str) and entry.startswith("file://") and entry.endswith(PLUGIN_SUFFIX) and (
            "/installs/resident-opencode-" in entry):
        return Path(entry.removeprefix("file://"))
    return None


def _opencode_plugins(path: Path, data: dict[str, Any], plugin: Path | None) -> list[Path]:
    """Remove install's entries from ``data["plugin"]`` (returning the files they named) and add ``plugin``."""
    entries = data.get("plugin", [])
    if not isinstance(entries, list):
        raise CliError("INVALID_ARGUMENT", f"{path}: plugin is not a list; nothing was changed")
    ours = [found for e in entries if (found := _our_plugin(e)) is not None]
    entries = [e for e in entries if _our_plugin(e) is None]
    if plugin is not None:
        entries.append(f"file://{plugin}")
    if entries:
        data["plugin"] = entries
    else:
        data.pop("plugin", None)
    return ours


def _gemini_hooks(path: Path, data: dict[str, Any], commands: dict[str, str] | None,
                  agent: str = "gemini-cli") -> None:
    """Remove memactors' hook entries from ``data["hooks"]`` and, for ``commands``, add them again (Gemini
    CLI's layout, which Qwen Code, its fork, keeps)."""
    hooks = data.get("hooks", {})
    if not isinstance(hooks, dict):
        raise CliError("INVALID_ARGUMENT", f"{path}: hooks is not an object; nothing was changed")
    for event, gemini_mark in GEMINI_MARKS.items():
        mark = gemini_mark.replace("gemini-cli", agent)
        groups = hooks.get(event)
        if isinstance(groups, list):
            kept = []
            for group in groups:
                if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                    rest = [h for h in group["hooks"] if not (isinstance(h, dict) and mark in str(h.get("command")))]
                    if not rest:
                        continue
                    group = {**group, "hooks": rest}
                kept.append(group)
            hooks[event] = kept
        elif groups is not None:
            raise CliError("INVALID_ARGUMENT", f"{path}: hooks.{event} is not a list; nothing was changed")
        if commands and commands.get(event):
            hooks.setdefault(event, []).append({"hooks": [{
                "type": "command", "name": _GEMINI_NAMES[event], "command": commands[event],
                "timeout": _GEMINI_TIMEOUTS[event]}]})
        if hooks.get(event) == []:
            del hooks[event]
    if hooks:
        data["hooks"] = hooks
    else:
        data.pop("hooks", None)


def _merge(path: Path, text: str | None, key: str, entry: dict[str, Any] | None,
           hooks: dict[str, str] | None = None, plugin: Path | None = None, found: list[Path] | None = None,
           agent: str = "gemini-cli") -> str | None:
    """``text`` (a JSON object) with ``data[key][memactors]`` set to ``entry`` (or removed for None); for
    Gemini CLI's settings (``hooks`` not None) memactors' hook entries too; for OpenCode's (``found`` not
    None) its ``plugin`` entry, the files earlier entries named added to ``found``."""
    data = loads_object(path, text)
    servers = data.setdefault(key, {})
    if not isinstance(servers, dict):
        raise CliError("INVALID_ARGUMENT", f"{path}: {key} is not an object; nothing was changed")
    servers.pop(SERVER, None)
    if entry is not None:
        servers[SERVER] = entry
    if not servers:
        del data[key]
    if hooks is not None:
        _gemini_hooks(path, data, hooks if entry is not None else None, agent)
    if KINDS[agent].settings_env:
        _settings_env(path, data, KINDS[agent].settings_env, entry is not None)
    if found is not None:
        found += _opencode_plugins(path, data, plugin if entry is not None else None)
    if not data or (set(data) == {"$schema"} and entry is None):
        return None
    return dumps_like(data, text)


def plan_settings(target: Target, env: Mapping[str, str], *, install: bool, url: str, token: str,
                  hook_command: str = "", start_command: str = "", plugin_file: Path | None = None,
                  tool_command: str = "") -> list[Change]:
    """The changes installing (or uninstalling) memactors for ``target``'s agent makes. ``hook_command``
    records a session when it ends and ``start_command`` gives it its briefing (shell command lines; empty: not installed); OpenCode's plugin
    running them is written to ``plugin_file``."""
    agent, project = target.agent, target.project
    described = KINDS.get(agent)
    if described is None or described.layout in ("claude", "codex"):
        raise CliError("INVALID_ARGUMENT", f"agent must be one of {', '.join(AGENTS)}, not {agent!r}")
    if described.layout == "gemini":
        path = described.settings_file(project, env)
        before = read_exact(path)
        hooks = {"SessionStart": start_command, "SessionEnd": hook_command}
        server = described.server(url, token) if install else None
        after = _merge(path, before, described.servers_key, server, hooks, agent=agent)
        what = f"mcpServers.{SERVER} with its token, trusted" + (
            "".join(f", env.{k}" for k, _ in described.settings_env)) + (
            ", SessionStart hook (the briefing)" if install and start_command else "") + (
            ", SessionEnd hook (records the session)" if install and hook_command else "")
        return [Change(path, before, after, private=True,
                       what=what if install else f"mcpServers.{SERVER} and its hooks removed")]
    if described.layout == "pi":
        if install and start_command:
            raise CliError("INVALID_ARGUMENT", "--briefing-at-start: pi has no session-start context to give; its "
                                               "extension's briefing tool is how it reads its briefing")
        path = described.settings_file(project, env)
        before = read_exact(path)
        extension = plugin_file if install else None
        changes = [Change(path, before, _pi_settings(path, before, extension), private=False,
                          what="extensions += memactors' extension (recall, briefing; each session recorded)"
                          if install else "memactors' extension removed")]
        if plugin_file is not None:
            gateway = plugin_file.with_name(plugin_file.name.removesuffix(PI_SUFFIX) + ".pi-gateway.json")
            changes.append(Change(plugin_file, read_exact(plugin_file),
                                  extension_source(tool_command, hook_command) if install else None, private=False,
                                  what="pi extension: the memory tools, each session recorded" if install
                                  else "memactors' pi extension removed"))
            changes.append(Change(gateway, read_exact(gateway),
                                  json.dumps({"url": url, "token": token}) + "\n" if install else None, private=True,
                                  what="the gateway URL and this resident's token" if install
                                  else "the resident's token removed"))
        return changes
    if described.layout == "opencode":
        path = described.settings_file(project, env)
        before = read_exact(path)
        plugin = plugin_file if install and plugin_file is not None and (start_command or hook_command) else None
        earlier: list[Path] = []
        after = _merge(path, before, described.servers_key, described.server(url, token) if install else None,
                       plugin=plugin,
                       found=earlier)
        changes = [Change(path, before, after, private=True, what=f"mcp.{SERVER} (remote) with its token" + (
            ", memactors' plugin" if plugin else "") if install else f"mcp.{SERVER} and memactors' plugin removed")]
        if plugin is not None:
            changes.append(Change(plugin, read_exact(plugin), plugin_source(start_command, hook_command),
                                  private=False,
                                  what="OpenCode plugin: the briefing at session start, each session recorded"))
        for old in earlier:
            if old != plugin and old.exists():
                changes.append(Change(old, read_exact(old), None, private=False,
                                      what="memactors' OpenCode plugin removed"))
        return changes
    raise CliError("INVALID_ARGUMENT", f"agent must be one of {', '.join(AGENTS)}, not {agent!r}")
