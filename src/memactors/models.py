"""The domain models: run records coming in, episodes going out.

Plain frozen attrs classes with no serialisation code; `_wire.py` owns every conversion to and from
JSON, MCP payloads and SQLite rows.
"""

from __future__ import annotations

from typing import Literal

import attrs

Outcome = Literal["succeeded", "failed", "cancelled", "timed_out", "crashed"]
Reason = Literal[
    "completed", "exit_nonzero", "verify_failed", "budget_exceeded", "deadline",
    "operator_cancel", "signal", "spawn_error", "launch_failed", "internal_error",
    "verify_incomplete",
]
TrustClass = Literal["standard", "untrusted_input"]
CostSource = Literal["reported", "estimated", "unknown"]
TriggerSource = Literal["manual", "schedule", "api", "webhook", "channel", "operator"]
EventKind = Literal["edit", "verify", "tool_call", "message"]


@attrs.frozen
class ModelInfo:
    """The model a run used: served by the API, pinned by the operator, or configured."""

    served: str | None = None
    pinned: str | None = None
    configured: str | None = None

    @property
    def effective(self) -> str:
        return self.served or self.pinned or self.configured or ""


@attrs.frozen
class Trigger:
    """What started the run; webhook and channel sources make its episode untrusted_input (REQ-6)."""

    source: TriggerSource = "manual"
    name: str = ""


@attrs.frozen
class Session:
    """One agent session of a run. The primary session is the first that is not a subagent's."""

    session_id: str
    cwd: str
    subagent: bool = False
    repo: str | None = None
    git_branch: str | None = None
    started_at: str | None = None


@attrs.frozen
class Event:
    """A run event. Only kind, session, path, ok and error_class are ever read; payloads never are."""

    kind: EventKind
    session_id: str
    at: str
    path: str | None = None
    ok: bool | None = None
    error_class: str | None = None


#: Costs are kept to this many decimal places of a US dollar: finer than any provider prices a token
#: (a price per million tokens with three decimals is a multiple of 1e-9 per token), coarse enough that
#: the float artefacts of summing per-step costs (0.0016 * 3 = 0.0048000000000000004) are gone.
COST_DECIMALS = 9


def round_cost(value: float | None) -> float | None:
    """A reported cost at the providers' precision (:data:`COST_DECIMALS`); None stays None."""
    return None if value is None else round(float(value), COST_DECIMALS)


@attrs.frozen
class RunRecord:
    """A closed run record as the supervising daemon hands it over (see docs/contracts.md)."""

    harness: str
    adapter: str
    run_id: str
    started_at: str
    ended_at: str
    outcome: Outcome
    reason: Reason
    sessions: tuple[Session, ...]
    trace_id: str = ""
    duration_ms: int = 0
    cost_usd: float | None = attrs.field(default=None, converter=round_cost)
    cost_source: CostSource = "unknown"
    model: ModelInfo = ModelInfo()
    result_text: str | None = None
    trigger: Trigger = Trigger()
    spawned_process: bool = True
    prompt: str | None = None
    events: tuple[Event, ...] = ()

    @property
    def primary_session(self) -> Session | None:
        return next((s for s in self.sessions if not s.subagent), None)


@attrs.frozen
class VerifyFailure:
    error_class: str
    count: int


@attrs.frozen
class Episode:
    """REQ-5's episode, field for field and in its order; every string already redacted."""

    episode_id: str
    harness: str
    adapter: str
    run_id: str
    trace_id: str
    model: str
    repo: str
    branch: str
    outcome: Outcome
    reason: Reason
    started_at: str
    duration_ms: int
    cost_usd: float | None
    cost_source: CostSource
    files_touched: tuple[str, ...]
    pull_request: str | None
    verify_failures: tuple[VerifyFailure, ...]
    result_excerpt: str
    summary: str | None
    trust_class: TrustClass
    scope: str
