"""One description per agent (``adapters.kinds``): every agent `memactors install` offers is a harness kind
whose adapter builds under its own name, and an agent described in a layout the installer knows is installed,
hooked and uninstalled with no code of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memactors.adapters import get_adapter
from memactors.adapters.kinds import KINDS, AgentKind, bearer
from memactors.cli import _install_plan as files
from memactors.cli._install_change import Target


def test_every_agent_install_offers_is_a_harness_kind_and_a_hook_group() -> None:
    for name, described in KINDS.items():
        assert get_adapter(name).name == name, described.adapter
    shown = subprocess.run([sys.executable, "-m", "memactors.cli", "install", "--help"], capture_output=True,
                           text=True, check=True).stdout
    hooks = subprocess.run([sys.executable, "-m", "memactors.cli", "hook", "--help"], capture_output=True,
                           text=True, check=True).stdout
    for name in KINDS:
        assert name in shown and name in hooks


def test_an_agent_described_in_the_gemini_layout_is_installed_and_uninstalled_with_no_code_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acme = AgentKind("acme", "Acme", "memactors.adapters.command:CommandAdapter", frozenset(), "gemini",
                     ".acme/settings.json", "~/.acme/settings.json",
                     settings=(".acme/settings.json", ".acme/settings.json", "HOME"),
                     entry=lambda url, token: {"httpUrl": url, "headers": bearer(token)},
                     settings_env=(("ACME_WAIT_FOR_MCP", "1"),), hook_events=("SessionStart", "SessionEnd"),
                     session_reader="memactors.agents.resident_sessions:gemini_session")
    monkeypatch.setitem(KINDS, "acme", acme)  # type: ignore[index]
    project = tmp_path / "p"
    (project / ".acme").mkdir(parents=True)
    own = '{\r\n  "theme": "dark"\r\n}'
    (project / ".acme" / "settings.json").write_text(own, encoding="utf-8", newline="")
    target = Target("acme", project)
    env = {"HOME": str(tmp_path / "home")}
    [change] = files.plan(target, env=env, install=True, url="http://127.0.0.1:1/mcp", token="t0k",
                          hook_command="memactors hook acme session-end --harness h")
    assert change.path == project / ".acme" / "settings.json" and change.private
    written = json.loads(change.after or "")
    assert written["theme"] == "dark"
    assert written["mcpServers"]["memactors"] == {"httpUrl": "http://127.0.0.1:1/mcp",
                                                  "headers": {"Authorization": "Bearer t0k"}}
    assert written["env"] == {"ACME_WAIT_FOR_MCP": "1"}
    assert "hook acme session-end" in written["hooks"]["SessionEnd"][0]["hooks"][0]["command"]
    assert "\r\n" in (change.after or "")  # the user's line ends kept
    files.write(change)
    [undo] = files.plan(target, env=env, install=False)
    assert undo.after == own
