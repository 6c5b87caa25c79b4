"""The assembler actor: a closed run record in, a redacted episode (or a skip reason) out (REQ-5, 6, 8).

Pure code, no model, off the supervision path: it resolves repositories with git off the trio loop,
looks up the pull request linked to the branch, and asks the summary actor for a summary within its
10 s deadline. It writes nothing; the index actor stores what it returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .._kernel import open_mailbox, serve
from ..config import Config
from ..episode import assemble, render_text, resolve_sessions, skip_reason
from ..modelapi import SUMMARY_DEADLINE, SummaryResult
from ..models import Episode, RunRecord


@attrs.frozen
class Assemble:
    record: RunRecord


@attrs.frozen
class Assembled:
    """The result: an episode with its text, or the REQ-8 reason none is recorded."""

    episode: Episode | None
    text: str | None
    skipped: str | None
    repo: str | None
    branch: str | None
    paths: tuple[str, ...]
    summary: SummaryResult | None = None


class Assembler:
    def __init__(
        self,
        *,
        config: Callable[[], Config],
        summarize: Callable[[str], Awaitable[SummaryResult]],
        pull_request_for: Callable[[str, str], Awaitable[str | None]],
    ) -> None:
        self._config = config
        self._summarize = summarize
        self._pull_request_for = pull_request_for
        self.address, self._mailbox = open_mailbox("assembler", 16)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.address)
        await serve(self._mailbox, self._handle, concurrency=4)

    async def _handle(self, message: object) -> Assembled:
        match message:
            case Assemble(record=record):
                return await self._assemble(record)
            case _:
                raise TypeError(f"assembler cannot handle {type(message).__name__}")

    async def _assemble(self, record: RunRecord) -> Assembled:
        config = self._config()
        harness = config.harness.get(record.harness)
        repos = await resolve_sessions(record)
        primary = record.primary_session
        where = repos.get(primary.session_id) if primary else None
        repo = where.key if where else None
        branch = primary.git_branch if primary else None
        # Paths for the graph: every edit in the primary repository, whatever REQ-8 decides.
        reason = skip_reason(
            record, repos,
            memory_record=harness.memory_record if harness else True,
            record_trace=harness.record_trace if harness else True,
        )
        if reason is not None:
            return Assembled(None, None, reason, repo, branch, ())
        pull_request = await self._pull_request_for(repo or "", branch or "")
        kwargs = dict(
            excerpt_chars=config.episodes.excerpt_chars,
            untrusted_inline=harness.untrusted_inline if harness else False,
            pull_request=pull_request,
        )
        episode = assemble(record, repos, **kwargs)
        text = render_text(episode)
        summary: SummaryResult | None = None
        if config.episodes.summary:
            with trio.move_on_after(SUMMARY_DEADLINE + 0.5):
                summary = await self._summarize(text)
            if summary is None:
                summary = SummaryResult(None, "fallback", "slow")
            if summary.summary:
                episode = assemble(record, repos, summary=summary.summary, **kwargs)
                text = render_text(episode)
        return Assembled(episode, text, None, repo, branch, episode.files_touched, summary)
