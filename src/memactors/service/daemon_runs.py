"""MemoryService's handlers for the daemon's own work: closed run records and the runs it starts.

`ingest_run` / `ingest_runs` take closed run records (from the runs actor, a resident's session-end hook,
`runs ingest`, `import`) into the ingest pipeline (`service/ingest.py`); `summarize` and `pull_request_for`
are what the assembler is handed; StartRun, WaitRun, GetRun, ListRuns, CancelRun and RunLogs follow the
runs the daemon starts (`memactors run`, docs/runs.md) through the runs actor.
"""

from __future__ import annotations

from typing import Any

import trio

from ..actors.runs import CancelRun, FindRun, ListRuns, StartRun
from ..config import HarnessConfig
from ..errors import InvalidArgument
from ..metrics import INGEST_OUTCOMES
from ..modelapi import SummaryResult
from ..store import agent_runs, pull_requests
from .ingest import ingest, ingest_batch
from .parts import ServiceParts


class RunHandlers(ServiceParts):
    """Run records in, and the runs this daemon starts."""

    async def ingest_run(self, data: Any, *, source: str = "record",
                         harness_config: HarnessConfig | None = None) -> dict[str, Any]:
        """Take a closed run record: store it, assemble its episode, record it (or queue the record).

        Returns once the run (and its episode with a pending record) is committed — from then on
        nothing is lost — and after one record attempt bounded by provider_timeout. ``harness_config``
        is the harness as the run saw it (a run started by the daemon, with its project file merged),
        for REQ-8's eligibility; by default the global configuration's.
        """
        (result,) = await ingest(self, [(data, source, harness_config)])
        if isinstance(result, BaseException):
            self._count_ingested(data, "rejected")
            raise result
        self._count_ingested(data, str(result.get("outcome")))
        return result

    async def ingest_runs(self, entries: list[Any]) -> dict[str, Any]:
        """IngestRuns: many closed run records in one call, a result per record in the same order.

        Each result is IngestRun's, or `{"source", "outcome": "rejected", "error": {code, message}}` for a
        record that was refused; one bad record never stops the rest of the batch. The batch is prepared,
        assembled and stored together — a thread hop per stage and one write transaction for all its
        runs and episodes (each record in its own savepoint), committed before any is answered — then
        its episodes are recorded to the provider concurrently.
        """
        answer = await ingest_batch(self, entries)
        for entry, result in zip(entries, answer.get("results") or (), strict=False):
            self._count_ingested(entry.get("record") if isinstance(entry, dict) else None, str(result.get("outcome")))
        return answer

    def _count_ingested(self, data: Any, outcome: str) -> None:
        """Install metrics: a resident's session record (its trigger ``session-end``), or an imported one
        (``import <source>``), by what became of it. Other records (runs, `runs ingest`) are not counted here."""
        if not isinstance(data, dict) or outcome not in INGEST_OUTCOMES:
            return
        trigger = data.get("trigger")
        name = str(trigger.get("name") or "") if isinstance(trigger, dict) else ""
        if name == "session-end" or name.startswith("session-end"):
            self.metrics.resident_session(str(data.get("adapter") or ""), outcome)
        elif name.startswith("import "):
            self.metrics.imported(name.removeprefix("import ").strip(), outcome)

    async def summarize(self, text: str, episode_id: str | None = None) -> SummaryResult:
        return await self.summary.summarize(text, episode_id)

    async def pull_request_for(self, repo: str, branch: str | None) -> str | None:
        """The pull request the run graph links to (repo, branch) now, if any (REQ-5 pull_request;
        docs/contracts.md, "Run graph")."""
        return await self.store.read(lambda db: pull_requests.pull_request_for(db, repo, branch))

    # -- runs (memactors run) ---------------------------------------------------------------------------
    async def start_run(self, *, harness: str, prompt: str | None = None, run_id: str | None = None
                        ) -> dict[str, Any]:
        """StartRun: run the harness's one-shot now (docs/runs.md); answers once the agent is spawned."""
        state = await self.runs.address.ask(StartRun(harness, prompt, run_id))
        return state.view()

    async def wait_run(self, *, run_id: str, harness: str | None = None, wait_seconds: float = 30.0
                       ) -> dict[str, Any]:
        """WaitRun: the run's state, after waiting up to ``wait_seconds`` (at most 300) for it to end and
        be recorded. Call again while ``state`` is ``running``."""
        if not (0 <= wait_seconds <= 300):
            raise InvalidArgument("params.wait_seconds must be from 0 to 300", field="wait_seconds")
        state = await self.runs.address.ask(FindRun(run_id, harness))
        with trio.move_on_after(wait_seconds):
            await state.done.wait()
        return state.view()

    async def get_run(self, *, run_id: str, harness: str | None = None) -> dict[str, Any]:
        """GetRun: one run this daemon started, running or ended (ended runs are in the store, so they
        outlive a restart): state, pid, times, outcome, reason, cap, episode, the redacted stderr tail."""
        state = await self.runs.address.ask(FindRun(run_id, harness))
        return state.view()

    async def list_runs(self, *, harness: str | None = None, state: str | None = None, limit: int = 50,
                        after: str | None = None) -> dict[str, Any]:
        """ListRuns: runs this daemon started, newest first: ``{runs, total, next_cursor}``."""
        match state:
            case None | "running" | "ended":
                return await self.runs.address.ask(ListRuns(harness, state, limit, after))
            case _:
                raise InvalidArgument("params.state must be running or ended", field="params.state")

    async def cancel_run(self, *, run_id: str, harness: str | None = None) -> dict[str, Any]:
        """CancelRun (control): stop a running run (SIGTERM, grace, SIGKILL); it is recorded as
        cancelled / operator_cancel. Answers at once with its state; WaitRun follows it to its end. An
        ended run is answered as it is (nothing to stop)."""
        state = await self.runs.address.ask(CancelRun(run_id, harness))
        return state.view()

    async def run_logs(self, *, run_id: str, harness: str | None = None, after: int = 0,
                       wait_seconds: float = 0.0) -> dict[str, Any]:
        """RunLogs: the run's events after sequence number ``after`` (its parsed stream, redacted; see
        docs/runs.md for what is kept), waiting up to ``wait_seconds`` (at most 300) for one while the
        run runs. ``{run_id, harness, state, events, next, dropped, kept}``: call again with ``after =
        next`` to follow; ``kept`` is false once an ended run's log was pruned or its episode forgotten."""
        if not (0 <= wait_seconds <= 300):
            raise InvalidArgument("params.wait_seconds must be from 0 to 300", field="wait_seconds")
        state = await self.runs.address.ask(FindRun(run_id, harness))
        watch = state.watch
        if watch is not None:
            with trio.move_on_after(wait_seconds):
                await watch.wait_after(after)
            events, kept = watch.since(after), True
            dropped = watch.dropped
        else:
            stored = await self.store.read(lambda db: agent_runs.log_of(db, state.harness, state.run_id))
            kept = stored is not None
            events, dropped = [e for e in stored or () if e.get("seq", 0) > after], state.log_dropped
        last = events[-1]["seq"] if events else after
        return {"run_id": state.run_id, "harness": state.harness, "state": state.state, "events": events,
                "next": last, "dropped": dropped, "kept": kept}

