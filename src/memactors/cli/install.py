"""`memactors install` and `memactors uninstall`: connect a resident agent to memactors in one command.

``install claude-code|codex|gemini-cli|opencode --harness NAME (--project DIR | --user) [--dry-run]`` mints a gateway token
for the harness (control tier, ``MintRunToken`` with ``replace``: running install again rotates it, and
the old token stops working), then merges into the agent's own configuration files the MCP server
entry, the allow-list for the memory tools and, for Claude Code, Codex and Gemini CLI, the ``SessionEnd``
hook that records each session (for OpenCode a plugin). The resident pulls its briefing (the ``briefing``
tool and resource; the gateway's MCP ``instructions`` tell it to read it before it starts work): only
``--briefing-at-start`` adds the ``SessionStart`` hook that prints it into each session as context (a
departure from REQ-15 the operator chooses, docs/contracts.md; ``_install_plan`` and the agents' ``_layout_*`` modules say which files and how; ``_session_start`` and
``residents`` are those hooks). It then makes sure the running daemon knows the harness (a
SIGHUP when it does not yet). ``--dry-run`` prints the changes as a diff and touches nothing: no token is
minted, no file written. ``uninstall`` puts every file back byte for byte (what install found is kept in
the state directory's ``installs/``), removes what install created and revokes the token (``RevokeRunTokens``); with the daemon down it still cleans the files and queues the
revocation in the state directory (``spool.queue_revocation``), which the daemon applies when it next
starts, before its gateway serves.

The user runs these; the daemon never writes an agent's configuration on its own, and nothing is typed
into a session (REQ-15).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..adapters.kinds import KINDS
from ._core import CliError, call, load
from ._install_change import Change, Target

if TYPE_CHECKING:  # the configuration loads when a command runs, not at the CLI's start
    from ..config import Config, HarnessConfig

__all__ = ["register", "run_id_for"]

#: Tokens minted by install live this long unless --ttl says otherwise (MintRunToken allows a year at most);
#: run install again to rotate before then.
DEFAULT_TTL = "365d"


#: What `install --help` and `uninstall --help` say (the module's docstring is for the code's readers).
DESCRIPTIONS = {
    "install": (
        f"Connect a resident agent ({', '.join(k.title for k in KINDS.values())}) to memactors. Mints a gateway token for the harness "
        "(running install again replaces it, and the old token stops working), then adds to the agent's own "
        "configuration files the memactors MCP server, the allow-list for its memory tools and, for Claude "
        "Code, Codex and Gemini CLI, the session-end hook that records each session (for OpenCode, a plugin). "
        "The agent pulls its briefing with the briefing tool, as the server's instructions tell it; "
        "--briefing-at-start also prints it into each new session (a session-start hook). A daemon that does not know the harness "
        "yet is sent SIGHUP to reload. --project DIR changes that project's files, "
        "--user every project of this user. --dry-run prints the changes as a diff and changes nothing: no "
        "token is minted, no file written."),
    "uninstall": (
        "Put the agent's configuration files back byte for byte as `memactors install` found them (files and "
        "directories it created are removed; a file changed since loses only memactors' entries) and revoke its "
        "token. With the daemon down the files are still cleaned, and the token lapses at its expiry."),
}


def register(sub: Any) -> None:
    for verb, helps in (("install", "connect a resident agent: MCP server, memory-tool allow-list, session hook"),
                        ("uninstall", "remove what `memactors install` wrote and revoke its token")):
        p = sub.add_parser(verb, help=helps, description=DESCRIPTIONS[verb])
        p.add_argument("agent", choices=tuple(KINDS), help="the agent whose configuration to change")
        p.add_argument("--harness", required=True, help="the [harness.<name>] the resident runs as")
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--project", metavar="DIR", help="this project only (its "
                           f"{', '.join(k.project_files for k in KINDS.values())})")
        where.add_argument("--user", action="store_true", help="every project of this user ("
                           f"{', '.join(k.user_files for k in KINDS.values())})")
        p.add_argument("--dry-run", action="store_true", help="show the changes as a diff; write and mint nothing")
        p.add_argument("--json", action="store_true", help="print {agent, scope, harness, run_id, files, ...}")
        if verb == "install":
            p.add_argument("--briefing-at-start", action="store_true",
                           help="also print the briefing into each new session as context (a session-start hook; "
                                "for OpenCode, its plugin). A departure from REQ-15 the operator chooses: the "
                                "agent gets its briefing without asking, at the cost of tokens in every session "
                                "(docs/contracts.md). Default: the agent pulls it with the briefing tool")
            p.add_argument("--ttl", metavar="D", default=DEFAULT_TTL,
                           help=f"how long the token lives, e.g. 90d (default {DEFAULT_TTL}, at most 366d)")
            p.set_defaults(fn=cmd_install)
        else:
            p.set_defaults(fn=cmd_uninstall)


def run_id_for(agent: str, project: Path | None) -> str:
    """The run id the resident's token speaks for: one per agent and place, so installing again rotates
    that one token and an install elsewhere keeps its own."""
    place = str(project) if project is not None else "user"
    return f"resident-{agent}-{'project' if project is not None else 'user'}-" \
           f"{hashlib.sha256(place.encode()).hexdigest()[:8]}"


def _target(args: argparse.Namespace) -> Target:
    if args.project is None:
        return Target(args.agent, None)
    project = Path(args.project).expanduser().resolve()
    if not project.is_dir():
        raise CliError("INVALID_ARGUMENT", f"--project {args.project}: not a directory")
    return Target(args.agent, project)


def _hook_command(args: argparse.Namespace) -> str:
    """The SessionEnd hook as this installation runs it: this interpreter, and the configuration this
    command read when it was named explicitly (the agent's environment may not carry HARNESS_CONFIG).
    ``hook <agent> session-end`` for every agent; OpenCode's plugin and pi's extension run it themselves."""
    argv = [sys.executable, "-m", "memactors.cli"]
    config = args.config or os.environ.get("HARNESS_CONFIG")
    if config:
        argv += ["--config", str(Path(config).expanduser().resolve())]
    return shlex.join([*argv, "hook", args.agent, "session-end", "--harness", args.harness])


def _start_command(args: argparse.Namespace, target: Target) -> str:
    """The SessionStart hook, only with ``--briefing-at-start`` (REQ-15: by default the resident pulls its
    briefing, nothing is pushed into its session): fetches this resident's briefing from the gateway, with
    the token install wrote for ``target`` (read from the agent's files, never from argv)."""
    if not getattr(args, "briefing_at_start", False):
        return ""
    argv = [sys.executable, "-m", "memactors.cli"]
    config = args.config or os.environ.get("HARNESS_CONFIG")
    if config:
        argv += ["--config", str(Path(config).expanduser().resolve())]
    where = ["--project", str(target.project)] if target.project is not None else ["--user"]
    return shlex.join([*argv, "hook", args.agent, "session-start", "--harness", args.harness, *where])


def _tool_command(args: argparse.Namespace, target: Target) -> str:
    """pi's extension runs this for a memory tool call (``hook pi tool … <tool>``): pi has no MCP client."""
    if args.agent != "pi":
        return ""
    argv = [sys.executable, "-m", "memactors.cli"]
    config = args.config or os.environ.get("HARNESS_CONFIG")
    if config:
        argv += ["--config", str(Path(config).expanduser().resolve())]
    where = ["--project", str(target.project)] if target.project is not None else ["--user"]
    return shlex.join([*argv, "hook", "pi", "tool", "--harness", args.harness, *where])


def _diff(change: Change, token: str | None) -> str:
    import difflib

    def lines(text: str | None) -> list[str]:
        text = text or ""
        if token:
            text = text.replace(token, "<token>")
        return text.splitlines(keepends=True)

    label = str(change.path)
    return "".join(difflib.unified_diff(lines(change.before), lines(change.after),
                                        fromfile=label if change.before is not None else "/dev/null",
                                        tofile=label if change.after is not None else "/dev/null"))


def _report(args: argparse.Namespace, changes: list[Change], summary: dict[str, Any], token: str | None) -> None:
    files = [{"path": str(c.path), "action": c.action, "what": c.what} for c in changes]
    if args.json:
        print(json.dumps({**summary, "dry_run": args.dry_run, "files": files}, indent=2, sort_keys=True))
        return
    if args.dry_run:
        for change in changes:
            if change.action != "unchanged":
                print(_diff(change, token), end="")
    verb = "would" if args.dry_run else ""
    for change in changes:
        done = {"create": "create", "update": "update", "remove": "remove", "unchanged": "leave unchanged"}[change.action]
        past = {"create": "created", "update": "updated", "remove": "removed", "unchanged": "unchanged"}[change.action]
        word = f"{verb} {done}" if verb else past
        print(f"  {word} {change.path}: {change.what}")


def cmd_install(args: argparse.Namespace) -> int:
    from ..config import parse_duration
    from ..errors import ConfigError
    from . import _install_plan as files
    from .agents import gateway_url, harness_config

    config = load(args)
    harness = harness_config(config, args.harness)
    try:
        ttl = parse_duration(args.ttl)
    except ConfigError as exc:  # name the flag (the message has the value and the limit)
        raise CliError("INVALID_ARGUMENT", f"--ttl {exc.message}") from None
    target = _target(args)
    env = dict(os.environ)
    url = gateway_url(config)
    hook = _hook_command(args)
    start = _start_command(args, target)
    run_id = run_id_for(args.agent, target.project)
    # OpenCode's plugin lives beside install's manifest (cli/_layout_settings says why).
    plugin = {"opencode": _manifest_path(config.store.path, run_id).with_suffix(".opencode-plugin.js"),
              "pi": _manifest_path(config.store.path, run_id).with_suffix(".pi-extension.ts")}.get(args.agent)
    tool = _tool_command(args, target)
    # Plan first with a placeholder: a file that cannot be merged fails here, before a token is minted.
    files.plan(target, env=env, install=True, url=url, hook_command=hook, start_command=start, plugin_file=plugin,
               tool_command=tool)
    summary: dict[str, Any] = {"agent": args.agent, "scope": target.scope, "harness": args.harness, "run_id": run_id,
                               "gateway": url, "briefing_at_start": bool(start)}
    notes = _notes(args, target, harness, env)
    if args.dry_run:
        changes = files.plan(target, env=env, install=True, url=url, hook_command=hook, start_command=start,
                             plugin_file=plugin, tool_command=tool)
        _report(args, changes, summary, None)
        _print_notes(args, notes)
        return 0
    workdir = str(target.project) if target.project is not None else ""
    minted = call(args, "MintRunToken", {"harness": args.harness, "run_id": run_id, "workdir": workdir,
                                         "ttl_seconds": ttl, "replace": True}, tier="control")
    token = minted["token"]
    changes = files.plan(target, env=env, install=True, url=url, token=token, hook_command=hook,
                         start_command=start, plugin_file=plugin, tool_command=tool)
    manifest_path = _manifest_path(config.store.path, run_id)
    manifest_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, before a plugin is put there
    manifest = _install_manifest(target, env, changes, _load_manifest(manifest_path))
    for change in changes:
        files.write(change)
    _save_manifest(manifest_path, manifest)
    summary.update(expires_at=minted.get("expires_at"), revoked=minted.get("revoked", 0))
    # The daemon must know [harness.<name>] to brief the resident: one added just now is reloaded.
    reload = summary["daemon_config"] = _daemon_knows(args, config)
    if not args.json:
        where = target.project if target.project is not None else "your user configuration"
        print(f"memactors installed for {args.agent} in {where}, as harness {args.harness}:")
    _report(args, changes, summary, token)
    if not args.json:
        rotated = f"; {minted['revoked']} earlier token(s) revoked" if minted.get("revoked") else ""
        print(f"  token for run {run_id} expires {minted.get('expires_at') or 'never'}{rotated}"
              " (run install again to rotate it)")
    if not args.json and reload == "reloaded":
        print(f"  the daemon did not know [harness.{args.harness}] yet: sent it SIGHUP, and it reloaded its "
              "configuration")
    _print_notes(args, notes + _reload_notes(args, config, reload))
    return 0


#: How long install waits for the daemon to pick up [harness.<name>] after its SIGHUP.
RELOAD_WAIT_SECONDS = 10.0


def _daemon_knows(args: argparse.Namespace, config: Config) -> str:
    """Make sure the running daemon has this harness's table, which the hooks
    install writes name. ``known``: it had it;
    ``reloaded``: it had not, so it was sent SIGHUP (its pid from daemon.json) and now has it;
    ``not_reloaded``: it still has not (another configuration file, a broken edit, no signal allowed);
    ``unknown``: it did not answer."""
    import signal
    import time

    from ._core import read_daemon_file

    def knows() -> bool | None:
        try:
            call(args, "DescribeHarness", {"harness": args.harness})
        except CliError as exc:
            return False if exc.code == "INVALID_ARGUMENT" else None
        return True

    first = knows()
    if first is None:
        return "unknown"  # the daemon did not answer: nothing to say about its configuration
    if first:
        return "known"
    found = read_daemon_file(config.store.path) or {}
    pid = found.get("pid")
    if isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError:
            return "not_reloaded"
        deadline = time.monotonic() + RELOAD_WAIT_SECONDS
        while time.monotonic() < deadline:
            if knows():
                return "reloaded"
            time.sleep(0.1)  # ok: a CLI command polling another process; no event loop here
    return "not_reloaded"


def _reload_notes(args: argparse.Namespace, config: Config, reload: str) -> list[str]:
    if reload != "not_reloaded":
        return []
    where = config.global_path or "harness.toml"
    return [f"the running daemon does not know [harness.{args.harness}], though {where} has it: it reads another "
            "configuration file, or its reload failed (`memactors doctor` says why). Fix that, then send it "
            "SIGHUP (kill -HUP <pid in daemon.json>) or restart it; until then the resident's token is refused "
            "a briefing"]


def cmd_uninstall(args: argparse.Namespace) -> int:
    from . import _install_plan as files
    from ._core import config_for

    target = _target(args)
    run_id = run_id_for(args.agent, target.project)
    manifest_path = _manifest_path(config_for(args, "read").store.path, run_id)
    manifest = _load_manifest(manifest_path)
    changes, modes = _uninstall_plan(files.plan(target, env=dict(os.environ), install=False), manifest)
    summary: dict[str, Any] = {"agent": args.agent, "scope": target.scope, "harness": args.harness, "run_id": run_id}
    if args.dry_run:
        _report(args, changes, summary, None)
        return 0
    for change in changes:
        files.write(change)
        mode = modes.get(str(change.path))
        if change.after is not None and mode is not None:
            os.chmod(change.path, mode)
    removed = _remove_created_dirs(manifest)
    manifest_path.unlink(missing_ok=True)
    summary["removed_dirs"] = [str(d) for d in removed]
    try:
        revoked = call(args, "RevokeRunTokens", {"harness": args.harness, "run_id": run_id}, tier="control")
        summary["revoked"] = revoked.get("revoked", 0)
        revoke_note = f"  token of run {run_id} revoked ({summary['revoked']})"
    except CliError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        summary["revoked"] = None
        # Queued in the state directory: the daemon revokes it when it next starts, before it serves.
        from datetime import UTC, datetime

        from memactors.agents.spool import queue_revocation

        from ._core import config_for

        state_dir = config_for(args, "control").store.path
        queue_revocation(state_dir, args.harness, run_id, datetime.now(UTC).isoformat(timespec="seconds"))
        summary["revocation_queued"] = True
        revoke_note = (f"  the token of run {run_id} could not be revoked now ({exc.message}); the revocation is "
                       f"queued in {state_dir} and applied when the daemon next starts")
    if not args.json:
        where = target.project if target.project is not None else "your user configuration"
        print(f"memactors uninstalled for {args.agent} from {where}:")
    _report(args, changes, summary, None)
    if not args.json:
        for directory in removed:
            print(f"  removed {directory}/: install created it")
        print(revoke_note)
    return 0


# -- byte-exact uninstall --------------------------------------------------------------------------------------
#
# install keeps, in the state directory (0700; the file 0600: a file's earlier text may hold the user's own
# secrets), what each file it changed held before and what it wrote, and the directories it created.
# uninstall puts back the earlier bytes of every file still as install left it, removes the files and the
# (empty) directories install created, and only for a file changed since (by the user, or by the agent
# rewriting its own state file) removes memactors' entries from what is there, in that file's layout.

class _Written(TypedDict):
    """One file install changed: its text before the first install (None: it did not exist), the text
    install wrote (None: removed), and its mode before."""

    before: str | None
    after: str | None
    mode: int | None


class _Manifest(TypedDict):
    """What install keeps for uninstall. ``files``: path -> a :class:`_Written` as saved; read back from
    the state directory unchecked, so each use checks the entry it reads."""

    files: dict[str, object]
    dirs: list[str]


def _manifest_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / "installs" / f"{run_id}.json"


def _load_manifest(path: Path) -> _Manifest:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"files": {}, "dirs": []}
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return {"files": {}, "dirs": []}
    return {"files": data["files"], "dirs": [d for d in data.get("dirs") or () if isinstance(d, str)]}


def _save_manifest(path: Path, manifest: _Manifest) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False)
    os.replace(tmp, path)


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return None


