"""The state of one run the daemon started, as the operator sees it (``RunState.view()``: what
``StartRun``, ``WaitRun``, ``GetRun`` and ``ListRuns`` answer, and what the store keeps of it).

Kept apart from the runs actor (``actors/runs.py``), which supervises processes: this is the shape of a
run, read by the service, the RPC and the store's rows.
"""

from __future__ import annotations

import socket
from typing import Any, Literal

import attrs
import trio

from .run_record import StopReason
from .run_watch import RunWatch

__all__ = ["RunState"]


@attrs.define(eq=False)
class RunState:
    """One run as the actor tracks it; ``done`` is set once its record went down the ingest path."""

    harness: str
    run_id: str
    adapter: str
    started_at: str
    state: Literal["running", "ended"] = "running"
    outcome: str | None = None
    reason: str | None = None
    episode_id: str | None = None
    ingest: str | None = None
    exit_code: int | None = None
    #: Why the agent could not be started (e.g. "FileNotFoundError: claude"); None otherwise.
    error: str | None = None
    pid: int | None = None
    #: The host whose daemon runs it (a store shared by daemons on several hosts: docs/fleet.md); only
    #: that host's daemon may reap it after a crash.
    host: str = attrs.field(factory=socket.gethostname)
    ended_at: str | None = None
    duration_ms: int | None = None
    #: The harness's caps for this run, what the agent reported so far, and the cap that ended it.
    max_turns: int | None = None
    max_cost_usd: float | None = None
    turns: int | None = None
    cost_usd: float | None = None
    cap: str | None = None
    #: Who stopped it: ``deadline``, ``operator_cancel`` (the daemon stopping), ``cancel`` (CancelRun) or
    #: the cap's name; None when the agent ended on its own.
    stop_reason: StopReason | None = None
    #: The last 4 KiB of the agent's stderr, redacted (set when the run ends).
    stderr_tail: str | None = None
    #: Events that no longer fit the run's log (run_watch.MAX_EVENTS).
    log_dropped: int = 0
    done: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope | None = None
    #: The run's live event log while it runs; None once ended (then it is in the store).
    watch: RunWatch | None = None

    def stop(self, reason: StopReason) -> None:
        """Stop the process the way a deadline does (SIGTERM, grace, SIGKILL); it is still recorded."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.scope is not None:
            self.scope.cancel()

    def view(self) -> dict[str, Any]:
        """The operator's view (StartRun, WaitRun, GetRun, ListRuns answers): ids, state, process, times,
        outcome, episode, caps, the stderr tail. Never the prompt or what the agent wrote."""
        return {"run_id": self.run_id, "harness": self.harness, "adapter": self.adapter, "state": self.state,
                "started_at": self.started_at, "ended_at": self.ended_at, "duration_ms": self.duration_ms,
                "pid": self.pid, "host": self.host, "outcome": self.outcome, "reason": self.reason, "cap": self.cap,
                "stopped_by": self.stop_reason, "episode_id": self.episode_id, "ingest": self.ingest,
                "exit_code": self.exit_code, "error": self.error, "max_turns": self.max_turns,
                "max_cost_usd": self.max_cost_usd, "turns": self.turns, "cost_usd": self.cost_usd,
                "log_dropped": self.log_dropped, "stderr_tail": self.stderr_tail}

    @classmethod
    def ended_from(cls, view: dict[str, Any]) -> RunState:
        """An ended run as the store keeps it (after a restart, or past KEEP_FINISHED)."""
        fields = {a.name for a in attrs.fields(cls) if a.init and a.name not in ("done", "scope", "watch")}
        state = cls(**{k: v for k, v in view.items() if k in fields})
        state.stop_reason = view.get("stopped_by")
        state.done.set()
        return state
