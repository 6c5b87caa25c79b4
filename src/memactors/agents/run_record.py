"""The run record of a supervised run, built from what really happened (schemas/run_record.schema.json).

Pure code and git, no actor: the runs actor (``actors/runs.py``) supervises the process and hands this
module the transcript its adapter parsed, the exit status, why it was stopped, and what git shows
changed; :func:`build_run_record` turns that into the record that goes down ``IngestRun``'s path. Kept
apart from the actor so the rules (outcome and reason, edits cross-checked with git, verify events) are
read and tested on their own, without a process.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from typing import Any, Literal

from ..adapters import CommandRun, Transcript
from ..config import HarnessConfig
from ..models import round_cost

__all__ = ["MAX_RESULT_CHARS", "StopReason", "build_run_record", "cap_reached", "git_changed", "git_start"]

#: The agent's final answer as recorded is cut to this many characters.
MAX_RESULT_CHARS = 16_000

#: Why the daemon stopped a run: its timeout, the daemon stopping, the operator's ``runs cancel``, or a
#: per-harness cap the agent's reported turns or cost passed.
StopReason = Literal["deadline", "operator_cancel", "cancel", "max_turns", "max_cost_usd"]
#: The agent's own result kinds that mean it stopped at a cap memactors passed to it.
_AGENT_CAPS = {"error_max_turns": "max_turns", "error_max_budget_usd": "max_cost_usd"}


def _git(args: list[str], cwd: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        out = subprocess.run(["git", "-C", cwd, *args], capture_output=True, env=env, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def _porcelain(text: str | None) -> set[str]:
    """Paths (repository-relative) in ``git status --porcelain -z --untracked-files=all`` output: every file,
    also each one in a new untracked directory (without ``-uall`` git names only the directory)."""
    if not text:
        return set()
    paths: set[str] = set()
    fields = text.split("\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.add(entry[3:])
        if entry[0] in "RC":
            i += 1  # the rename's source path follows
    return paths


def git_start(workdir: str) -> tuple[str | None, str | None, frozenset[str]]:
    """Branch, HEAD commit and the paths already dirty when the run starts."""
    branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], workdir)
    branch = branch.strip() if branch and branch.strip() != "HEAD" else None
    commit = _git(["rev-parse", "--verify", "-q", "HEAD"], workdir)
    dirty = _porcelain(_git(["status", "--porcelain=v1", "-z", "--untracked-files=all"], workdir))
    return branch, commit.strip() if commit else None, frozenset(dirty)


def git_changed(toplevel: str, start_commit: str | None) -> set[str] | None:
    """Repository-relative paths changed since the run started: the worktree and every commit since."""
    status = _git(["status", "--porcelain=v1", "-z", "--untracked-files=all"], toplevel)
    if status is None:
        return None
    changed = _porcelain(status)
    if start_commit:
        diff = _git(["diff", "--name-only", "-z", start_commit], toplevel)
        changed |= {p for p in (diff or "").split("\0") if p}
    return changed


def _verify_matches(command: str, patterns: Iterable[str]) -> bool:
    return any(re.search(p, command) for p in patterns)


def cap_reached(stopped: StopReason | None, transcript: Transcript) -> str | None:
    """The per-harness cap that ended the run (``max_turns`` or ``max_cost_usd``): the daemon stopped it
    there, or the agent stopped itself at the cap memactors passed it (Claude Code's ``error_max_turns``,
    ``error_max_budget_usd``); None otherwise."""
    if stopped in ("max_turns", "max_cost_usd"):
        return stopped
    return _AGENT_CAPS.get(transcript.result_kind or "")


def _outcome(transcript: Transcript, *, exit_code: int | None, stopped: StopReason | None, spawn_error: bool,
             verify_ok: list[bool | None], output: bool) -> tuple[str, str]:
    if spawn_error:
        return "crashed", "spawn_error"
    if stopped == "deadline":
        return "timed_out", "deadline"
    if stopped in ("operator_cancel", "cancel"):
        return "cancelled", "operator_cancel"
    if stopped in ("max_turns", "max_cost_usd"):
        return "cancelled", "budget_exceeded"
    if exit_code is not None and exit_code < 0:
        return "crashed", "signal"
    if not output and exit_code:
        # The agent exited non-zero without a line of output: it never ran (a bad flag, a refused
        # option, a missing key); its stderr tail, kept with the run, says why.
        return "failed", "launch_failed"
    if transcript.result_ok is False:
        if (transcript.result_kind or "").startswith("error_max"):
            return "failed", "budget_exceeded"
        return "failed", "exit_nonzero"
    if exit_code:
        return "failed", "exit_nonzero"
    if verify_ok and verify_ok[-1] is None:
        # The last test command the agent ran never reported its end: nothing says it passed.
        return "failed", "verify_incomplete"
    if verify_ok and not verify_ok[-1]:
        return "failed", "verify_failed"
    return "succeeded", "completed"


def _in_order(transcript: Transcript) -> list[CommandRun]:
    """The commands that ended, with those that never did (``running``) placed where they started."""
    waiting = sorted(transcript.running.values(), key=lambda pc: pc[0])
    out: list[CommandRun] = []
    for i, command in enumerate(transcript.commands):
        while waiting and waiting[0][0] <= i:
            out.append(waiting.pop(0)[1])
        out.append(command)
    out += [c for _, c in waiting]
    return out


def build_run_record(*, harness: str, adapter: str, run_id: str, cfg: HarnessConfig, transcript: Transcript,
                     exit_code: int | None, stopped: StopReason | None, spawn_error: bool, started_at: str,
                     ended_at: str, duration_ms: int, workdir: str, repo_key: str | None, toplevel: str | None,
                     branch: str | None, changed: set[str] | None,
                     dirty_at_start: frozenset[str] = frozenset(), output: bool = True) -> dict[str, Any]:
    """The run record (schemas/run_record.schema.json) of what really happened.

    Outcome and reason: a spawn failure is crashed/spawn_error; the deadline timed_out/deadline; a stop
    (the daemon stopping, ``runs cancel``) cancelled/operator_cancel; a cap the daemon enforced
    cancelled/budget_exceeded; death by a signal nobody sent crashed/signal; a non-zero exit with no
    line of output (``output`` false) failed/launch_failed; the agent's own error result
    failed/budget_exceeded (its ``error_max_*`` kinds) or failed/exit_nonzero; a non-zero exit
    failed/exit_nonzero; a last test command that never finished (no end or no exit status reported)
    failed/verify_incomplete; a last test command that failed failed/verify_failed; else succeeded/completed.
    Edits: the files the agent's tool calls wrote that git shows changed since the start (all of them
    when git cannot tell), plus files git shows changed that no tool call named and that were clean at
    the start (written by a shell command). Verify events: the commands matching ``verify_patterns``
    that have an exit status (a refused or unfinished command has none).
    """
    session_id = transcript.session_id or f"{run_id}-main"
    events: list[dict[str, Any]] = []
    seen: set[str] = set()

    def rel(path: str) -> str:
        absolute = os.path.normpath(os.path.join(workdir, path))
        if toplevel is not None:
            inside = os.path.relpath(absolute, toplevel)
            if not inside.startswith(".."):
                return inside
        return absolute

    def confirmed(path: str) -> bool:
        if changed is None:
            return True
        return path in changed or any(c.endswith("/") and path.startswith(c) for c in changed)

    for edit in transcript.edits:
        path = rel(edit.path)
        if path in seen or not confirmed(path):
            continue
        seen.add(path)
        events.append({"kind": "edit", "session_id": session_id, "at": edit.at, "path": path})
    for path in sorted(changed or ()):
        if path in seen or path.endswith("/") or path in dirty_at_start:
            continue
        seen.add(path)
        events.append({"kind": "edit", "session_id": session_id, "at": ended_at, "path": path})
    verify_ok: list[bool | None] = []   # each verify call's verdict in order; None: it never finished
    for command in _in_order(transcript):
        if not _verify_matches(command.command, cfg.verify_patterns):
            continue
        if not command.finished:
            # Ran, but its end (or exit status) never came: no verify event (it is neither a pass nor a
            # failure), and if no later test command reported, the run is failed/verify_incomplete.
            verify_ok.append(None)
            continue
        if command.exit_code is None:
            continue  # the agent CLI refused to run it: it tested nothing
        ok = command.exit_code == 0
        verify_ok.append(ok)
        events.append({"kind": "verify", "session_id": session_id, "at": command.at, "ok": ok,
                       "error_class": None if ok else "test_failure"})
    outcome, reason = _outcome(transcript, exit_code=exit_code, stopped=stopped, spawn_error=spawn_error,
                               verify_ok=verify_ok, output=output)
    result_text = transcript.result_text
    if result_text is not None and len(result_text) > MAX_RESULT_CHARS:
        result_text = result_text[-MAX_RESULT_CHARS:]
    return {
        "harness": harness,
        "adapter": adapter,
        "run_id": run_id,
        "trace_id": run_id,
        "started_at": started_at,
        "ended_at": ended_at,
        "duration_ms": max(0, duration_ms),
        "cost_usd": round_cost(transcript.cost_usd),
        "cost_source": "reported" if transcript.cost_usd is not None else "unknown",
        "model": {"served": transcript.model, "pinned": None, "configured": cfg.model},
        "outcome": outcome,
        "reason": reason,
        "result_text": result_text,
        "trigger": {"source": "operator", "name": "memactors run"},
        "spawned_process": not spawn_error,
        "prompt": None,
        "sessions": [{"session_id": session_id, "subagent": False, "cwd": workdir, "repo": repo_key,
                      "git_branch": branch, "started_at": started_at}],
        "events": events,
    }