def _install_manifest(target: Target, env: dict[str, str], changes: list[Change], old: _Manifest) -> _Manifest:
    """What uninstall needs to undo these changes byte for byte: per file the text before the first
    install (kept across re-installs while the file is as the last install left it) and the text written."""
    from . import _install_plan as files

    clean = {str(c.path): c for c in files.plan(target, env=env, install=False)}
    entries: dict[str, object] = dict(old["files"])
    dirs = [d for d in old["dirs"] if Path(d).is_dir()]
    for change in changes:
        key = str(change.path)
        earlier = entries.get(key)
        if isinstance(earlier, dict) and earlier.get("after") == change.before:
            before, mode = earlier.get("before"), earlier.get("mode")
        else:
            # First install here (or the file changed since the last): its exact bytes (its absence: None)
            # unless it holds memactors' entries already (an earlier install whose record is gone), then its
            # text without them. Never a normalised text for a file of the user's own: an empty object, an
            # empty server table or an opencode.json holding only its $schema is put back as it was.
            stripped = clean[key].after if key in clean else change.before
            ours = change.before is not None and files.holds_ours(change.before) and not files.same_content(
                change.path, change.before, stripped)
            before = stripped if ours else change.before
            mode = _mode(change.path)
        if change.after is not None:
            dirs += [str(d) for d in files.missing_dirs(change.path) if str(d) not in dirs]
        entries[key] = _Written(before=before, after=change.after, mode=mode)
    return {"files": entries, "dirs": dirs}


