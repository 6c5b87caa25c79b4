"""The coding agents memactors connects, each described once: what the installer, the session-end hook,
the harness kinds and doctor read about it.

One :class:`AgentKind` per agent holds what differs between agents: its name and title, the harness
kind's adapter (``memactors run``), how ``memactors install`` connects it (``layout``: which of the
installer's merge shapes its files take, where its settings file is per scope, the key its MCP servers sit
under and the shape of memactors' entry there), the hook events it fires, the reader of its session file
and what doctor says when its sessions stop arriving. The installer (``cli/_install_plan``, ``cli/_layout_*``), the hooks
(``cli/residents``, ``cli/agents``), ``cli/install``'s choices and help, the adapter registry and doctor's
causes are all read from :data:`KINDS`; an agent whose files take a shape the installer knows
(``gemini``: one JSON settings file with ``mcpServers`` and Gemini CLI's hook layout) is one entry here,
its adapter module and its session reader.

Pure data (and the entry shapes, pure functions of the URL and the token): importing this module loads
nothing else, so the CLI's start-up and config's validation may read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["KINDS", "AgentKind", "Layout", "bearer", "kind", "resident_names"]

#: The installer's merge shapes (``cli/_layout_*``): Claude Code's two JSON files, Codex's TOML,
#: Gemini CLI's one JSON settings file (Qwen Code keeps it), OpenCode's JSON and plugin, pi's settings and
#: extension.
Layout = Literal["claude", "codex", "gemini", "opencode", "pi"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _claude_entry(url: str, token: str) -> dict[str, Any]:
    # ``token`` may be a ``${VAR}`` reference, which Claude Code expands.
    return {"type": "http", "url": url, "headers": bearer(token)}


def _codex_entry(url: str, token: str) -> dict[str, Any]:
    # Codex runs `exec` (and any session started with approval policy never) without asking: a tool call
    # that configuration does not approve is refused, so the memory tools are approved here.
    return {"url": url, "http_headers": bearer(token), "default_tools_approval_mode": "approve"}


def _gemini_entry(url: str, token: str) -> dict[str, Any]:
    # ``trust``: a headless ``gemini -p`` refuses a tool it would ask about.
    return {"type": "http", "url": url, "headers": bearer(token), "trust": True}


def _opencode_entry(url: str, token: str) -> dict[str, Any]:
    return {"type": "remote", "url": url, "headers": bearer(token), "oauth": False, "enabled": True}


def _qwen_entry(url: str, token: str) -> dict[str, Any]:
    # ``httpUrl`` is Qwen Code's streamable-HTTP transport (a ``url`` alone would be SSE); ``trust`` so a
    # session calls the read-only tools without asking.
    return {"httpUrl": url, "headers": bearer(token), "trust": True}


@dataclass(frozen=True)
class AgentKind:
    """One coding agent, as memactors connects it."""

    #: The name a user types (``install <name>``, ``hook <name> …``, ``harness = "<name>"``); the adapter
    #: name its sessions are recorded under.
    name: str
    #: How people write it ("Qwen Code").
    title: str
    #: The harness kind's adapter, ``module:Class`` (``adapters.get_adapter`` builds it).
    adapter: str
    #: The caps its adapter can enforce (config refuses any other).
    caps: frozenset[str]
    #: Which of the installer's merge shapes its configuration takes.
    layout: Layout
    #: The files install changes, for ``--help``: with ``--project DIR`` (relative to DIR) and ``--user``.
    project_files: str
    user_files: str
    #: Its settings file, for the ``gemini``/``opencode``/``pi`` layouts: the path in a project, the path
    #: under the user's directory, and the variable that moves that directory (else ``HOME``).
    settings: tuple[str, str, str] = ("", "", "HOME")
    #: The key of its MCP servers table in that file and memactors' entry there (None: no MCP client).
    servers_key: str = "mcpServers"
    entry: Callable[[str, str], dict[str, Any]] | None = None
    #: Variables install sets in its settings' ``env`` table (the agent applies them when it starts).
    settings_env: tuple[tuple[str, str], ...] = ()
    #: The hook events memactors installs commands for (the agent's own names).
    hook_events: tuple[str, ...] = ()
    #: Its session file's reader for the session-end hook (``hook <name> session-end``), ``module:function``
    #: over the file's lines, and the hook input's field naming the file (empty: no session file, as for
    #: OpenCode, whose plugin pipes the session's parts; Claude Code's and Codex's hooks have their own).
    session_reader: str = ""
    session_field: str = "transcript_path"
    #: Whether it gives its session-end hook only a short grace at exit and then kills the hook's process
    #: group (the hook then checks its input and hands the rest to a detached child).
    exit_grace: bool = False
    #: What install tells the user about it (empty: nothing).
    install_note: str = ""
    #: Doctor's likeliest cause when an install of it records no session.
    cause: str = ""

    def server(self, url: str, token: str) -> dict[str, Any]:
        """memactors' entry in this agent's MCP servers table; ValueError for an agent without MCP."""
        if self.entry is None:
            raise ValueError(f"{self.title} has no MCP servers table")
        return self.entry(url, token)

    def settings_file(self, project: Path | None, env: Mapping[str, str]) -> Path:
        """Its settings file (``settings``): in ``project``, else under the user's directory."""
        in_project, in_home, home_var = self.settings
        if project is not None:
            return project / in_project
        home = env.get(home_var) or (env.get("HOME") if home_var == "HOME" else None)
        if home:
            return Path(home) / in_home
        # XDG_CONFIG_HOME unset: ~/.config; any other home variable unset: the user's home
        base = Path(env["HOME"]) if env.get("HOME") else Path.home()
        return (base / ".config" if home_var == "XDG_CONFIG_HOME" else base) / in_home


