"""Episode assembly (SPEC-0030 REQ-5, REQ-6, REQ-8): a closed run record in, a redacted episode out.

Pure code, no model. Everything that can leak — the prompt, event payloads, tool arguments, transcript —
is never read; every string that is kept passes the shared redactor first. The only I/O is resolving
repository keys with git, which `resolve_sessions` does off the trio loop before `assemble` runs.

The daemon keeps the run record as `stored_record` makes it (prompt dropped, every string redacted) and
assembles from exactly that, so assembling the stored record again — after a restart, say — gives the
same bytes.

Redact once, before any cut: `stored_record` is the boundary. It redacts every string
of the record once and remembers the result (by identity); `assemble` reuses those strings instead of
redacting them again, and only a string it has to cut is checked once more, because a cut can in
principle make a new match at its edge. A full string is always redacted before it is cut, so an
excerpt never carries the head of a secret whose tail the cut removed.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from ._wire import converter
from .models import Episode, Event, RunRecord, Session, TrustClass, VerifyFailure
from .redact import REDACTED, redact, redact_many
from .repo import (
    GitUnavailable,
    RepoInfo,
    explicit_key,
    relative_path,
    resolve_repo,
    resolve_repos,
    scope_for,
)

MAX_FIELD_BYTES = 256
MAX_FILES = 50
MAX_VERIFY_CLASSES = 10
MAX_SUMMARY_CHARS = 280
#: Paths kept per run for the run graph's run → paths edges (docs/contracts.md "Run graph"); episodes keep
#: MAX_FILES of them.
MAX_GRAPH_PATHS = 1000

FIELD_ORDER = tuple(a.name for a in attrs.fields(Episode))

# Python strings from JSON may hold lone surrogates ("\ud800"); they cannot be stored as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean(text: str) -> str:
    """`text` made safe to keep and send: lone surrogates replaced, control characters stripped, secrets redacted."""
    return redact(_SURROGATE.sub("\ufffd", text))


def _fit(text: str, cut: Callable[[str], str]) -> str:
    """Clean, then cut to a bound, until stable: a cut can in principle expose a new match, never a secret."""
    out = cut(clean(text))
    for _ in range(4):
        again = cut(clean(out))
        if again == out:
            return out
        out = again
    return cut(REDACTED)


def cut_utf8(text: str, limit: int = MAX_FIELD_BYTES) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits in `limit` bytes, never splitting a character."""
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


# The control-character rule (REQ-6, docs/contracts.md "Control characters"): the redactor
# strips every C0/C1 control but TAB and LF. In an episode, every line break and tab (TAB, LF, CR,
# U+2028, U+2029), with the spaces around it, becomes one space, in every field: words on either side
# of a break never fuse (the rendering once escaped LF as the two characters `\n`, and FTS5 indexed a
# word starting a line as `n<word>`), nothing in a value needs escaping, and the rendering stays one
# field per line.
_BREAKS = re.compile("[ ]*[\t\n\r\u2028\u2029][\t\n\r\u2028\u2029 ]*")


def flatten(text: str) -> str:
    """`text` on one line: each run of line breaks and tabs (and the spaces around it) one space (REQ-6)."""
    return _BREAKS.sub(" ", text) if _BREAKS.search(text) else text


# What an escape sequence left in a stored string in older stores, when the redactor removed its ESC
# alone (`\x1b[31mred` was stored `[31mred`): SGR (colours and styles, `[0m`, `[1;32m`, `[38;5;208m`),
# a bare `[m` or `[K` not followed by a letter, erase in line or display (`[2K`, `[0J`) and cursor
# visibility (`[?25l`). Only these forms, and never where a `]` closes the bracket soon after
# (`[1ms]`, `[mypy]`): a bracket in prose or code is kept. Migration `0012_words_stay_words` (SQLite)
# and `0005_words_stay_words` (PostgreSQL) remove them from the stored bodies and documents.
_SGR = r"(?:0|1|2|3|4|5|7|8|9|2[1-9]|3[0-79]|4[0-79]|9[0-7]|10[0-7]|[34]8;5;\d{1,3}|[34]8;2;\d{1,3};\d{1,3};\d{1,3})"
_REMNANTS = re.compile(
    rf"( ?)(?:\[{_SGR}(?:;{_SGR})*m(?![\w.]*\])|\[[mK](?![\w\]])|\[[012][KJ](?![\w.]*\])"
    rf"|\[\?\d{{1,4}}[hl](?![\w.]*\]))+( ?)")


