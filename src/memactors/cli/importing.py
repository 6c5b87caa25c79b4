"""`memactors import`: the history a user already has, as run records.

`import git --repo DIR` turns each commit (its message, the files it changed, its author time) into a
closed run record; `import claude-code` and `import codex` turn each past session transcript into one.
Every record then takes the one path live runs take: IngestRuns over the operator RPC, where the daemon
bounds, validates and redacts it (REQ-6), assembles its episode (REQ-5) and decides whether one is
recorded at all (REQ-8). Nothing here writes the store.

Idempotent by construction: a record's run id is derived from what it came from (``git-<commit sha>``,
the session id), so the episode id (a hash of harness, run id and start time) is the same on every
import, and a second import answers ``duplicate`` for each record and adds nothing.

What a record carries is only what the episode may show: a commit's message (without its ``…-by:``
trailers, which name people), the repository-relative paths it changed, its author time; a session's
edited paths inside its repository (paths outside it are dropped here, before anything is sent), its
branch, model, cost and last answer. Never a prompt, never a tool's arguments, never tool output. A
session whose directory is in no git repository is not sent (REQ-8 would record no episode for it, and
the daemon would keep its run for the graph; an import keeps nothing of it).

A file that cannot be read as a transcript (not UTF-8, a line that is not JSON before the last one, no
session in it) is named on stderr and in the JSON summary, and skipped; the rest go in. Exit 1 when
anything was malformed or rejected, as `runs ingest` does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _backfill
from . import _core as core
from ._core import EXIT_FAILED, EXIT_OK, JSON_HELP, SERVICE, CliError

if TYPE_CHECKING:  # the readers and the progress line load when a command runs, not at CLI start
    from ..agents.transcript import SessionTranscript
    from .runs import Progress

#: Records per IngestRuns call (the contract allows at most 500; `runs ingest` sends 200 too).
BATCH = 200
#: A commit message or a session's answer as recorded is cut to this many characters (its last ones,
#: as `agents.run_record.MAX_RESULT_CHARS` cuts a supervised run's answer).
MAX_RESULT_CHARS = 16_000
#: Paths kept per commit (the daemon keeps 1000 per run for the graph, 50 in the episode).
MAX_PATHS = 1000
#: The run record schema's bounds for one path: one line, at most 4096 characters.
_BAD_PATH = re.compile("[\u0000-\u001f\u007f-\u009f\u2028\u2029]")
#: Commit trailers that name a person (``Co-authored-by: Name <mail>``, ``Signed-off-by: …``).
_PERSON_TRAILER = re.compile(r"(?im)^[A-Za-z][A-Za-z-]*-by:[^\n]*$\n?")


class Found:
    """One thing a source read: a record to send (with the label it is named by), or a file that is
    malformed (with why), or one left out on purpose (with why: no repository, older than --since)."""

    __slots__ = ("label", "problem", "record", "skipped")

    def __init__(self, label: str, record: dict[str, Any] | None = None, *, problem: str | None = None,
                 skipped: str | None = None) -> None:
        self.label, self.record, self.problem, self.skipped = label, record, problem, skipped


# -- times ---------------------------------------------------------------------------------------------

def utc(text: str) -> str:
    """An RFC 3339 time (any offset) as UTC with a ``Z``, to the second."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _is_time(text: str) -> bool:
    """Whether `text` is an RFC 3339 time that has a UTC form (not 2026-02-30, not past year 9999)."""
    try:
        utc(text)
    except (ValueError, OverflowError):
        return False
    return True