KINDS: Mapping[str, AgentKind] = {k.name: k for k in (
    AgentKind(
        "claude-code", "Claude Code", "memactors.adapters.claude_code:ClaudeCodeAdapter",
        frozenset({"max_turns", "max_cost_usd"}), "claude",
        ".mcp.json and .claude/settings.local.json", "~/.claude.json and ~/.claude/settings.json",
        entry=_claude_entry, hook_events=("SessionStart", "SessionEnd"),
        install_note="start `claude` in that directory; a headless `claude -p` there can call recall and briefing "
                     "without --allowedTools or --mcp-config",
        cause="Claude Code runs the hooks of the settings files it loaded: check that `/hooks` in Claude Code lists "
              "memactors' SessionEnd hook (a managed policy may disable hooks)"),
    AgentKind(
        "codex", "Codex", "memactors.adapters.codex:CodexAdapter", frozenset(), "codex",
        ".codex/config.toml", "$CODEX_HOME/config.toml", servers_key="mcp_servers", entry=_codex_entry,
        hook_events=("SessionStart", "SessionEnd"),
        cause="Codex runs hooks only after you trust them, and `codex exec` skips untrusted ones without a word: "
              "start `codex` in the project, run `/hooks` and trust memactors' SessionEnd hook (and its "
              "SessionStart hook, installed with --briefing-at-start)"),
    AgentKind(
        "gemini-cli", "Gemini CLI", "memactors.adapters.gemini_cli:GeminiCliAdapter", frozenset(), "gemini",
        ".gemini/settings.json", "~/.gemini/settings.json",
        settings=(".gemini/settings.json", ".gemini/settings.json", "GEMINI_CLI_HOME"), entry=_gemini_entry,
        hook_events=("SessionStart", "SessionEnd"),
        session_reader="memactors.agents.resident_sessions:gemini_session",
        cause="Gemini CLI runs a project's hooks only in a trusted folder: trust the project folder when Gemini CLI "
              "asks (or with `/permissions`), or install with --user"),
    AgentKind(
        "opencode", "OpenCode", "memactors.adapters.opencode:OpenCodeAdapter", frozenset(), "opencode",
        "opencode.json", "~/.config/opencode/opencode.json",
        settings=("opencode.json", "opencode/opencode.json", "XDG_CONFIG_HOME"), servers_key="mcp",
        entry=_opencode_entry,
        cause="OpenCode loads memactors' plugin at start: check that the plugin file install wrote is still there"),
    AgentKind(
        "pi", "pi", "memactors.adapters.pi:PiAdapter", frozenset(), "pi",
        ".pi/settings.json", "~/.pi/agent/settings.json",
        settings=(".pi/settings.json", ".pi/agent/settings.json", "HOME"),
        session_reader="memactors.agents.resident_sessions:pi_session", session_field="session_file",
        cause="pi loads memactors' extension from its settings.json `extensions`: check that the entry and the "
              "file are there"),
    AgentKind(
        "qwen-code", "Qwen Code", "memactors.adapters.qwen_code:QwenCodeAdapter", frozenset(), "gemini",
        ".qwen/settings.json", "~/.qwen/settings.json",
        settings=(".qwen/settings.json", ".qwen/settings.json", "HOME"), entry=_qwen_entry,
        # Qwen Code (0.24) discovers its MCP servers in the background: an interactive session's first
        # prompt (typed quickly, or given with ``-i``) can reach the model before the gateway's tools and
        # instructions are known, so that turn cannot recall and is never told to read its briefing. This
        # makes discovery finish before the first prompt is sent (the gateway is on loopback: one handshake).
        settings_env=(("QWEN_CODE_LEGACY_MCP_BLOCKING", "1"),),
        # It gives each exit cleanup, its SessionEnd hook among them, 2 s, then kills the hook's group.
        exit_grace=True,
        hook_events=("SessionStart", "SessionEnd"),
        session_reader="memactors.agents.resident_sessions:qwen_session",
        install_note="Qwen Code (0.24) runs its SessionEnd hook when an interactive session ends (/quit, /clear); a "
                     "headless `qwen \"…\"` fires none, so its session is not recorded: run headless work through "
                     "`memactors run` (harness = \"qwen-code\") instead",
        cause="Qwen Code runs its SessionEnd hook only when an interactive session ends (/quit, /clear): a headless "
              "`qwen \"…\"` is not recorded by the hook (run it through `memactors run`)"),
)}


def kind(name: str) -> AgentKind:
    """The agent called ``name``; KeyError naming the known ones otherwise."""
    found = KINDS.get(name)
    if found is None:
        raise KeyError(f"agent must be one of {', '.join(KINDS)}, not {name!r}")
    return found


def resident_names() -> tuple[str, ...]:
    """The agents ``memactors install`` connects, in the order help lists them."""
    return tuple(KINDS)
