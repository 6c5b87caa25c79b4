"""`memactors install` / `uninstall` through the CLI as a subprocess, against the daemon as a process: what
lands in each agent's configuration files, that the user's own settings survive, that installing again
rotates the token, that uninstalling leaves the files as they were. The real agents reading
these files: tests/agents/test_resident_claude.py and tests/agents/test_resident_codex.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fix_agents import gateway_status, git_repo, memactors, read_json
from fix_daemon import Daemon

pytestmark = pytest.mark.slow

USER_SETTINGS = {"model": "opus", "permissions": {"allow": ["Bash(git status)"], "deny": ["WebFetch"]},
                 "hooks": {"SessionEnd": [{"hooks": [{"type": "command", "command": "notify-send bye"}]}],
                           "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit"}]}]}}
USER_MCP = {"mcpServers": {"github": {"type": "http", "url": "https://example.invalid/mcp"}}}
CODEX_CONFIG = ('# my Codex settings\nmodel = "gpt-5.5"  # the one I like\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\n'
                'args = ["--stdio"]\n\n[projects."/srv/x"]\ntrust_level = "trusted"\n')


async def test_install_claude_code_in_a_project_merges_with_the_users_settings_and_uninstall_restores_them(
        daemon: Daemon, tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    (repo / ".mcp.json").write_text(json.dumps(USER_MCP), encoding="utf-8")
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.local.json").write_text(json.dumps(USER_SETTINGS), encoding="utf-8")
    exclude_before = (repo / ".git" / "info" / "exclude").read_text(encoding="utf-8")
    done = memactors(daemon, "install", "claude-code", "--harness", "coder", "--project", str(repo), "--json",
                     home=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["agent"], report["scope"], report["harness"]) == ("claude-code", "project", "coder")
    servers = read_json(repo / ".mcp.json")["mcpServers"]
    assert servers["github"] == USER_MCP["mcpServers"]["github"]  # type: ignore[index]
    ours = servers["memactors"]  # type: ignore[index]
    assert ours == {"type": "http", "url": daemon.gateway,
                    "headers": {"Authorization": "Bearer ${MEMACTORS_RESIDENT_TOKEN}"}}  # no secret in .mcp.json
    settings_path = repo / ".claude" / "settings.local.json"
    settings = read_json(settings_path)
    assert settings["model"] == "opus" and settings["permissions"]["deny"] == ["WebFetch"]  # type: ignore[index]
    assert settings["permissions"]["allow"] == [  # type: ignore[index]
        "Bash(git status)", "mcp__memactors__recall", "mcp__memactors__briefing"]
    assert settings["enabledMcpjsonServers"] == ["memactors"]
    assert settings["hooks"]["PreToolUse"] == USER_SETTINGS["hooks"]["PreToolUse"]  # type: ignore[index]
    first_group, ours_group = settings["hooks"]["SessionEnd"]  # type: ignore[index]
    assert first_group == USER_SETTINGS["hooks"]["SessionEnd"][0]  # type: ignore[index]
    [hook] = ours_group["hooks"]
    assert "hook claude-code session-end --harness coder" in hook["command"] and hook["timeout"] == 30
    token = settings["env"]["MEMACTORS_RESIDENT_TOKEN"]  # type: ignore[index]
    assert stat.S_IMODE(settings_path.stat().st_mode) == 0o600  # it holds the token
    assert "/.claude/settings.local.json" in (repo / ".git" / "info" / "exclude").read_text(encoding="utf-8")
    assert await gateway_status(daemon.gateway, token) == 200

    # install again: same entries, nothing doubled, a new token; the old one no longer works
    again = memactors(daemon, "install", "claude-code", "--harness", "coder", "--project", str(repo), home=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "1 earlier token(s) revoked" in again.stdout
    settings2 = read_json(settings_path)
    token2 = settings2["env"]["MEMACTORS_RESIDENT_TOKEN"]  # type: ignore[index]
    assert token2 != token
    assert {**settings2, "env": None} == {**settings, "env": None}
    assert read_json(repo / ".mcp.json")["mcpServers"]["memactors"] == ours  # type: ignore[index]
    assert await gateway_status(daemon.gateway, token) == 401
    assert await gateway_status(daemon.gateway, token2) == 200

    gone = memactors(daemon, "uninstall", "claude-code", "--harness", "coder", "--project", str(repo), home=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert read_json(repo / ".mcp.json") == USER_MCP
    assert read_json(settings_path) == USER_SETTINGS
    assert (repo / ".git" / "info" / "exclude").read_text(encoding="utf-8") == exclude_before
    assert await gateway_status(daemon.gateway, token2) == 401  # revoked


async def test_install_codex_for_the_user_keeps_the_toml_comments_and_other_tables(
        daemon: Daemon, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    config = home / ".codex" / "config.toml"
    config.write_text(CODEX_CONFIG, encoding="utf-8")
    done = memactors(daemon, "install", "codex", "--harness", "coder", "--user", home=home)
    assert done.returncode == 0, done.stderr
    assert "bound to no directory" in done.stderr  # the harness has no workdir: the user is told
    text = config.read_text(encoding="utf-8")
    assert "# my Codex settings\n" in text and '"gpt-5.5"  # the one I like' in text  # comments and layout kept
    parsed = tomllib.loads(text)
    ours = parsed["mcp_servers"]["memactors"]
    assert ours["url"] == daemon.gateway and ours["default_tools_approval_mode"] == "approve"
    assert parsed["mcp_servers"]["docs"] == {"command": "docs-mcp", "args": ["--stdio"]}
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    token = ours["http_headers"]["Authorization"].removeprefix("Bearer ")
    assert await gateway_status(daemon.gateway, token) == 200
    again = memactors(daemon, "install", "codex", "--harness", "coder", "--user", home=home)
    assert again.returncode == 0, again.stderr
    assert config.read_text(encoding="utf-8").count("[mcp_servers.memactors]") == 1
    gone = memactors(daemon, "uninstall", "codex", "--harness", "coder", "--user", home=home)
    assert gone.returncode == 0, gone.stderr
    assert config.read_text(encoding="utf-8") == CODEX_CONFIG


def test_dry_run_shows_a_diff_and_writes_and_mints_nothing(daemon: Daemon, tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    minted_before = _tokens(daemon)
    done = memactors(daemon, "install", "claude-code", "--harness", "coder", "--project", str(repo), "--dry-run",
                     home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"+++ {repo / '.mcp.json'}" in done.stdout and "mcp__memactors__recall" in done.stdout
    assert '"MEMACTORS_RESIDENT_TOKEN": "<token minted by install>"' in done.stdout
    assert "would create" in done.stdout
    assert not (repo / ".mcp.json").exists() and not (repo / ".claude").exists()
    assert _tokens(daemon) == minted_before


def test_install_refuses_what_it_cannot_merge_and_changes_nothing(daemon: Daemon, tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    (repo / ".claude").mkdir()
    broken = repo / ".claude" / "settings.local.json"
    broken.write_text('{"permissions": {"allow": [}', encoding="utf-8")
    done = memactors(daemon, "install", "claude-code", "--harness", "coder", "--project", str(repo), home=tmp_path)
    assert done.returncode == 5 and str(broken) in done.stderr and "not valid JSON" in done.stderr
    assert not (repo / ".mcp.json").exists() and broken.read_text(encoding="utf-8") == '{"permissions": {"allow": [}'
    # a file git tracks never receives the token
    (repo / ".codex").mkdir()
    (repo / ".codex" / "config.toml").write_text('model = "gpt-5.5"\n', encoding="utf-8")
    subprocess.run(["git", "-C", str(repo), "add", ".codex/config.toml"], check=True, capture_output=True)
    tracked = memactors(daemon, "install", "codex", "--harness", "coder", "--project", str(repo), home=tmp_path)
    assert tracked.returncode == 5 and "tracked by git" in tracked.stderr
    assert (repo / ".codex" / "config.toml").read_text(encoding="utf-8") == 'model = "gpt-5.5"\n'
    unknown = memactors(daemon, "install", "codex", "--harness", "nobody", "--user", home=tmp_path)
    assert unknown.returncode == 5 and "harness.nobody" in unknown.stderr
    usage = memactors(daemon, "install", "codex", "--harness", "coder", home=tmp_path)
    assert usage.returncode == 2 and "--project" in usage.stderr


def test_install_claude_code_for_the_user_honours_claude_config_dir(daemon: Daemon, tmp_path: Path) -> None:
    config_dir = tmp_path / "claude-config"
    env = {**daemon.env, "HOME": str(tmp_path / "home"), "CLAUDE_CONFIG_DIR": str(config_dir)}
    done = subprocess.run([sys.executable, "-m", "memactors.cli", "install", "claude-code", "--harness", "coder",
                           "--user"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    server = read_json(config_dir / ".claude.json")["mcpServers"]["memactors"]  # type: ignore[index]
    assert server["headers"]["Authorization"].startswith("Bearer ") and "${" not in server["headers"]["Authorization"]
    settings = read_json(config_dir / "settings.json")
    assert settings["permissions"] == {"allow": ["mcp__memactors__recall", "mcp__memactors__briefing"]}
    assert "env" not in settings and not (tmp_path / "home").exists()
    assert stat.S_IMODE((config_dir / ".claude.json").stat().st_mode) == 0o600
    subprocess.run([sys.executable, "-m", "memactors.cli", "uninstall", "claude-code", "--harness", "coder",
                    "--user"], env=env, capture_output=True, text=True, timeout=120, check=True)
    # install created both files and the directory: uninstall removes them all
    assert not (config_dir / ".claude.json").exists() and not (config_dir / "settings.json").exists()
    assert not config_dir.exists()


def _tokens(daemon: Daemon) -> int:
    import sqlite3

    db = sqlite3.connect(daemon.state / "memactors.db")
    try:
        return int(db.execute("SELECT count(*) FROM run_callers").fetchone()[0])
    finally:
        db.close()


def test_mcp_config_for_codex_is_a_config_toml_table_with_the_approval_mode(daemon: Daemon) -> None:
    done = daemon.cli("mcp-config", "coder", "--format", "codex")
    assert done.returncode == 0, done.stderr
    server = tomllib.loads(done.stdout)["mcp_servers"]["memactors"]
    assert server["url"] == daemon.gateway and server["default_tools_approval_mode"] == "approve"
    assert server["http_headers"]["Authorization"].startswith("Bearer ")
    claude = daemon.cli("mcp-config", "coder")
    assert json.loads(claude.stdout)["mcpServers"]["memactors"]["type"] == "http"  # stdout stays .mcp.json
    assert '"allow": ["mcp__memactors__recall", "mcp__memactors__briefing"]' in claude.stderr
    plain = json.loads(daemon.cli("mcp-config", "coder", "--format", "json").stdout)
    assert plain["claude_code_allow"] == ["mcp__memactors__recall", "mcp__memactors__briefing"]
    assert os.environ.get("HARNESS_CONFIG") != daemon.env["HARNESS_CONFIG"]
