"""Episode assembly (SPEC-0030 REQ-5, REQ-6, REQ-8): a closed run record in, a redacted episode out.

Pure code, no model. Everything that can leak — the prompt, event payloads, tool arguments, transcript —
is never read; every string that is kept passes the shared redactor first. The only I/O is resolving
repository keys with git, which `resolve_sessions` does off the trio loop before `assemble` runs.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections import Counter
from collections.abc import Mapping

import attrs

from .models import Episode, RunRecord, Session, VerifyFailure
from .redact import redact
from .repo import relative_path, resolve_repo, scope_for

MAX_FIELD_BYTES = 256
MAX_FILES = 50
MAX_VERIFY_CLASSES = 10
MAX_SUMMARY_CHARS = 280

FIELD_ORDER = tuple(a.name for a in attrs.fields(Episode))


def episode_id_for(harness: str, run_id: str, started_at: str) -> str:
    """`ep_` + 20 hex digits of SHA-256 over harness, run id and started_at as stored (NUL-separated)."""
    digest = hashlib.sha256(f"{harness}\0{run_id}\0{started_at}".encode()).hexdigest()
    return "ep_" + digest[:20]


def cut_utf8(text: str, limit: int = MAX_FIELD_BYTES) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits in `limit` bytes, never splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def _bounded(text: str | None) -> str:
    return cut_utf8(redact(text or ""))


@attrs.frozen
class SessionRepo:
    """Where a session ran: its repository key (None outside any repository) and working tree root."""

    key: str | None
    toplevel: str | None
    cwd: str


async def resolve_sessions(record: RunRecord) -> Mapping[str, SessionRepo]:
    """Resolve every session's repository: its `repo` when given, else git on its cwd (off the loop)."""
    out: dict[str, SessionRepo] = {}
    for session in record.sessions:
        info = await resolve_repo(session.cwd)
        key = session.repo or (info.key if info else None)
        out[session.session_id] = SessionRepo(key=key, toplevel=info.toplevel if info else None, cwd=session.cwd)
    return out


def primary_repo(record: RunRecord, repos: Mapping[str, SessionRepo]) -> tuple[Session, SessionRepo] | None:
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
    """REQ-8: why no episode is recorded for this run, or None when it is eligible."""
    if not record_trace:
        return "record_trace_off"
    if not memory_record:
        return "memory_record_off"
    if not record.spawned_process:
        return "no_process"
    if not any(r.key for r in repos.values()) or primary_repo(record, repos) is None:
        return "no_repository"
    return None


def _repo_relative(path: str, where: SessionRepo) -> str | None:
    if where.toplevel is not None:
        return relative_path(path, where.toplevel, where.cwd)
    # The session named its repo explicitly and its cwd is not a checkout here: take cwd as the root.
    joined = path if posixpath.isabs(path) else posixpath.join(where.cwd, path)
    rel = posixpath.relpath(posixpath.normpath(joined), posixpath.normpath(where.cwd))
    return None if rel == "." or rel.startswith("../") or rel == ".." else rel


def assemble(
    record: RunRecord,
    repos: Mapping[str, SessionRepo],
    *,
    excerpt_chars: int,
    untrusted_inline: bool = False,
    pull_request: str | None = None,
    summary: str | None = None,
) -> Episode:
    """Build REQ-5's episode from a stored run record. Call `skip_reason` first; raises ValueError when ineligible."""
    found = primary_repo(record, repos)
    if found is None:
        raise ValueError("run has no primary session in a repository")
    primary, where = found
    repo_key = where.key
    assert repo_key is not None
    in_repo = {sid for sid, r in repos.items() if r.key == repo_key}

    files: set[str] = set()
    failures: Counter[str] = Counter()
    for event in record.events:
        if event.session_id not in in_repo:
            continue
        if event.kind == "edit" and event.path:
            rel = _repo_relative(event.path, repos[event.session_id])
            if rel is not None:
                files.add(_bounded(rel))
        elif event.kind == "verify" and event.ok is False:
            failures[_bounded(event.error_class or "unknown")] += 1
    verify = tuple(
        VerifyFailure(cls, n) for cls, n in sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_VERIFY_CLASSES]
    )
    excerpt = redact(record.result_text or "")[:excerpt_chars]
    if summary is not None:
        summary = redact(summary)
        if len(summary) > MAX_SUMMARY_CHARS:
            summary = None
    untrusted = record.trigger.source in ("webhook", "channel") or untrusted_inline
    return Episode(
        episode_id=episode_id_for(record.harness, record.run_id, record.started_at),
        harness=_bounded(record.harness),
        adapter=_bounded(record.adapter),
        run_id=_bounded(record.run_id),
        trace_id=_bounded(record.trace_id),
        model=_bounded(record.model.effective),
        repo=_bounded(repo_key),
        branch=_bounded(primary.git_branch),
        outcome=record.outcome,
        reason=record.reason,
        started_at=_bounded(record.started_at),
        duration_ms=record.duration_ms,
        cost_usd=record.cost_usd,
        cost_source=record.cost_source,
        files_touched=tuple(sorted(files)[:MAX_FILES]),
        pull_request=_bounded(pull_request) if pull_request else None,
        verify_failures=verify,
        result_excerpt=excerpt,
        summary=summary,
        trust_class="untrusted_input" if untrusted else "standard",
        scope=scope_for(repo_key),
    )


def _line_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ", ".join(
            f"{v.error_class}: {v.count}" if isinstance(v, VerifyFailure) else str(v) for v in value
        )
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


def render_text(episode: Episode) -> str:
    """REQ-5's plain-text rendering: every field in REQ-5's order, one `name: value` line each.

    Multi-line values are escaped onto their line, so identical records give byte-identical text.
    """
    return "".join(f"{name}: {_line_value(getattr(episode, name))}\n" for name in FIELD_ORDER)
