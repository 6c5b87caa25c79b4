"""`memactors uninstall` puts back, byte for byte (`cmp`), every file `install` changed — JSON in its own
layout, Codex's TOML without a blank line more — and removes the files and directories install created. The
CLI as a subprocess against the daemon as a process, for every agent, per project and per user, with no
files at all and with a corpus of odd-but-valid user files (empty object, empty server table, CRLF, no final
line break, a BOM, TOML comments, an opencode.json holding only its `$schema`). A JSONC file (comments) is
refused, naming it, and left as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fix_agents import git_repo, memactors
from fix_daemon import Daemon

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "claude-code"\n'
#: The user's own files, in layouts json.dumps / tomlkit would not write.
ODD_MCP = '{\n    "mcpServers": {\n        "github": {"type": "http", "url": "https://example.invalid/mcp"}\n    }\n}'
ODD_SETTINGS = '{\n\t"model": "opus",\n\t"permissions": {"allow": ["Bash(git status)"]},\n\t"note": "caf\\u00e9 \u00e9"\n}\n'
ODD_CODEX = ('# my Codex settings\nmodel   =   "gpt-5.5"   # the one I like\n\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\n'
             'args = [ "--stdio" ]\n')
ODD_EXCLUDE = "# git ls-files --others --exclude-from=.git/info/exclude\n*.swp"


def tree(root: Path) -> dict[str, str]:
    """Every file and directory under root (but git's object store, which install never touches)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".git/") and not rel.startswith(".git/info"):
            continue
        out[rel] = "dir" if path.is_dir() else "file"
    return out


def assert_cmp_identical(before: Path, after: Path) -> None:
    """The same entries, and every file `cmp`-identical to its copy taken before install."""
    assert tree(after) == tree(before)
    for rel, kind in tree(before).items():
        if kind == "file":
            done = subprocess.run(["cmp", str(before / rel), str(after / rel)], capture_output=True, text=True,
                                  check=False)
            assert done.returncode == 0, (rel, done.stdout, (after / rel).read_bytes())


def round_trip(daemon: Daemon, agent: str, where: list[str], place: Path, home: Path, tmp_path: Path) -> None:
    snapshot = tmp_path / "before"
    shutil.copytree(place, snapshot, symlinks=True)
    done = memactors(daemon, "install", agent, "--harness", "coder", *where, home=home)
    assert done.returncode == 0, done.stderr
    assert tree(place) != tree(snapshot) or any(  # install did change something
        (place / r).read_bytes() != (snapshot / r).read_bytes() for r, k in tree(place).items() if k == "file")
    done = memactors(daemon, "uninstall", agent, "--harness", "coder", *where, home=home)
    assert done.returncode == 0, done.stderr
    assert_cmp_identical(snapshot, place)


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_uninstall_in_a_project_without_files_leaves_the_project_as_it_was(
        daemon: Daemon, tmp_path: Path, agent: str) -> None:
    repo = git_repo(tmp_path / "ledger")
    round_trip(daemon, agent, ["--project", str(repo)], repo, tmp_path / "home", tmp_path)
    assert not (repo / ".claude").exists() and not (repo / ".codex").exists()  # the directories it created


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_uninstall_in_a_project_restores_oddly_formatted_files_byte_for_byte(
        daemon: Daemon, tmp_path: Path, agent: str) -> None:
    repo = git_repo(tmp_path / "ledger")
    (repo / ".mcp.json").write_text(ODD_MCP, encoding="utf-8")
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.local.json").write_text(ODD_SETTINGS, encoding="utf-8")
    (repo / ".codex").mkdir()
    (repo / ".codex" / "config.toml").write_text(ODD_CODEX, encoding="utf-8")
    os.chmod(repo / ".codex" / "config.toml", 0o640)
    (repo / ".git" / "info" / "exclude").write_text(ODD_EXCLUDE, encoding="utf-8")
    round_trip(daemon, agent, ["--project", str(repo)], repo, tmp_path / "home", tmp_path)
    assert (repo / ".codex" / "config.toml").stat().st_mode & 0o777 == 0o640  # its mode too


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
@pytest.mark.parametrize("files", ["none", "odd"])
def test_uninstall_for_the_user_restores_the_home_byte_for_byte(
        daemon: Daemon, tmp_path: Path, agent: str, files: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if files == "odd":
        (home / ".claude").mkdir()
        (home / ".claude.json").write_text('{"numStartups": 3, "mcpServers": {}}', encoding="utf-8")
        (home / ".claude" / "settings.json").write_text(ODD_SETTINGS, encoding="utf-8")
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").write_text(ODD_CODEX.rstrip("\n"), encoding="utf-8")  # no final newline
    round_trip(daemon, agent, ["--user"], home, home, tmp_path)


def test_a_file_changed_after_install_loses_only_memactors_entries_in_its_own_layout(
        daemon: Daemon, tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    (repo / ".codex").mkdir()
    config = repo / ".codex" / "config.toml"
    config.write_text(ODD_CODEX, encoding="utf-8")
    (repo / ".claude").mkdir()
    settings = repo / ".claude" / "settings.local.json"
    settings.write_text(ODD_SETTINGS, encoding="utf-8")
    exclude = repo / ".git" / "info" / "exclude"
    exclude.write_text(ODD_EXCLUDE, encoding="utf-8")
    home = tmp_path / "home"
    for agent in ("codex", "claude-code"):
        assert memactors(daemon, "install", agent, "--harness", "coder", "--project", str(repo),
                         home=home).returncode == 0
    # the user edits both files after install
    config.write_text(config.read_text(encoding="utf-8") + '\n[profiles.fast]\nmodel = "gpt-5.5-mini"\n',
                      encoding="utf-8")
    data = json.loads(settings.read_text(encoding="utf-8"))
    data["theme"] = "dark"
    settings.write_text(json.dumps(data, indent="\t") + "\n", encoding="utf-8")
    for agent in ("codex", "claude-code"):
        done = memactors(daemon, "uninstall", agent, "--harness", "coder", "--project", str(repo), home=home)
        assert done.returncode == 0, done.stderr
    text = config.read_text(encoding="utf-8")
    assert "memactors" not in text and not text.endswith("\n\n")  # no blank line more at the end
    assert text.startswith(ODD_CODEX) and text.endswith('[profiles.fast]\nmodel = "gpt-5.5-mini"\n')
    kept = settings.read_text(encoding="utf-8")
    assert "memactors" not in kept and '\t"theme": "dark"' in kept  # its tab indent kept
    assert json.loads(kept) == {**json.loads(ODD_SETTINGS), "theme": "dark"}
    # both installs marked lines in .git/info/exclude; both uninstalls leave it as it was, byte for byte
    assert exclude.read_bytes() == ODD_EXCLUDE.encode()


#: The files each agent's install changes, per scope, relative to the project or the home.
AGENT_FILES = {
    ("claude-code", "project"): (".mcp.json", ".claude/settings.local.json"),
    ("claude-code", "user"): (".claude.json", ".claude/settings.json"),
    ("codex", "project"): (".codex/config.toml",),
    ("codex", "user"): (".codex/config.toml",),
    ("gemini-cli", "project"): (".gemini/settings.json",),
    ("gemini-cli", "user"): (".gemini/settings.json",),
    ("opencode", "project"): ("opencode.json",),
    ("opencode", "user"): (".config/opencode/opencode.json",),
    ("qwen-code", "project"): (".qwen/settings.json",),
    ("qwen-code", "user"): (".qwen/settings.json",),
    ("pi", "project"): (".pi/settings.json",),
    ("pi", "user"): (".pi/agent/settings.json",),
}
#: Odd but valid JSON files a user may have (bytes, exactly).
JSON_CORPUS = {
    "empty object": b"{}",
    "empty object, CRLF": b"{}\r\n",
    "empty servers": b'{ "mcpServers": {} }\n',
    "empty mcp table": b'{"mcp": {}}',
    "CRLF layout": b'{\r\n  "model": "opus",\r\n  "mcpServers": {}\r\n}\r\n',
    "no final line break": b'{\n    "theme": "dark"\n}',
    "BOM": b'\xef\xbb\xbf{"theme": "dark"}\n',
    "only $schema": b'{\n  "$schema": "https://opencode.ai/config.json"\n}\n',
    "empty file": b"",
}
TOML_CORPUS = {
    "comments only": b"# my Codex settings\n# nothing yet\n",
    "comments and a key, CRLF": b'# mine\r\nmodel = "gpt-5.5" # the one I like\r\n',
    "no final line break": b'model = "gpt-5.5"',
    "empty servers table": b"[mcp_servers]\n",
    "empty file": b"",
}
#: Valid for the agent, but install cannot merge into it without losing what the user wrote: refused.
JSONC = b'{\n  // my settings\n  "theme": "dark",\n}\n'


@pytest.mark.parametrize("scope", ["project", "user"])
@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "pi"])
def test_uninstall_leaves_every_odd_but_valid_user_file_byte_identical(
        daemon: Daemon, tmp_path: Path, agent: str, scope: str) -> None:
    files = AGENT_FILES[(agent, scope)]
    corpus = TOML_CORPUS if files[0].endswith(".toml") else JSON_CORPUS
    for n, (name, content) in enumerate(corpus.items()):
        home = tmp_path / f"home{n}"
        home.mkdir()
        place = git_repo(home / "ledger") if scope == "project" else home
        where = ["--project", str(place)] if scope == "project" else ["--user"]
        for rel in files:
            (place / rel).parent.mkdir(parents=True, exist_ok=True)
            (place / rel).write_bytes(content)
        snapshot = tmp_path / f"before{n}"
        shutil.copytree(place, snapshot, symlinks=True)
        done = memactors(daemon, "install", agent, "--harness", "coder", *where, home=home)
        assert done.returncode == 0, (name, done.stderr)
        assert any((place / rel).read_bytes() != content for rel in files), name  # install wrote its entries
        done = memactors(daemon, "uninstall", agent, "--harness", "coder", *where, home=home)
        assert done.returncode == 0, (name, done.stderr)
        for rel in files:
            assert (place / rel).read_bytes() == content, (name, rel, (place / rel).read_bytes())
        assert_cmp_identical(snapshot, place)


@pytest.mark.parametrize("agent", ["claude-code", "gemini-cli", "opencode", "qwen-code", "pi"])
def test_install_refuses_a_json_file_with_comments_naming_it_and_changes_nothing(
        daemon: Daemon, tmp_path: Path, agent: str) -> None:
    repo = git_repo(tmp_path / "ledger")
    rel = AGENT_FILES[(agent, "project")][-1]
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_bytes(JSONC)
    snapshot = tmp_path / "before"
    shutil.copytree(repo, snapshot, symlinks=True)
    done = memactors(daemon, "install", agent, "--harness", "coder", "--project", str(repo), home=tmp_path / "home")
    assert done.returncode != 0 and str(repo / rel) in done.stderr and "comments" in done.stderr, done.stderr
    assert_cmp_identical(snapshot, repo)