def since_of(text: str | None, now: datetime | None = None) -> str | None:
    """`--since`: a duration back from now (90d, 12h) or an RFC 3339 time, as a UTC time; None for all."""
    if text is None:
        return None
    from datetime import timedelta

    from .._toml_tables import is_duration, parse_duration
    from ..errors import ConfigError

    now = now or datetime.now(UTC)
    try:
        return (now - timedelta(seconds=parse_duration(text))).strftime("%Y-%m-%dT%H:%M:%SZ")
    except ConfigError as exc:
        if is_duration(text):  # a duration past the longest one: say so, with the limit
            raise CliError("INVALID_ARGUMENT", f"--since {exc.message}") from None
    try:
        return utc(text)
    except (ValueError, OverflowError):
        raise CliError("INVALID_ARGUMENT", "--since is neither a duration (90d, 12h) nor an RFC 3339 time") from None


def _path_ok(path: str) -> bool:
    return bool(path) and len(path) <= 4096 and not _BAD_PATH.search(path)


# -- git -----------------------------------------------------------------------------------------------

#: Environment that would point git at another repository than the one named (set inside git hooks).
_GIT_LOCATION_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX", "GIT_COMMON_DIR")


def _git(args: list[str], *, cwd: str | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_ENV}
    env |= {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        return subprocess.run(["git", *args], capture_output=True, env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise CliError("FAILED_PRECONDITION", f"cannot run git: {exc.strerror}") from None


def _git_text(args: list[str]) -> str | None:
    done = _git(args)
    return done.stdout.decode("utf-8", "replace").strip() if done.returncode == 0 else None


class GitRepo:
    """A repository to import: where it is, its key (as live runs in it are keyed), its branch."""

    def __init__(self, directory: str, *, key: str | None = None, rev: str = "HEAD", every_ref: bool = False) -> None:
        from ..repo import explicit_key, normalise_remote

        path = os.path.abspath(directory)
        if not os.path.isdir(path):
            raise CliError("NOT_FOUND", f"--repo {directory}: no such directory")
        git_dir = _git_text(["-C", path, "rev-parse", "--absolute-git-dir"])
        if git_dir is None:
            raise CliError("INVALID_ARGUMENT", f"--repo {directory}: not a git repository")
        bare = _git_text(["-C", path, "rev-parse", "--is-bare-repository"]) == "true"
        self.git = ["--git-dir", git_dir]
        #: The directory a commit's session ran in: the working tree's root, or the git dir of a bare one.
        self.root = git_dir if bare else (_git_text(["-C", path, "rev-parse", "--show-toplevel"]) or path)
        self.revs = ["--all"] if every_ref else [rev]
        if key is None:
            names = (_git_text([*self.git, "remote"]) or "").split()
            if names:
                url = _git_text([*self.git, "remote", "get-url", "origin" if "origin" in names else names[0]])
                key = normalise_remote(url) if url else None
            key = key or f"local{self.root}"  # the repository module's rule for a repository without a remote
        self.key = explicit_key(key)
        branch = _git_text([*self.git, "symbolic-ref", "--short", "-q", rev]) if rev == "HEAD" else rev
        self.branch = None if every_ref else branch or None  # (commits of every ref: no one branch)

    def commits(self, since: str | None) -> list[tuple[str, str, str, str, list[str]]]:
        """(sha, author time UTC, committer time UTC, message, paths) of every non-merge commit reachable
        from the revision, newest first; with `since`, only those authored at or after it."""
        if self.revs != ["--all"] and _git_text([*self.git, "rev-parse", "--verify", "-q",
                                                 f"{self.revs[0]}^{{commit}}"]) is None:
            if self.revs == ["HEAD"]:
                return []  # a repository without a commit yet: nothing to import
            raise CliError("INVALID_ARGUMENT", f"--rev {self.revs[0]}: no such commit in the repository")
        done = _git([*self.git, "-c", "core.quotepath=off", "log", "--no-merges", "--no-renames", "-z",
                     "--name-only", "--format=%x1e%H%x1f%aI%x1f%cI%x1f%B%x1f", *self.revs, "--"])
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise CliError("INVALID_ARGUMENT", f"git log {' '.join(self.revs)}: {said[-1] if said else 'failed'}")
        out: list[tuple[str, str, str, str, list[str]]] = []
        for chunk in done.stdout.decode("utf-8", "replace").split("\x1e"):
            if not chunk.strip("\0\n"):
                continue
            sha, authored, committed, rest = chunk.split("\x1f", 3)
            message, _, names = rest.rpartition("\x1f")
            authored = utc(authored)
            if since is not None and authored < since:
                continue
            paths = [p for p in names.lstrip("\0\n").split("\0") if p]
            out.append((sha, authored, max(authored, utc(committed)), message, paths))
        return out


def commit_record(repo: GitRepo, harness: str, sha: str, authored: str, committed: str, message: str,
                  paths: Iterable[str]) -> dict[str, Any]:
    """The closed run record of one commit: run id ``git-<sha>``, started at its author time, its message
    as the answer (trailers naming people dropped), one edit event per repository-relative path.

    ``spawned_process`` is true: a commit is work a real process did (its author's editor, an agent),
    which is what REQ-8's rule tells apart from records of nothing happening."""
    kept = [p for p in paths if _path_ok(p)][:MAX_PATHS]
    text = _PERSON_TRAILER.sub("", message).strip()
    session = f"git-{sha}"
    return {
        "harness": harness,
        "adapter": "git",
        "run_id": f"git-{sha}",
        "trace_id": sha,
        "started_at": authored,
        "ended_at": committed,
        "duration_ms": 0,
        "cost_source": "unknown",
        "model": {"served": None, "pinned": None, "configured": None},
        "outcome": "succeeded",
        "reason": "completed",
        "result_text": text[-MAX_RESULT_CHARS:] if text else None,
        "trigger": {"source": "manual", "name": "import git"},
        "spawned_process": True,
        "prompt": None,
        "sessions": [{"session_id": session, "subagent": False, "cwd": repo.root, "repo": repo.key,
                      "git_branch": repo.branch, "started_at": authored}],
        "events": [{"kind": "edit", "session_id": session, "at": authored, "path": p} for p in kept],
    }


def git_found(args: argparse.Namespace) -> tuple[list[Found], dict[str, Any]]:
    repo = GitRepo(args.repo, key=args.repo_key, rev=args.rev, every_ref=args.all)
    commits = repo.commits(since_of(args.since))
    found = [Found(f"commit {sha[:12]}", commit_record(repo, args.harness, sha, a, c, m, p))
             for sha, a, c, m, p in commits]
    return found, {"repo": repo.key, "branch": repo.branch, "commits": len(commits)}


# -- agent sessions --------------------------------------------------------------------------------------

class Repos:
    """Which repository a session's directory is in (git, cached per directory): its toplevel, or None
    for a directory that is gone or in no repository."""

    def __init__(self) -> None:
        self._top: dict[str, str | None] = {}

    def toplevel(self, cwd: str) -> str | None:
        if cwd not in self._top:
            top = _git_text(["-C", cwd, "rev-parse", "--show-toplevel"]) if os.path.isdir(cwd) else None
            self._top[cwd] = os.path.realpath(top) if top else None
        return self._top[cwd]


def _inside(path: str, cwd: str, toplevel: str) -> bool:
    absolute = os.path.realpath(os.path.join(cwd, path))
    return absolute == toplevel or absolute.startswith(toplevel.rstrip("/") + "/")


def read_lines(path: Path) -> tuple[list[str] | None, str | None]:
    """A JSON-lines file's lines, or why it is malformed: not UTF-8, unreadable, or a line that is not a
    JSON object before the last one (a last line cut short is a session still being written: read past)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {exc.start})"
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    lines = text.splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    for i, (n, line) in enumerate(numbered):
        try:
            ok = isinstance(json.loads(line), dict)
        except RecursionError:
            ok = False
        except ValueError:
            if i == len(numbered) - 1 and i > 0:
                continue
            ok = False
        if not ok:
            return None, f"line {n} is not a JSON object"
    if not numbered:
        return None, "empty"
    return lines, None


def session_found(path: Path, label: str, session: SessionTranscript, *, adapter: str, harness: str, since: str | None,
                  repos: Repos) -> Found:
    """A session read from its file, as the record to send (or why it is left out)."""
    from ..agents.transcript import run_record_from_transcript

    if not session.session_id or not session.started_at or not session.cwd:
        return Found(label, skipped="no session in it")
    for which, at in (("first", session.started_at), ("last", session.ended_at)):
        if at and not _is_time(at):
            # named and skipped (counted as malformed); the other sessions still go in
            return Found(label, problem=f"its {which} timestamp {at[:40]!r} is not a valid RFC 3339 time")
    if since is not None and utc(session.ended_at or session.started_at) < since:
        return Found(label, skipped="older than --since")
    top = repos.toplevel(session.cwd)
    if top is None:
        return Found(label, skipped="no repository")
    # Nothing outside the repository is sent: an edit elsewhere on the machine is dropped here.
    session.edits = [e for e in session.edits if _inside(e.path, session.cwd, top)]
    record = run_record_from_transcript(session, harness=harness, fallback_session_id=path.stem,
                                        fallback_cwd=session.cwd, ended_at=session.ended_at or session.started_at,
                                        trigger_name=f"import {adapter}")
    record["adapter"] = adapter
    if record.get("result_text") and len(record["result_text"]) > MAX_RESULT_CHARS:
        record["result_text"] = record["result_text"][-MAX_RESULT_CHARS:]
    return Found(label, record)


def sessions_found(args: argparse.Namespace, adapter: str, files: list[Path]) -> list[Found]:
    """Each file read with its adapter's reader; a malformed one named with why."""
    from ..agents.codex_rollout import read_codex_rollout
    from ..agents.transcript import read_claude_transcript
    from ..config import DEFAULT_VERIFY_PATTERNS

    harness_cfg = None
    try:
        harness_cfg = core.load(args).harness.get(args.harness)
    except Exception:  # ok: a missing or broken configuration only means the default verify patterns
        harness_cfg = None
    patterns = harness_cfg.verify_patterns if harness_cfg else DEFAULT_VERIFY_PATTERNS
    read = read_claude_transcript if adapter == "claude-code" else read_codex_rollout
    since = since_of(args.since)
    repos = Repos()
    out: list[Found] = []
    for path in files:
        label = str(path)
        if since is not None and utc(datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()) < since:
            out.append(Found(label, skipped="older than --since"))  # nothing written to it since
            continue
        lines, problem = read_lines(path)
        if lines is None:  # then `problem` says why
            out.append(Found(label, problem=problem))
            continue
        session = read(lines, patterns)
        out.append(session_found(path, label, session, adapter=adapter, harness=args.harness, since=since,
                                 repos=repos))
    return out


def transcript_files(root: Path, pattern: str) -> list[Path]:
    """The session files under `root`, sorted; Claude Code's subagent transcripts (a session's
    ``subagents/`` directory) are part of their session, not sessions of their own."""
    if not root.is_dir():
        raise CliError("NOT_FOUND", f"--dir {root}: no such directory")
    return sorted(p for p in root.rglob(pattern) if p.is_file() and "subagents" not in p.relative_to(root).parts)


def cmd_import_claude_code(args: argparse.Namespace) -> int:
    default = Path(os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude") / "projects"
    root = Path(args.dir).expanduser() if args.dir else default
    found = sessions_found(args, "claude-code", transcript_files(root, "*.jsonl"))
    return send(args, found, "claude-code", {"dir": str(root), "files": len(found)})


def cmd_import_codex(args: argparse.Namespace) -> int:
    default = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex") / "sessions"
    root = Path(args.dir).expanduser() if args.dir else default
    found = sessions_found(args, "codex", transcript_files(root, "rollout-*.jsonl"))
    return send(args, found, "codex", {"dir": str(root), "files": len(found)})


# -- sending ---------------------------------------------------------------------------------------------

def send(args: argparse.Namespace, found: list[Found], what: str, about: dict[str, Any]) -> int:
    """Send every record down IngestRuns (batches under the frame budget), with progress on stderr;
    print the summary (or `--json`). `--dry-run` only counts."""
    from . import runs

    counts: dict[str, int] = {"recorded": 0, "queued": 0, "duplicate": 0, "skipped": 0, "rejected": 0}
    malformed = [{"file": f.label, "error": f.problem} for f in found if f.problem]
    left_out: dict[str, int] = {}
    for f in found:
        if f.skipped:
            left_out[f.skipped] = left_out.get(f.skipped, 0) + 1
    todo = [f for f in found if f.record is not None]
    if not args.json:
        for m in malformed:
            print(f"malformed {m['file']}: {m['error']}", file=sys.stderr)
    summary: dict[str, Any] = {"source": what, **about, "records": len(todo), "malformed": malformed,
                               "left_out": left_out}
    if args.dry_run:
        summary["dry_run"] = True
        if args.json:
            core.print_json(summary)
        else:
            print(f"{what}: {len(todo)} record(s) would be sent{_extra(malformed, left_out)} (dry run: nothing sent)")
        return EXIT_FAILED if malformed else EXIT_OK
    rejected: list[dict[str, Any]] = []
    episodes: list[str] = []
    progress = runs.Progress(len(todo), sys.stderr.isatty() and not args.json)
    started = time.monotonic()
    try:
        _send_all(args, todo, counts, rejected, episodes, progress)
    finally:
        progress.clear()
    seconds = time.monotonic() - started
    summary |= {"outcomes": counts, "rejected": rejected, "seconds": round(seconds, 3),
                "records_per_s": core.per_second(len(todo), seconds),
                "episodes": len(episodes), "episode_ids": episodes[:20]}
    if args.json:
        core.print_json(summary)
    else:
        for r in rejected:
            print(f"rejected {r['file']}: {r['error']}", file=sys.stderr)
        print(f"{what}: {len(todo)} record(s): {runs._summary(counts)}{_extra(malformed, left_out)}")
        print(core.rate_line(len(todo), seconds), file=sys.stderr)
    waited = _backfill.follow(args, quiet=args.json)
    return EXIT_FAILED if malformed or counts["rejected"] or waited != EXIT_OK else EXIT_OK


def _extra(malformed: list[dict[str, Any]], left_out: dict[str, int]) -> str:
    parts = [f"{len(malformed)} malformed file(s) skipped"] if malformed else []
    parts += [f"{n} left out ({why})" for why, n in sorted(left_out.items())]
    return "; " + "; ".join(parts) if parts else ""


def _send_all(args: argparse.Namespace, todo: list[Found], counts: dict[str, int], rejected: list[dict[str, Any]],
              episodes: list[str], progress: Progress) -> None:
    import trio

    from ..rpc.client import connect_rpc
    from ..rpc.frames import MAX_MESSAGE_SIZE, encode_frame
    from . import runs

    config = core.load(args)
    token = core.token_for(config, "control")
    url = core.operator_url(config)
    budget = MAX_MESSAGE_SIZE - runs.FRAME_BUDGET_HEADROOM

    def tally(label: str, result: dict[str, Any]) -> None:
        outcome = result.get("outcome", "rejected")
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "rejected":
            error = result.get("error") or {}
            rejected.append({"file": label, "error": error.get("message", "") if isinstance(error, dict) else str(error)})
        elif result.get("episode_id"):
            episodes.append(result["episode_id"])
        progress.done += 1

    async def main() -> None:
        async with connect_rpc(url, token) as client:
            batch: list[tuple[str, dict[str, Any]]] = []
            size = 0

            async def flush() -> None:
                nonlocal batch, size
                if not batch:
                    return
                items, batch, size = batch, [], 0
                answer = await client.call(f"{SERVICE}/IngestRuns",
                                           {"records": [{"record": r, "source": s} for s, r in items]})
                for (label, _), result in zip(items, answer["results"], strict=True):
                    tally(label, result)
                progress.update(counts)

            for f in todo:
                assert f.record is not None
                if (problem := runs._record_problem(f.record, f.label)) is not None:
                    tally(f.label, {"outcome": "rejected", "error": {"message": problem}})
                    continue
                one = len(encode_frame({"record": f.record, "source": f.label}).encode("utf-8")) + 1
                if len(batch) >= BATCH or size + one > budget:
                    await flush()
                batch.append((f.label, f.record))
                size += one
            await flush()

    trio.run(main)


# -- the commands ----------------------------------------------------------------------------------------

def cmd_import_git(args: argparse.Namespace) -> int:
    found, about = git_found(args)
    return send(args, found, "git", about)


def _common(p: argparse.ArgumentParser, harness: str, harness_help: str) -> None:
    p.add_argument("--since", metavar="WHEN", help="only what happened since: a duration back from now (90d, 12h) "
                                                   "or an RFC 3339 time (default: everything)")
    p.add_argument("--harness", default=harness, help=harness_help)
    p.add_argument("--dry-run", action="store_true", help="read and count only; send nothing")
    p.add_argument("--json", action="store_true", help=JSON_HELP + " (a summary)")
    _backfill.add_wait_option(p)


def register(sub: Any) -> None:
    imp = sub.add_parser("import", help="import past history (git commits, agent sessions) as episodes").add_subparsers(
        dest="import_command", required=True, metavar="SOURCE")
    p = imp.add_parser(
        "git", help="each commit of a repository becomes an episode (control tier)",
        description="Each non-merge commit reachable from --rev (its message, the files it changed, its author "
                    "time) becomes a closed run record of the --harness harness, ingested as a live run's is "
                    "(redaction, assembly, eligibility). Importing again adds nothing: each commit answers "
                    "duplicate. Progress on stderr; exit 1 when a record was rejected.")
    p.add_argument("--repo", required=True, metavar="DIR", help="the repository (a checkout, or a bare git dir)")
    p.add_argument("--rev", default="HEAD", help="the history to import: commits reachable from this (default HEAD)")
    p.add_argument("--all", action="store_true", help="every commit reachable from any ref, not only --rev's")
    p.add_argument("--repo-key", metavar="KEY",
                   help="the repository key to record under (default: its origin remote's, else local<path>)")
    _common(p, "imported", "the harness the episodes belong to (default: imported)")
    p.set_defaults(fn=cmd_import_git)

    for name, fn, where, pattern in (
            ("claude-code", cmd_import_claude_code, "$CLAUDE_CONFIG_DIR/projects, else ~/.claude/projects",
             "*.jsonl"),
            ("codex", cmd_import_codex, "$CODEX_HOME/sessions, else ~/.codex/sessions", "rollout-*.jsonl")):
        p = imp.add_parser(
            name, help=f"each past {name} session becomes an episode (control tier)",
            description=f"Each {name} session file ({pattern} under --dir) becomes a closed run record, ingested "
                        "as a live run's is: its edits inside its repository, its verify commands' results, its "
                        "last answer, model and cost; never the prompt, tool arguments or tool output. A session "
                        "whose directory is in no repository is left out. A malformed file is named and skipped; "
                        "the rest go in (exit 1 when any was malformed). Importing again adds nothing.")
        p.add_argument("--dir", metavar="DIR", help=f"where the sessions are (default: {where})")
        _common(p, name, f"the harness the episodes belong to (default: {name}; name your resident's "
                         "harness to merge with the sessions its hook recorded)")
        p.set_defaults(fn=fn)
