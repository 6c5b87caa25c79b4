"""What `memactors install` / `uninstall` write into an agent's configuration files, planned as changes.

The machinery every agent shares: :func:`plan` asks the agent's file layout (``KINDS[agent].layout``:
``_layout_claude``, ``_layout_codex``, or ``_layout_settings`` for the agents with one JSON settings
file) for its :class:`~._install_change.Change` values (each file's text before and after), adds the
``.git/info/exclude`` lines that keep a token's file out of a project's commits, and :func:`write`
applies one change atomically; ``cli/install.py`` shows them (``--dry-run``) or writes them, and records
what uninstall needs (:func:`same_content`, :func:`holds_ours`, :func:`missing_dirs`). Each change
merges into what is there: only memactors' own entries are added, replaced or removed, the
user's other servers, permissions, hooks and keys stay as they were (a TOML file keeps its comments
and layout: tomlkit round-trips it). Installing twice gives the same files but for the new token;
uninstalling removes exactly what installing added, and a file left empty is removed.

Where each agent's files are, and why: its layout module and docs/connect-an-agent.md.

Standard library at the top (the CLI's start-up budget); tomlkit is imported when a TOML file is read.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ..adapters.kinds import KINDS
from ._core import CliError
from ._install_change import Change, Target
from ._jsonfile import BOM, read_exact
from ._layout_claude import plan_claude
from ._layout_codex import plan_codex
from ._layout_settings import PI_SUFFIX, PLUGIN_SUFFIX, plan_settings
from .agents import SERVER_NAME as SERVER

__all__ = ["AGENTS", "holds_ours", "missing_dirs", "plan", "read_text", "same_content", "write"]

EXCLUDE_MARK = "# memactors install: holds a gateway token, keep out of version control"
TOKEN_PLACEHOLDER = "<token minted by install>"
AGENTS = tuple(KINDS)


def read_text(path: Path) -> str | None:
    """A file's text, None when it does not exist."""
    return read_exact(path)


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
    return SERVER in text.lower() or PLUGIN_SUFFIX in text or PI_SUFFIX in text


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
    before = read_exact(exclude)
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
        changes = plan_claude(target, env, install=install, url=url, token=token, hook_command=hook_command,
                              start_command=start_command)
    elif layout == "codex":
        changes = plan_codex(target, env, install=install, url=url, token=token, hook_command=hook_command,
                             start_command=start_command)
    elif layout is not None:  # one JSON settings file (and a plugin or extension)
        changes = plan_settings(target, env, install=install, url=url, token=token, hook_command=hook_command,
                                start_command=start_command, plugin_file=plugin_file, tool_command=tool_command)
    else:
        raise CliError("INVALID_ARGUMENT", f"agent must be one of {', '.join(AGENTS)}, not {target.agent!r}")
    if target.project is not None:
        excluded = _exclude_change(target.project, [c.path for c in changes if c.private], install=install)
        if excluded is not None:
            changes.append(excluded)
    return changes


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
