"""Who is reading (REQ-9): a harness run, an operator, or an unattributed caller, and so which scopes
a read may see.

A run's repository is the one its run works in now as the store records it (live presence, else the
ingested run), else its workdir's before the run's first session. The briefing actor resolves a view for
every read; this module, below the actors (it reads the store and git and holds no state), says whose
eyes it is for.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from .config import Config
from .repo import resolve_repo, scope_for
from .store import Store
from .store.run_history import latest_branch
from .store.run_history import latest_run_place as latest_run_place
from .store.run_history import run_place as run_place

__all__ = ["UNATTRIBUTED", "View", "latest_run_place", "resolve_view", "run_place"]


@attrs.frozen
class View:
    """Whose eyes a read is for, and so which scopes it may see (REQ-9).

    ``repo`` is the caller's repository key (None outside any repository or when unattributed);
    ``run_id`` is set for a harness run (exposure is written to it), None for operator views.
    """

    kind: Literal["run", "operator", "unattributed"]
    harness: str | None = None
    run_id: str | None = None
    repo: str | None = None
    branch: str | None = None
    #: Set when the caller could not be resolved because the store is down (``store_unavailable``): every
    #: document composed for this view carries it, even one with nothing else to say.
    degraded: str | None = None

    @property
    def episode_scopes(self) -> tuple[str, ...]:
        """The scopes memory_recall may search: the repository's project scope, or none at all."""
        if self.kind == "unattributed" or not self.repo:
            return ()
        return (scope_for(self.repo),)

    @property
    def fact_scopes(self) -> tuple[str, ...]:
        """Fleet facts everyone may see, plus the repository's own."""
        return ("fleet", *self.episode_scopes)

    @property
    def exposed_run(self) -> tuple[str, str] | None:
        """(harness, run) that exposure rows are written for; None for operators and unattributed callers."""
        if self.kind == "run" and self.harness and self.run_id:
            return self.harness, self.run_id
        return None


UNATTRIBUTED = View("unattributed")


def _git_branch_sync(workdir: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", workdir, "symbolic-ref", "--short", "-q", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    branch = out.stdout.strip()
    return branch if out.returncode == 0 and branch else None  # detached HEAD: no branch


#: What a HEAD file says when HEAD is a branch: the branch's full ref name after it.
_BRANCH_REF = "ref: refs/heads/"


def head_branch(toplevel: str) -> str | None | Literal[False]:
    """The branch checked out in the work tree at ``toplevel``, read from its HEAD file (``.git/HEAD``, or
    the one a ``.git`` file's ``gitdir:`` names: a linked worktree, a submodule): None for a detached
    HEAD, False when the file does not say plainly (HEAD naming a ref outside ``refs/heads``, an
    unreadable or unusual layout), and then git is asked (`_git_branch_sync`).

    Read on every gateway request of a run with no recorded place (a token used before its run's first
    session), where `git symbolic-ref` cost a process start (~4 ms) and a thread hop each time; the file
    is read each time too, so a checkout of another branch is seen at the next request, as before."""
    try:
        dot_git = Path(toplevel) / ".git"
        if dot_git.is_file():
            pointer = dot_git.read_text(encoding="utf-8").strip()
            if not pointer.startswith("gitdir:"):
                return False
            git_dir = Path(toplevel) / pointer.removeprefix("gitdir:").strip()
        else:
            git_dir = dot_git
        head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return False
    if head.startswith(_BRANCH_REF):
        branch = head.removeprefix(_BRANCH_REF)
        return branch or False
    if len(head) in (40, 64) and all(c in "0123456789abcdef" for c in head):
        return None  # detached: `symbolic-ref -q` has no branch either
    return False


_UNREAD: Any = object()


async def resolve_view(store: Store, config: Config, *, harness: str, run_id: str | None,
                       workdir: str | None = None, place: tuple[str, str | None] | None = _UNREAD) -> View:
    """A harness run's view (REQ-9): the repository its run works in now, as the graph records it
    (live presence, else the ingested run), else its workdir's (the token's, else the configured one)
    before the run's first session. A run outside any repository sees no episodes.

    ``place`` is :func:`run_place`'s answer when the caller already read it (in its own hop)."""
    found = await store.read(lambda db: run_place(db, harness, run_id)) if place is _UNREAD else place
    if found is not None:
        return View("run", harness, run_id, found[0], found[1])
    cfg = config.harness.get(harness)
    directory = workdir or (cfg.workdir if cfg else None)
    if not directory:
        return View("run", harness, run_id)
    directory = str(Path(directory).expanduser())  # noqa: ASYNC240 -- reads $HOME, no I/O
    info = await resolve_repo(directory)
    if info is None:
        return View("run", harness, run_id)
    read = head_branch(info.toplevel)
    branch = await trio.to_thread.run_sync(_git_branch_sync, directory) if read is False else read
    if branch is None:
        branch = await store.read(lambda db: latest_branch(db, harness, info.key))
    return View("run", harness, run_id, info.key, branch)
