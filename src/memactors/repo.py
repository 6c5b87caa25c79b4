"""Repository keys: which repository a session worked in, as the string episode scopes are built from.

The repository key (docs/contracts.md, `sessions[].repo`): a session's explicit ``repo`` if given,
else resolved from its ``cwd`` with git — the remote ``origin`` (else the first remote) normalised to
``host/owner/name``, or ``local<absolute toplevel>`` for a repository without a usable remote. A cwd
outside any repository has no key. Scopes are ``project:<repo key>``.

git runs in a worker thread (``trio.to_thread.run_sync``), never on the trio loop; the caller owns the
deadline with a cancel scope. Positive results are cached per cwd in a small LRU because one run has
many sessions in the same few directories.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
import subprocess
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio
from loguru import logger

from .errors import InvalidArgument, MemactorsError

__all__ = [
    "GitUnavailable",
    "RepoInfo",
    "RepoResolver",
    "clear_cache",
    "explicit_key",
    "match_repo",
    "normalise_remote",
    "relative_path",
    "repo_key",
    "resolve_repo",
    "scope_for",
]

_log = logger.bind(component="repo")

# Schemes whose URLs name a network host we can key on. git://, file:// and anything else: no key.
_NETWORK_SCHEMES = frozenset({"http", "https", "ssh", "git+ssh", "ssh+git"})
# scp-like syntax: [user@]host:path, where the host has no slash and the path does not start with //.
_SCP_LIKE = re.compile(r"^(?:[^@/\s]+@)?(?P<host>[^@/:\s]+):(?!//)(?P<path>.+)$")
# Environment that would point git at another repository than the one under cwd (set inside hooks).
_GIT_LOCATION_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX", "GIT_COMMON_DIR")


class GitUnavailable(MemactorsError):
    """Raised when the git executable cannot be run, so no repository key can be resolved."""

    code = "FAILED_PRECONDITION"


@attrs.frozen
class RepoInfo:
    """A resolved repository: its key (``host/owner/name`` or ``local/abs/path``) and its toplevel."""

    key: str
    toplevel: str

    @property
    def scope(self) -> str:
        """The episode scope of this repository, ``project:<key>``."""
        return scope_for(self.key)


def _clean_path(path: str) -> str | None:
    segments = [s for s in path.strip().split("/") if s and s != "."]
    if not segments or any(s == ".." for s in segments):
        return None
    last = segments[-1]
    if last.endswith(".git"):
        last = last[: -len(".git")]
        if not last:
            return None
        segments[-1] = last
    return "/".join(segments)


def normalise_remote(url: str) -> str | None:
    """Turn a git remote URL into ``host/owner/name``; None for git://, file://, local paths and junk.

    The host is lower-cased; scheme, user (and any password), port, a ``.git`` suffix and trailing
    slashes are dropped; the path keeps its case. ``git@forge.example:acme/api.git`` and
    ``https://user:tok@Forge.Example:8443/acme/api.git`` both give ``forge.example/acme/api``.
    """
    url = url.strip()
    if not url:
        return None
    if "://" in url:
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            return None
        if parts.scheme.lower() not in _NETWORK_SCHEMES or not host:
            return None
        path = parts.path
    else:
        match = _SCP_LIKE.match(url)
        # A single letter before the colon is a Windows drive (C:\src\api), not a host.
        if match is None or len(match.group("host")) == 1:
            return None
        host = match.group("host").lower()
        path = match.group("path")
    cleaned = _clean_path(path)
    if cleaned is None:
        return None
    return f"{host.lower()}/{cleaned}"


def explicit_key(repo: str) -> str:
    """The key for a session's explicit ``repo`` value: normalised when it is a remote URL, else as given.

    Raises InvalidArgument for an empty value.
    """
    value = repo.strip()
    if not value:
        raise InvalidArgument("session repo is empty", field="repo")
    return normalise_remote(value) or value.rstrip("/")


def repo_key(given: str) -> str:
    """What a user typed for `--repo`, as the key it names when that key is known (see `match_repo`)."""
    return normalise_remote(given) or given.strip().rstrip("/").removesuffix(".git")


def match_repo(given: str, known: Sequence[str]) -> dict[str, Any]:
    """What a user typed for `--repo`, read as a repository key.

    A remote URL (``https://forge.example/acme/api``, ``….git``, ``git@forge.example:acme/api.git``)
    becomes its key (`normalise_remote`, the one runs are recorded with); a key that is known is used
    as is; ``acme/api`` matches the one known key ending in ``/acme/api``. Otherwise the status is
    ``unknown`` and ``close`` lists known keys that look alike, so the CLI can say so instead of
    answering an empty list.
    """
    key = repo_key(given)
    if key in known:
        return {"given": given, "key": key, "status": "known"}
    tails = [k for k in known if k.endswith("/" + key.lstrip("/"))]
    if len(tails) == 1:
        return {"given": given, "key": tails[0], "status": "suffix"}
    close = list(dict.fromkeys([*tails, *difflib.get_close_matches(key, known, n=5, cutoff=0.6)]))
    if not close:  # compare owner/name tails too: a typo in the name of a long key
        by_tail = {k.split("/", 1)[-1]: k for k in known if "/" in k}
        close = [by_tail[t] for t in difflib.get_close_matches(key.split("/", 1)[-1], list(by_tail), n=5, cutoff=0.6)]
    return {"given": given, "key": key, "status": "unknown", "close": close[:5]}


def scope_for(repo_key: str) -> str:
    """The episode scope of a repository key: ``project:<repo key>``; InvalidArgument if the key is empty."""
    if not repo_key or not repo_key.strip():
        raise InvalidArgument("repository key is empty", field="repo")
    return f"project:{repo_key}"


def relative_path(path: str, toplevel: str, cwd: str) -> str | None:
    """Map ``path`` (absolute, or relative to ``cwd``) to a normalised POSIX path inside ``toplevel``.

    Returns None when the path lies outside the repository (including ``../`` escapes) or is empty;
    the repository root itself is ``"."``. Purely lexical, no file system access: give ``toplevel`` and
    ``cwd`` in the same form (git reports toplevel with symlinks resolved).
    """
    if not path:
        return None
    absolute = path if posixpath.isabs(path) else posixpath.join(cwd, path)
    absolute = posixpath.normpath(absolute)
    top = posixpath.normpath(toplevel)
    if not posixpath.isabs(absolute) or not posixpath.isabs(top):
        return None
    if absolute == top:
        return "."
    prefix = top if top.endswith("/") else top + "/"
    if not absolute.startswith(prefix):
        return None
    return absolute[len(prefix) :]


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    return env


def _git(args: list[str], env: dict[str, str]) -> str | None:
    """Run git and return stripped stdout, or None when git exits non-zero."""
    try:
        done = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError as exc:
        raise GitUnavailable("git executable not found") from exc
    except OSError as exc:
        raise GitUnavailable(f"cannot run git: {exc.strerror}") from exc
    if done.returncode != 0:
        return None
    return done.stdout.strip()


def _resolve_sync(cwd: str) -> RepoInfo | None:
    """Blocking resolution; runs in a worker thread."""
    if not os.path.isdir(cwd):
        return None
    env = _git_env()
    toplevel = _git(["-C", cwd, "rev-parse", "--show-toplevel"], env)
    if not toplevel:
        return None
    names = (_git(["-C", toplevel, "remote"], env) or "").split()
    if names:
        name = "origin" if "origin" in names else names[0]
        url = _git(["-C", toplevel, "remote", "get-url", name], env)
        key = normalise_remote(url) if url else None
        if key is not None:
            return RepoInfo(key=key, toplevel=toplevel)
    return RepoInfo(key=f"local{toplevel}", toplevel=toplevel)


class RepoResolver:
    """Resolves cwds to repositories with git, caching positive results in a bounded LRU.

    Only found repositories are cached: a missing directory or a not-yet-initialised repository may
    appear later in a long-running daemon. Use one resolver per daemon (the module keeps a default).
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise InvalidArgument("max_entries must be at least 1", field="max_entries")
        self._max_entries = max_entries
        self._cache: OrderedDict[str, RepoInfo] = OrderedDict()

    async def resolve(self, cwd: str) -> RepoInfo | None:
        """The repository containing ``cwd``, or None when cwd is missing or outside any repository.

        Raises GitUnavailable when git cannot be run. Cancellable: the caller's deadline abandons
        the worker thread (its git child finishes on its own).
        """
        if not cwd or not os.path.isabs(cwd):
            return None
        cached = self._cache.get(cwd)
        if cached is not None:
            self._cache.move_to_end(cwd)
            return cached
        info = await trio.to_thread.run_sync(_resolve_sync, cwd, abandon_on_cancel=True)
        _log.debug("repository resolved", outcome="found" if info else "none", cached=len(self._cache))
        if info is not None:
            self._cache[cwd] = info
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return info

    async def resolve_many(self, cwds: Sequence[str]) -> dict[str, RepoInfo | None | GitUnavailable]:
        """`resolve` for many cwds: cached ones at once, the others together in one worker thread (a
        batch of run records costs one thread hop, not one per session). A cwd git cannot be run for
        maps to its GitUnavailable instead of raising."""
        out: dict[str, RepoInfo | None | GitUnavailable] = {}
        todo: list[str] = []
        for cwd in dict.fromkeys(cwds):
            if not cwd or not os.path.isabs(cwd):
                out[cwd] = None
            elif (cached := self._cache.get(cwd)) is not None:
                self._cache.move_to_end(cwd)
                out[cwd] = cached
            else:
                todo.append(cwd)
        if todo:
            def run() -> list[RepoInfo | None | GitUnavailable]:
                found: list[RepoInfo | None | GitUnavailable] = []
                for cwd in todo:
                    try:
                        found.append(_resolve_sync(cwd))
                    except GitUnavailable as exc:
                        found.append(exc)
                return found

            for cwd, info in zip(todo, await trio.to_thread.run_sync(run, abandon_on_cancel=True), strict=True):
                out[cwd] = info
                if isinstance(info, RepoInfo):
                    self._cache[cwd] = info
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
            _log.debug("repositories resolved", cwds=len(todo), cached=len(self._cache))
        return out

    def clear(self) -> None:
        """Forget every cached resolution."""
        self._cache.clear()


_default_resolver = RepoResolver()


async def resolve_repo(cwd: str) -> RepoInfo | None:
    """Resolve ``cwd`` with the shared resolver (see :meth:`RepoResolver.resolve`)."""
    return await _default_resolver.resolve(cwd)


async def resolve_repos(cwds: Sequence[str]) -> dict[str, RepoInfo | None | GitUnavailable]:
    """Resolve many cwds with the shared resolver (see :meth:`RepoResolver.resolve_many`)."""
    return await _default_resolver.resolve_many(cwds)


def clear_cache() -> None:
    """Forget the shared resolver's cached resolutions (tests, or after a remote changed)."""
    _default_resolver.clear()