def drop_escape_remnants(text: str) -> str:
    """`text` without what escape sequences left when only their ESC was removed (see `_REMNANTS`);
    where a removal leaves two spaces side by side, one stays."""
    if "[" not in text:
        return text
    out = _REMNANTS.sub(lambda m: " " if m.group(1) and m.group(2) else m.group(1) + m.group(2), text)
    return out.strip() if out != text and text == text.strip() else out


def one_line(text: str) -> str:
    """A single-line field (ids, names, repository, branch, paths, error classes): `flatten`ed."""
    return flatten(text)


def _flat_excerpt(text: str | None, limit: int) -> str:
    """The result excerpt: the first `limit` characters of the stored (already clean) result text,
    flattened. Flattening can in principle join what the redactor saw apart, so a flattened excerpt is
    cleaned again, once, after its cut (the full text was redacted before any cut, at the boundary).
    Only a prefix of a long text is flattened: enough of it to fill `limit` characters."""
    text = text or ""
    limit = max(limit, 0)
    cut = _prefix(limit)
    if not _BREAKS.search(text, 0, limit + 64):
        head = text[:limit + 64]  # no break where the excerpt is cut from: nothing to flatten
        if head == text or len(head) > limit:
            return _cut_clean(text, cut)
    size = limit + 64
    while True:  # flatten(text[:size])[:limit] == flatten(text)[:limit] once it is longer than `limit`
        flat = flatten(text[:size]).lstrip()
        if len(flat) > limit or size >= len(text):
            break
        size *= 4
    return flatten(_fit(cut(flat), cut)).rstrip()


def _prefix(limit: int) -> Callable[[str], str]:
    return lambda s: s[:limit]


def _bounded(text: str | None) -> str:
    return one_line(_fit(text or "", cut_utf8))


def _cut_clean(text: str | None, cut: Callable[[str], str] = cut_utf8) -> str:
    """Bound an already-clean string: untouched when it fits, else cut and the cut edge re-checked."""
    text = text or ""
    out = cut(text)
    return out if out == text else _fit(out, cut)


def episode_id_for(harness: str, run_id: str, started_at: str) -> str:
    """`ep_` + 20 hex digits of SHA-256 over harness, run id and started_at as stored (NUL-separated)."""
    digest = hashlib.sha256(f"{harness}\0{run_id}\0{started_at}".encode(errors="surrogatepass")).hexdigest()
    return "ep_" + digest[:20]


def clean_many(texts: list[str]) -> list[str]:
    """`clean` of each string, with one keyword pass of the redactor for them all (`redact_many`)."""
    return redact_many([_SURROGATE.sub("\ufffd", t) for t in texts])


def _clean_tree(value: Any) -> Any:
    """Every string in a nested value `clean`ed: collected first, cleaned together (`clean_many`), put back."""
    found: list[str] = []

    def collect(v: Any) -> None:
        match v:
            case str():
                found.append(v)
            case dict():
                for x in v.values():
                    collect(x)
            case list() | tuple():
                for x in v:
                    collect(x)

    collect(value)
    cleaned = iter(clean_many(found))

    def rebuild(v: Any) -> Any:
        match v:
            case str():
                return next(cleaned)
            case dict():
                return {k: rebuild(x) for k, x in v.items()}
            case list() | tuple():
                return [rebuild(x) for x in v]
            case _:
                return v

    return rebuild(value)


# Records `stored_record` produced, by identity: their strings are clean and are not redacted again.
_STORED: weakref.WeakValueDictionary[int, RunRecord] = weakref.WeakValueDictionary()


def is_stored(record: RunRecord) -> bool:
    """Whether `record` is `stored_record`'s own output (so every string in it is already clean)."""
    return _STORED.get(id(record)) is record


def stored_record(record: RunRecord) -> RunRecord:
    """The run record as the daemon keeps it: no prompt, every string cleaned (REQ-6). Idempotent.

    Each string is redacted here once; a record this function returned comes back as it is.
    """
    if is_stored(record):
        return record
    raw = converter.unstructure(attrs.evolve(record, prompt=None))
    stored = converter.structure(_clean_tree(raw), RunRecord)
    _STORED[id(stored)] = stored
    return stored