def _uninstall_plan(changes: list[Change], manifest: _Manifest) -> tuple[list[Change], dict[str, int | None]]:
    """The uninstall changes: a file still as install wrote it gets its earlier bytes back (or goes, when
    install created it); any other has memactors' entries removed, in its own layout, and becomes its
    earlier bytes when that is all that differs."""
    from . import _install_plan as files

    out: list[Change] = []
    modes: dict[str, int | None] = {}
    planned = {str(c.path): c for c in changes}
    for key, entry in manifest["files"].items():
        if not isinstance(entry, dict):
            continue
        path = Path(key)
        current = files.read_text(path)
        semantic = planned.pop(key, None)
        if current == entry.get("after"):
            after = entry.get("before")
        elif semantic is not None and files.same_content(path, semantic.after, entry.get("before")):
            after = entry.get("before")
        elif semantic is not None:
            out.append(semantic)
            continue
        else:
            continue  # changed since, and nothing of memactors' in it any more
        modes[key] = entry.get("mode") if isinstance(entry.get("mode"), int) else None
        what = "restored byte for byte as it was before install" if after is not None else "removed: install created it"
        out.append(Change(path, current, after, private=False, what=what))
    out += planned.values()
    return out, modes


def _remove_created_dirs(manifest: _Manifest) -> list[Path]:
    """Remove the directories install created, deepest first, when they are empty now."""
    removed = []
    for directory in sorted({Path(d) for d in manifest["dirs"]}, key=lambda d: len(d.parts), reverse=True):
        try:
            directory.rmdir()
        except OSError:
            continue  # not empty (the user keeps something there) or gone already
        removed.append(directory)
    return removed


