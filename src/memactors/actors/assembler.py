"""The assembler actor: a closed run record in, a redacted episode (or a skip reason) out (REQ-5, 6, 7, 8).

Pure code, no model, off the supervision path: it resolves repositories with git off the trio loop,
looks up the pull request linked to the branch, and asks the summary actor for a summary, never
waiting past REQ-7's 10 s. It writes nothing; the index actor stores what it returns, in one
transaction with the run, so a failed assembly leaves no trace and a stored run always has its episode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import attrs
import trio
from loguru import logger

from ..config import Config, HarnessConfig
from ..episode import (
    MAX_GRAPH_PATHS,
    assemble,
    clean,
    render_text,
    repo_files,
    resolve_sessions_many,
    skip_reason,
    stored_record,
)
from ..errors import MemactorsError
from ..metrics import Metrics
from ..modelapi import SUMMARY_DEADLINE, SummaryResult
from ..models import Episode, RunRecord
from ..store import pull_requests
from .kernel import Ask, open_mailbox, serve

# The summary actor enforces REQ-7's 10 s itself; this margin only covers its mailbox and reply.
_SUMMARY_BACKSTOP = SUMMARY_DEADLINE + 0.5


@attrs.frozen
class Assemble:
    """Assemble the episode of a closed run record (already `stored_record`-clean, or it is made so).

    `harness` is the harness as the run saw it (a daemon-started run with its project file merged), for
    REQ-8's `memory_record`; None reads it from the global configuration. `clean` says the sender
    already made the record `stored_record`-clean (the ingest path does, once, in a worker thread): it is
    not redacted a second time.
    """

    record: RunRecord
    harness: HarnessConfig | None = None
    clean: bool = False


@attrs.frozen
class AssembleMany(Ask["tuple[Assembled | MemactorsError, ...]"]):
    """Assemble many closed, already `stored_record`-clean run records at once (the ingest path, for one
    record or a whole IngestRuns batch): git for all their sessions in one worker thread, their pull
    requests in one read, every episode cut, redacted and rendered in one more worker thread.

    Each item is (record, harness as the run saw it or None). Answers a tuple in the same order, one
    `Assembled` or the `MemactorsError` that record's assembly raised (the others are unaffected).
    """

    items: tuple[tuple[RunRecord, HarnessConfig | None], ...]


@attrs.frozen
class Assembled:
    """The result: an episode with its text, or the REQ-8 reason none is recorded.

    `repo`, `branch` and `paths` describe the run for the graph whether or not an episode was made;
    `keep_run` is False only when the harness records no trace, so nothing of the run is stored.
    """

    episode: Episode | None
    text: str | None
    skipped: str | None
    repo: str | None
    branch: str | None
    paths: tuple[str, ...]
    summary: SummaryResult | None = None

    @property
    def keep_run(self) -> bool:
        return self.skipped != "record_trace_off"


def _assembled(record: RunRecord, repos: Any, options: dict[str, Any]) -> tuple[Episode, str]:
    """The episode and its text (CPU work: excerpt cutting, redaction; run in a worker thread)."""
    episode = assemble(record, repos, **options)
    return episode, render_text(episode)


#: Runs a function on a read connection off the trio loop (`Store.read`).
Read = Callable[[Callable[[Any], Any]], Awaitable[Any]]


class Assembler:
    def __init__(
        self,
        *,
        config: Callable[[], Config],
        summarize: Callable[[str, str], Awaitable[SummaryResult]],
        pull_request_for: Callable[[str, str | None], Awaitable[str | None]],
        metrics: Metrics | None = None,
        read: Read | None = None,
    ) -> None:
        self._config = config
        self._summarize = summarize
        self._pull_request_for = pull_request_for
        self._read = read
        self._metrics = metrics
        self._log = logger.bind(actor="assembler")
        self.address, self._mailbox = open_mailbox("assembler", 16)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.address)
        await serve(self._mailbox, self._handle, concurrency=4)

    async def _handle(self, message: object) -> Assembled | tuple[Assembled | MemactorsError, ...]:
        match message:
            case Assemble(record=record, harness=harness, clean=True):
                return await self._assemble(record, harness)
            case Assemble(record=record, harness=harness):
                # Redaction is CPU work: in a worker thread, never on the trio loop.
                return await self._assemble(await trio.to_thread.run_sync(stored_record, record), harness)
            case AssembleMany(items=items):
                return await self._assemble_many(items)
            case _:
                raise TypeError(f"assembler cannot handle {type(message).__name__}")

    async def _assemble(self, record: RunRecord, harness: HarnessConfig | None = None) -> Assembled:
        """One record: `_assemble_many` of one, its refusal raised."""
        (result,) = await self._assemble_many(((record, harness),))
        if isinstance(result, MemactorsError):
            raise result
        return result

    async def _pull_requests(self, pairs: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], str | None]:
        return {pair: await self._pull_request_for(*pair) for pair in dict.fromkeys(pairs)}

    async def _assemble_many(
            self, items: Sequence[tuple[RunRecord, HarnessConfig | None]]) -> tuple[Assembled | MemactorsError, ...]:
        """`_assemble` for many records, with a thread hop per stage instead of per record (same answers)."""
        config = self._config()
        out: list[Assembled | MemactorsError | None] = [None] * len(items)
        repos_of = await resolve_sessions_many(record for record, _ in items)
        todo: list[tuple[int, RunRecord, Any, dict[str, Any], tuple[str | None, str | None, tuple[str, ...]]]] = []
        for n, ((record, harness), repos) in enumerate(zip(items, repos_of, strict=True)):
            if isinstance(repos, MemactorsError):
                out[n] = repos
                continue
            harness = harness or config.harness.get(record.harness)
            primary = record.primary_session
            where = repos.get(primary.session_id) if primary else None
            repo = clean(where.key) if where and where.key else None  # a key from git is not from the record
            branch = primary.git_branch if primary else None
            paths = repo_files(record, repos)[:MAX_GRAPH_PATHS]
            reason = skip_reason(
                record, repos,
                memory_record=harness.memory_record if harness else True,
                record_trace=harness.record_trace if harness else True,
            )
            if reason is not None:
                out[n] = Assembled(None, None, reason, repo, branch, paths)
                continue
            assert repo is not None  # skip_reason guarantees a primary repository
            options: dict[str, Any] = dict(excerpt_chars=config.episodes.excerpt_chars,
                                           untrusted_inline=harness.untrusted_inline if harness else False)
            todo.append((n, record, repos, options, (repo, branch, paths)))
        pairs = [(where[0], where[1]) for *_, where in todo if where[0] is not None]

        def with_pull_requests(prs: dict[tuple[str, str | None], str | None]) -> None:
            for _, _, _, options, (repo, branch, _) in todo:
                options["pull_request"] = prs.get((repo, branch)) if repo is not None else None

        def assemble_all(rows: Sequence[Any], summaries: dict[int, str]) -> list[tuple[Episode, str] | MemactorsError]:
            done: list[tuple[Episode, str] | MemactorsError] = []
            for n, record, repos, options, _ in rows:
                try:
                    extra = {"summary": summaries[n]} if n in summaries else {}
                    done.append(_assembled(record, repos, {**options, **extra}))
                except MemactorsError as exc:
                    done.append(exc)
            return done

        built: list[tuple[Episode, str] | MemactorsError] = []
        if todo and self._read is not None:
            # The pull requests read and the assembly in one worker-thread hop (a read connection).
            def look_up_and_assemble(db: Any) -> list[tuple[Episode, str] | MemactorsError]:
                with_pull_requests({pair: pull_requests.pull_request_for(db, *pair) for pair in dict.fromkeys(pairs)})
                return assemble_all(todo, {})

            built = await self._read(look_up_and_assemble)
        elif todo:
            with_pull_requests(await self._pull_requests(pairs))
            built = await trio.to_thread.run_sync(assemble_all, todo, {})
        summaries: dict[int, SummaryResult] = {}
        if config.episodes.summary and todo:
            async def summarise(n: int, episode: Episode, text: str) -> None:
                summaries[n] = await self._summary(text, episode.episode_id)

            async with trio.open_nursery() as nursery:
                for (n, *_), result in zip(todo, built, strict=True):
                    if not isinstance(result, MemactorsError):
                        nursery.start_soon(summarise, n, result[0], result[1])
            wanted = {n: s.summary for n, s in summaries.items() if s.summary}
            if wanted:
                rows = [row for row in todo if row[0] in wanted]
                again = dict(zip((row[0] for row in rows),
                                 await trio.to_thread.run_sync(assemble_all, rows, wanted), strict=True))
                built = [again.get(row[0], b) for row, b in zip(todo, built, strict=True)]
        for (n, _, _, _, (repo, branch, paths)), result in zip(todo, built, strict=True):
            if isinstance(result, MemactorsError):
                out[n] = result
            else:
                out[n] = Assembled(result[0], result[1], None, repo, branch, paths, summaries.get(n))
        assert all(a is not None for a in out)
        return tuple(a for a in out if a is not None)

    async def _summary(self, text: str, episode_id: str) -> SummaryResult:
        """REQ-7: the summary actor's answer, or a fallback; never fails the recording, never waits past 10 s."""
        result: SummaryResult | None = None
        with trio.move_on_after(_SUMMARY_BACKSTOP):
            try:
                result = await self._summarize(text, episode_id)
            except MemactorsError as exc:
                # The summary actor stopped or failed: the episode is recorded without a summary.
                self._log.bind(episode=episode_id, error=type(exc).__name__).warning("episode summary unavailable")
                result = self._fallback("error")
        if result is None:
            self._log.bind(episode=episode_id, error="deadline").warning("episode summary unavailable")
        return result if result is not None else self._fallback("slow")

    def _fallback(self, reason: str) -> SummaryResult:
        if self._metrics is not None:
            self._metrics.episode_summarised("fallback")
        return SummaryResult(None, "fallback", reason)