# -- repositories (repo.py; docs/contracts.md, `sessions[].repo`) --------------------------------------------------

@attrs.frozen
class SessionRepo:
    """Where a session ran: its repository key (None outside any repository) and the roots of its tree.

    `roots` are the working-tree root as git reports it (symlinks resolved) and, when the session's cwd
    reaches it through a symlink, the same root spelled the cwd's way. Empty when the session named its
    repository explicitly and its cwd is no checkout here: then the cwd is taken as the root.
    """

    key: str | None
    cwd: str
    roots: tuple[str, ...] = ()


def _roots_sync(cwd: str, toplevel: str) -> tuple[str, ...]:
    """The toplevel, plus its spelling through the symlinks in `cwd` when that differs (blocking)."""
    roots = [toplevel]
    inside = relative_path(os.path.realpath(cwd), toplevel, "/")
    if inside is not None:
        depth = 0 if inside == "." else len(inside.split("/"))
        alias = posixpath.normpath(cwd)
        for _ in range(depth):
            alias = posixpath.dirname(alias)
        if alias != toplevel:
            roots.append(alias)
    return tuple(roots)


async def resolve_session(session: Session) -> SessionRepo:
    """One session's repository: its explicit `repo` when given, else git on its cwd (off the loop).

    With an explicit `repo`, a cwd that is a real checkout still supplies the root for relative paths,
    and a missing git is tolerated; without one, GitUnavailable propagates (no silent "no repository").
    """
    explicit = (session.repo or "").strip()
    info: RepoInfo | None
    try:
        info = await resolve_repo(session.cwd)
    except GitUnavailable:
        if not explicit:
            raise
        info = None
    key = explicit_key(explicit) if explicit else (info.key if info else None)
    roots: tuple[str, ...] = ()
    if info is not None:
        roots = await trio.to_thread.run_sync(_roots_sync, session.cwd, info.toplevel)
    return SessionRepo(key=key, cwd=session.cwd, roots=roots)


async def resolve_sessions(record: RunRecord) -> Mapping[str, SessionRepo]:
    """Resolve every session's repository (the first session wins when two share an id)."""
    out: dict[str, SessionRepo] = {}
    for session in record.sessions:
        if session.session_id not in out:
            out[session.session_id] = await resolve_session(session)
    return out


async def resolve_sessions_many(records: Iterable[RunRecord]) -> list[Mapping[str, SessionRepo] | GitUnavailable]:
    """`resolve_sessions` for many records at once: git for every distinct cwd in one worker thread and
    every session's roots in one more (a batch of records costs two thread hops, not two per session).
    Same answers as `resolve_sessions`, record by record; a record that needs git when git cannot be
    run gets its GitUnavailable instead of a mapping."""
    records = list(records)
    infos = await resolve_repos([s.cwd for r in records for s in r.sessions])
    wanted = {(s.cwd, info.toplevel) for r in records for s in r.sessions
              if isinstance(info := infos.get(s.cwd), RepoInfo)}
    roots: dict[tuple[str, str], tuple[str, ...]] = {}
    if wanted:
        roots = await trio.to_thread.run_sync(lambda: {pair: _roots_sync(*pair) for pair in wanted})
    out: list[Mapping[str, SessionRepo] | GitUnavailable] = []
    for record in records:
        repos: dict[str, SessionRepo] = {}
        failed: GitUnavailable | None = None
        for session in record.sessions:
            if session.session_id in repos:
                continue
            explicit = (session.repo or "").strip()
            info = infos.get(session.cwd)
            if isinstance(info, GitUnavailable):
                if not explicit:
                    failed = info
                    break
                info = None
            key = explicit_key(explicit) if explicit else (info.key if info else None)
            repos[session.session_id] = SessionRepo(
                key=key, cwd=session.cwd, roots=roots[(session.cwd, info.toplevel)] if info else ())
        out.append(failed if failed is not None else repos)
    return out


def primary_repo(record: RunRecord, repos: Mapping[str, SessionRepo]) -> tuple[Session, SessionRepo] | None:
    """The primary session (first not a subagent's) and its repository, or None when it has none."""
    primary = record.primary_session
    if primary is None:
        return None
    where = repos.get(primary.session_id)
    if where is None or where.key is None:
        return None
    return primary, where