def _notes(args: argparse.Namespace, target: Target, harness: HarnessConfig, env: dict[str, str]) -> list[str]:
    """What the user must still know to make the resident work: said, never done behind their back."""
    notes = []
    if target.project is None and not harness.workdir:
        notes.append(f"with --user the token is bound to no directory: recall serves the repository of "
                     f"[harness.{args.harness}] workdir, which is not set (set it, or install with --project)")
    if args.agent == "codex" and target.project is not None and not _codex_trusts(target.project, env):
        notes.append(f"Codex reads {target.project}/.codex/config.toml only in a trusted project: trust it when "
                     "Codex asks, or start the first headless session with `codex exec --trust …`")
    if args.agent == "codex":
        hooks = ("SessionStart hook (the briefing) and SessionEnd hook (records the session)"
                 if getattr(args, "briefing_at_start", False) else "SessionEnd hook (records the session)")
        notes.append(f"Codex runs memactors' {hooks} only once you trust them: open /hooks in Codex and trust "
                     "them. Until then a "
                     "headless `codex exec` skips them without a word (docs/connect-an-agent.md, \"Codex as a "
                     "resident\", says how to trust them without the TUI)")
    if args.agent == "gemini-cli" and target.project is not None:
        notes.append(f"Gemini CLI reads {target.project}/.gemini/settings.json (the server and the hooks) only in a "
                     "trusted folder: trust it when Gemini CLI asks. For a headless `gemini -p` set "
                     "GEMINI_CLI_TRUST_WORKSPACE=true: its --skip-trust comes too late for the project's settings "
                     "(0.61 reads them before it reads its flags)")
    note = KINDS[args.agent].install_note
    if note and (args.agent != "claude-code" or target.project is not None):
        notes.append(note)
    return notes


def _codex_trusts(project: Path, env: dict[str, str]) -> bool:
    """Whether $CODEX_HOME/config.toml marks ``project`` (or a parent) trusted. Best effort: read only."""
    import tomllib

    from ._codex_hooks import codex_config_path

    try:
        data = tomllib.loads(codex_config_path(None, env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    projects = data.get("projects")
    if not isinstance(projects, dict):
        return False
    for place in (project, *project.parents):
        entry = projects.get(str(place))
        if isinstance(entry, dict) and entry.get("trust_level") == "trusted":
            return True
    return False


def _print_notes(args: argparse.Namespace, notes: list[str]) -> None:
    for note in notes:
        print(f"memactors: note: {note}", file=sys.stderr)