def skip_reason(
    record: RunRecord, repos: Mapping[str, SessionRepo], *, memory_record: bool = True, record_trace: bool = True
) -> str | None:
    """REQ-8: why no episode is recorded for this run, or None when it is eligible.

    `record_trace_off` means the harness keeps no trace at all, so the caller stores nothing of the run;
    every other reason still keeps the run for the graph. A run whose primary session has no repository
    is skipped even when a subagent's has one, because the episode's scope is the primary's repository.
    """
    if not record_trace:
        return "record_trace_off"
    if not memory_record:
        return "memory_record_off"
    if not record.spawned_process:
        return "no_process"
    if primary_repo(record, repos) is None:
        return "no_repository"
    return None


_NO_ROOT = "/\0cwd"  # stands for an unknown, relative cwd: only relative, non-escaping paths fit under it


def repo_relative(path: str, where: SessionRepo) -> str | None:
    """`path` (absolute, or relative to the session's cwd) relative to its repository; None outside it."""
    if where.roots:
        candidates = [relative_path(path, root, where.cwd) for root in where.roots]
    elif posixpath.isabs(where.cwd):
        candidates = [relative_path(path, where.cwd, where.cwd)]
    else:
        candidates = [None if posixpath.isabs(path) else relative_path(path, _NO_ROOT, _NO_ROOT)]
    return next((c for c in candidates if c is not None and c != "."), None)


def _in_repo_events(record: RunRecord, repos: Mapping[str, SessionRepo], key: str) -> Iterable[Event]:
    in_repo = {sid for sid, r in repos.items() if r.key == key}
    return (e for e in record.events if e.session_id in in_repo)


def repo_files(record: RunRecord, repos: Mapping[str, SessionRepo]) -> tuple[str, ...]:
    """Sorted repository-relative paths edited by sessions in the primary session's repository."""
    found = primary_repo(record, repos)
    if found is None:
        return ()
    files: set[str] = set()
    for event in _in_repo_events(record, repos, found[1].key or ""):
        if event.kind == "edit" and event.path:
            rel = repo_relative(event.path, repos[event.session_id])
            if rel is not None:
                # A path of the stored record is clean, and `rel` is that path with a root removed at a
                # '/' boundary: only a cut needs another look.
                files.add(one_line(_cut_clean(rel)) if is_stored(record) else _bounded(rel))
    return tuple(sorted(files))


def _verify_failures(record: RunRecord, repos: Mapping[str, SessionRepo], key: str) -> tuple[VerifyFailure, ...]:
    failures: Counter[str] = Counter()
    for event in _in_repo_events(record, repos, key):
        if event.kind == "verify" and event.ok is False:
            failures[one_line(_cut_clean(event.error_class or "unknown"))] += 1
    ranked = sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_VERIFY_CLASSES]
    return tuple(VerifyFailure(cls, n) for cls, n in ranked)


# -- assembly -----------------------------------------------------------------------------------------

def trust_class_for(record: RunRecord, *, untrusted_inline: bool) -> TrustClass:
    """REQ-6: untrusted_input for a webhook or channel trigger or an untrusted_inline harness."""
    untrusted = record.trigger.source in ("webhook", "channel") or untrusted_inline
    return "untrusted_input" if untrusted else "standard"


def assemble(
    record: RunRecord,
    repos: Mapping[str, SessionRepo],
    *,
    excerpt_chars: int,
    untrusted_inline: bool = False,
    pull_request: str | None = None,
    summary: str | None = None,
) -> Episode:
    """Build REQ-5's episode from a stored run record. Call `skip_reason` first; raises ValueError when ineligible.

    Every string is cleaned and bounded here, whatever the caller passed; a summary longer than 280
    characters after cleaning is dropped, never cut. The record's own strings are redacted once (by
    `stored_record`, a no-op for a record that already is one) and only re-checked where they are cut;
    the repository key, pull request and summary come from elsewhere and are cleaned here.
    """
    record = stored_record(record)
    found = primary_repo(record, repos)
    if found is None:
        raise ValueError("run has no primary session in a repository")
    primary, where = found
    repo_key = where.key or ""
    excerpt = _flat_excerpt(record.result_text, excerpt_chars)
    if summary is not None:
        summary = clean(flatten(summary)).strip()
        if not summary.strip() or len(summary) > MAX_SUMMARY_CHARS:
            summary = None
    return Episode(
        episode_id=episode_id_for(record.harness, record.run_id, record.started_at),
        harness=one_line(_cut_clean(record.harness)),
        adapter=one_line(_cut_clean(record.adapter)),
        run_id=one_line(_cut_clean(record.run_id)),
        trace_id=one_line(_cut_clean(record.trace_id)),
        model=one_line(_cut_clean(record.model.effective)),
        repo=_bounded(repo_key),
        branch=one_line(_cut_clean(primary.git_branch)),
        outcome=record.outcome,
        reason=record.reason,
        started_at=one_line(_cut_clean(record.started_at)),
        duration_ms=record.duration_ms,
        cost_usd=record.cost_usd,
        cost_source=record.cost_source,
        files_touched=repo_files(record, repos)[:MAX_FILES],
        pull_request=_bounded(pull_request) if pull_request else None,
        verify_failures=_verify_failures(record, repos, repo_key),
        result_excerpt=excerpt,
        summary=summary,
        trust_class=trust_class_for(record, untrusted_inline=untrusted_inline),
        scope=scope_for(repo_key),
    )


#: The longest result excerpt an episode may carry (the contract schema's bound; `[memory.episodes]
#: excerpt_chars` is at most this).
MAX_EXCERPT_CHARS = 2000


def reclean_episode(episode: Episode, *, repo: str) -> Episode:
    """An episode from outside this daemon (a `store import` file) made as `assemble` makes one: every
    string cleaned (REQ-6, one keyword pass for them all) and bounded again, lines flattened, `repo` (an
    already checked repository key) its repository and the scope derived from it, never taken from the
    file. Idempotent on an episode this daemon assembled."""
    summary = episode.summary
    if summary is not None:
        summary = clean(flatten(summary)).strip()
        if not summary or len(summary) > MAX_SUMMARY_CHARS:
            summary = None
    lines = ("harness", "adapter", "run_id", "trace_id", "model", "branch", "started_at")
    files = episode.files_touched[:MAX_FILES]
    failures = episode.verify_failures[:MAX_VERIFY_CLASSES]
    texts = clean_many([*(getattr(episode, name) for name in lines), repo, episode.pull_request or "",
                        episode.result_excerpt, *files, *(v.error_class for v in failures)])
    one = {name: one_line(_cut_clean(text)) for name, text in zip(lines, texts, strict=False)}
    rest = iter(texts[len(lines):])
    repo_clean, pull_request, excerpt = next(rest), next(rest), next(rest)
    return attrs.evolve(
        episode, harness=one["harness"], adapter=one["adapter"], run_id=one["run_id"],
        trace_id=one["trace_id"], model=one["model"], branch=one["branch"], started_at=one["started_at"],
        repo=one_line(_cut_clean(repo_clean)),
        pull_request=one_line(_cut_clean(pull_request)) if episode.pull_request else None,
        result_excerpt=_flat_excerpt(excerpt, MAX_EXCERPT_CHARS),
        files_touched=tuple(one_line(_cut_clean(next(rest))) for _ in files),
        verify_failures=tuple(attrs.evolve(v, error_class=one_line(_cut_clean(next(rest)))) for v in failures),
        summary=summary,
        scope=scope_for(one_line(_cut_clean(repo_clean))),
    )


# -- text rendering -----------------------------------------------------------------------------------

def _line_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ", ".join(
            f"{flatten(v.error_class)}: {v.count}" if isinstance(v, VerifyFailure) else flatten(str(v)) for v in value
        )
    if isinstance(value, float):
        return repr(value)
    return flatten(str(value))


def render_text(episode: Episode) -> str:
    """REQ-5's plain-text rendering: every field in REQ-5's order, one `name: value` line each.

    An episode's strings hold no line break (`flatten`, REQ-6); a value is flattened here once more,
    so a body stored before that rule (migration 0009 rewrites those) still renders one field per line.
    Nothing is escaped: the words of the rendering are the episode's words. Each line passes the
    redactor once more. Identical episodes give byte-identical text.
    """
    lines = clean_many([f"{name}: {_line_value(getattr(episode, name))}" for name in FIELD_ORDER])
    return "".join(line + "\n" for line in lines)
