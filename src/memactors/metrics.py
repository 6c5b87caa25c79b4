"""Prometheus metrics: exactly SPEC-0030 REQ-21's families, served with /healthz and /readyz on hypercorn.

``Metrics`` owns its own ``CollectorRegistry`` (never the process-global one), so two daemons or two
tests in one process do not share counters. Every family's ``# HELP``/``# TYPE`` lines appear in the
exposition from the start; labelled series appear when first touched. ``harness_memory_provider_up``
in particular has no series until the first contract check sets it (REQ-21).

Label values are checked against REQ-21's vocabularies by the typed helpers, which raise
``ValueError`` on anything else, so no label can carry a query, an id, a repository or text.
Provider and harness labels must look like configuration names (``[A-Za-z0-9][A-Za-z0-9_.-]*``,
at most 64 characters). REQ-21 caps the harness label;
we read that as a bound on distinct values: after ``max_harnesses`` distinct harnesses, further ones
are counted under ``harness="_other"``.

One family outside the ``harness_memory_`` namespace carries actor channel statistics:
``memactors_actor_queue_depth{actor}``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, NoReturn

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    generate_latest,
    make_asgi_app,
)
from prometheus_client.registry import Collector

from .logs import get_logger
from .net.asgi import serve_lifespan
from .net.listen import serve_asgi

__all__ = [
    "BRIEFING_OUTCOMES",
    "INGEST_OUTCOMES",
    "RUN_OUTCOMES",
    "DELIVERIES",
    "DROP_REASONS",
    "EPISODE_OUTCOMES",
    "FAMILY_NAMES",
    "FLEET_FAMILY_NAMES",
    "OPS",
    "PENDING_KINDS",
    "RECALL_OUTCOMES",
    "SUMMARY_OUTCOMES",
    "Metrics",
    "metrics_app",
    "serve_metrics",
]

EPISODE_OUTCOMES = frozenset({"ok", "error", "skipped"})
SUMMARY_OUTCOMES = frozenset({"ok", "fallback"})
RECALL_OUTCOMES = frozenset({"ok", "degraded", "error"})
OPS = frozenset({"record", "recall", "forget", "contract"})
#: REQ-9's drop reasons, exactly (REQ-21: "reason is REQ-9's"). An item whose text was not drawn from the
#: episode it names is not dropped but served with the daemon's own text: that is counted in
#: ``memactors_memory_results_text_replaced_total``, not here.
DROP_REASONS = frozenset({"unknown_id", "forgotten", "scope", "invalid"})
PENDING_KINDS = frozenset({"record", "forget"})
DELIVERIES = frozenset({"prompt", "tool", "resource"})
BRIEFING_OUTCOMES = frozenset({"ok", "empty", "skipped"})
#: What became of a run record handed to the daemon (IngestRun's outcome): resident sessions and imports.
INGEST_OUTCOMES = frozenset({"recorded", "queued", "duplicate", "skipped", "rejected"})
#: How a run the daemon started ended (REQ-5's outcomes).
RUN_OUTCOMES = frozenset({"succeeded", "failed", "cancelled", "timed_out", "crashed", "capped"})
#: The resident agents `memactors install` connects; any other agent name is counted as "_other".
RESIDENT_AGENTS = frozenset({"claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "pi", "copilot"})
#: Where imported records come from (`memactors import git|sessions <agent>`); any other is "_other".
IMPORT_SOURCES = frozenset({"git", "claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "pi", "copilot"})
#: A run lasts seconds to hours: buckets from a quick answer to a long capped run.
_RUN_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)

#: The REQ-21 family names as they appear in the exposition.
FAMILY_NAMES = (
    "harness_memory_episodes_recorded_total",
    "harness_memory_episode_summaries_total",
    "harness_memory_provider_up",
    "harness_memory_provider_duration_seconds",
    "harness_memory_recalls_total",
    "harness_memory_results_dropped_total",
    "harness_memory_briefings_total",
    "harness_memory_briefing_bytes",
    "harness_memory_pending",
)
#: Families past REQ-21 in its namespace: whether residents, runs and imports reach the daemon.
#: Their labels keep REQ-21's rules: vocabularies and configuration names, no ids, repositories or text.
FLEET_FAMILY_NAMES = (
    "harness_memory_resident_sessions_total",
    "harness_memory_runs_started_total",
    "harness_memory_runs_ended_total",
    "harness_memory_run_duration_seconds",
    "harness_memory_imported_records_total",
)

OTHER_HARNESS = "_other"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Provider calls run under provider_timeout (seconds); buckets span a fast local call to a timeout.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_log = get_logger(component="metrics")


def _check(value: str, allowed: frozenset[str], label: str) -> str:
    if value not in allowed:
        raise ValueError(f"{label} label must be one of {sorted(allowed)}, got {value!r}")
    return value


def _check_name(value: str, label: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"{label} label must be a configuration name ([A-Za-z0-9][A-Za-z0-9_.-]*, ≤64)")
    return value


class Metrics:
    """The daemon's metrics: REQ-21's families on a private registry, with label-checked helpers."""

    def __init__(self, *, max_harnesses: int = 64, wall_clock: Callable[[], datetime] | None = None) -> None:
        self.registry = CollectorRegistry()
        self._mailboxes: Callable[[], Iterable[Any]] = tuple
        self._embeddings: Callable[[], tuple[int, str | None]] | None = None
        self._wall_clock = wall_clock or (lambda: datetime.now(UTC))
        #: wall times of recent degraded recalls, oldest first (bounded: doctor only needs 24 hours)
        self.degraded_recalls: deque[datetime] = deque(maxlen=100_000)
        #: recalls degraded one after another since the last one that was not (Status's "a run of
        #: degraded recalls")
        self.degraded_in_a_row = 0
        self._max_harnesses = max_harnesses
        self._harnesses: set[str] = set()
        r = self.registry
        # prometheus_client appends _total to counter names itself.
        self.episodes_recorded = Counter(
            "harness_memory_episodes_recorded",
            "Episodes handed to the memory provider, by outcome.",
            ["provider", "outcome"],
            registry=r,
        )
        self.episode_summaries = Counter(
            "harness_memory_episode_summaries",
            "Episode summaries by the utility model, or the fallback without one.",
            ["outcome"],
            registry=r,
        )
        self.provider_up = Gauge(
            "harness_memory_provider_up",
            "1 when the provider's last contract check passed, 0 when it failed; absent before the first.",
            ["provider"],
            registry=r,
        )
        self.provider_duration = Histogram(
            "harness_memory_provider_duration_seconds",
            "Duration of calls to the memory provider, by operation.",
            ["provider", "op"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.recalls = Counter(
            "harness_memory_recalls",
            "Recall requests, by outcome.",
            ["provider", "outcome"],
            registry=r,
        )
        self.results_dropped = Counter(
            "harness_memory_results_dropped",
            "Provider results dropped by the episode index, by REQ-9 reason.",
            ["provider", "reason"],
            registry=r,
        )
        self.briefings = Counter(
            "harness_memory_briefings",
            "Briefings served to harnesses, by delivery and outcome.",
            ["harness", "delivery", "outcome"],
            registry=r,
        )
        self.briefing_bytes = Gauge(
            "harness_memory_briefing_bytes",
            "Size in bytes of the last briefing served to a harness.",
            ["harness"],
            registry=r,
        )
        self.pending = Gauge(
            "harness_memory_pending",
            "Records and forgets waiting for a retry.",
            ["provider", "kind"],
            registry=r,
        )
        # Whether residents, runs and imports reach the daemon. Labels are vocabularies and
        # configuration names only: no run id, repository or text.
        self.resident_sessions = Counter(
            "harness_memory_resident_sessions",
            "Resident agent sessions handed to the daemon by their session-end hook, by agent and outcome.",
            ["agent", "outcome"],
            registry=r,
        )
        self.runs_started = Counter(
            "harness_memory_runs_started",
            "Runs the daemon started (memactors run, StartRun), by harness.",
            ["harness"],
            registry=r,
        )
        self.runs_ended = Counter(
            "harness_memory_runs_ended",
            "Runs the daemon started that ended, by harness and outcome.",
            ["harness", "outcome"],
            registry=r,
        )
        self.run_duration = Histogram(
            "harness_memory_run_duration_seconds",
            "Duration of the runs the daemon started, by harness.",
            ["harness"],
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.imported_records = Counter(
            "harness_memory_imported_records",
            "Records imported (memactors import), by source and outcome.",
            ["source", "outcome"],
            registry=r,
        )
        # Not a REQ-21 family, so outside the harness_memory_ namespace (as the queue depth below).
        self.results_text_replaced = Counter(
            "memactors_memory_results_text_replaced",
            "Provider results kept but served with memactors' own text of their episode (not drawn from it).",
            ["provider"],
            registry=r,
        )
        self.actor_queue_depth = Gauge(
            "memactors_actor_queue_depth",
            "Messages waiting in an actor's inbox.",
            ["actor"],
            registry=r,
        )
        self.embeddings_pending = Gauge(
            "memactors_embeddings_pending",
            "Built-in episodes without a vector yet (the background back-fill's work; recall ranks them by text).",
            registry=r,
        )
        self.embeddings_pending_seconds = Gauge(
            "memactors_embeddings_pending_seconds",
            "How long there have been built-in episodes without a vector (0 when every one has its vector).",
            registry=r,
        )

    # -- helpers, one per REQ-21 family --------------------------------------------------------

    def episode_recorded(self, provider: str, outcome: str) -> None:
        """Count one episode record attempt; outcome is ok, error or skipped."""
        self.episodes_recorded.labels(
            _check_name(provider, "provider"), _check(outcome, EPISODE_OUTCOMES, "outcome")
        ).inc()

    def episode_summarised(self, outcome: str) -> None:
        """Count one episode summary; outcome is ok or fallback."""
        self.episode_summaries.labels(_check(outcome, SUMMARY_OUTCOMES, "outcome")).inc()

    def set_provider_up(self, provider: str, up: bool) -> None:
        """Record a contract check's verdict; the first call creates the series."""
        self.provider_up.labels(_check_name(provider, "provider")).set(1 if up else 0)

    def clear_provider_up(self, provider: str) -> None:
        """Remove the provider_up series again (e.g. the configured provider changed on reload)."""
        try:
            self.provider_up.remove(_check_name(provider, "provider"))
        except KeyError:
            pass

    def observe_provider_call(self, provider: str, op: str, seconds: float) -> None:
        """Observe one provider call's duration; op is record, recall, forget or contract."""
        self.provider_duration.labels(_check_name(provider, "provider"), _check(op, OPS, "op")).observe(
            seconds
        )

    def recall(self, provider: str, outcome: str) -> None:
        """Count one recall; outcome is ok, degraded or error."""
        self.recalls.labels(
            _check_name(provider, "provider"), _check(outcome, RECALL_OUTCOMES, "outcome")
        ).inc()
        if outcome == "degraded":
            self.degraded_recalls.append(self._wall_clock())
            self.degraded_in_a_row += 1
        elif outcome == "ok":
            self.degraded_in_a_row = 0

    def recall_health(self, now: datetime) -> dict[str, Any]:
        """Recent recalls for Status and doctor: how many were degraded in a row (up to now), in the last
        24 hours, and how long ago the last one was (None when none is remembered)."""
        last = self.degraded_recalls[-1] if self.degraded_recalls else None
        return {"degraded_in_a_row": self.degraded_in_a_row,
                "degraded_24h": self.degraded_recalls_since(now - timedelta(hours=24)),
                "last_degraded_seconds_ago": None if last is None else max(0.0, (now - last).total_seconds())}

    def degraded_recalls_since(self, since: datetime) -> int:
        """How many recalls were degraded at or after `since` (doctor's 24-hour warning, REQ-19)."""
        while self.degraded_recalls and self.degraded_recalls[0] < since:
            self.degraded_recalls.popleft()
        return len(self.degraded_recalls)

    def dropped(self, provider: str, reason: str, count: int = 1) -> None:
        """Count ``count`` provider results dropped for a REQ-9 reason (unknown_id, forgotten, scope, invalid)."""
        if count < 0:
            raise ValueError("dropped count must not be negative")
        self.results_dropped.labels(
            _check_name(provider, "provider"), _check(reason, DROP_REASONS, "reason")
        ).inc(count)

    def text_replaced(self, provider: str, count: int = 1) -> None:
        """Count ``count`` provider results kept but served with memactors' own text of their episode,
        because the provider's text was not drawn from it (REQ-9's text check). Not drops: a series of
        their own, so ``harness_memory_results_dropped_total`` keeps REQ-9's four reasons."""
        if count < 0:
            raise ValueError("replaced count must not be negative")
        self.results_text_replaced.labels(_check_name(provider, "provider")).inc(count)

    def briefing(self, harness: str, delivery: str, outcome: str, size_bytes: int | None = None) -> None:
        """Count one briefing (delivery prompt|tool|resource, outcome ok|empty|skipped); set its size if given."""
        delivery = _check(delivery, DELIVERIES, "delivery")
        outcome = _check(outcome, BRIEFING_OUTCOMES, "outcome")
        label = self._harness_label(harness)
        self.briefings.labels(label, delivery, outcome).inc()
        if size_bytes is not None:
            self.briefing_bytes.labels(label).set(size_bytes)

    def set_briefing_bytes(self, harness: str, size_bytes: int) -> None:
        """Set the size of the last briefing served to ``harness``."""
        self.briefing_bytes.labels(self._harness_label(harness)).set(size_bytes)

    def resident_session(self, agent: str, outcome: str) -> None:
        """Count one resident session record (agent a known resident, else ``_other``; outcome IngestRun's)."""
        self.resident_sessions.labels(agent if agent in RESIDENT_AGENTS else OTHER_HARNESS,
                                      _check(outcome, INGEST_OUTCOMES, "outcome")).inc()

    def imported(self, source: str, outcome: str) -> None:
        """Count one imported record (source git or an agent's sessions, else ``_other``; outcome IngestRun's)."""
        self.imported_records.labels(source if source in IMPORT_SOURCES else OTHER_HARNESS,
                                     _check(outcome, INGEST_OUTCOMES, "outcome")).inc()

    def run_started(self, harness: str) -> None:
        """Count one run the daemon started."""
        self.runs_started.labels(self._harness_label(harness)).inc()

    def run_ended(self, harness: str, outcome: str, seconds: float) -> None:
        """Count one run that ended (REQ-5 outcome) and observe how long it ran."""
        label = self._harness_label(harness)
        self.runs_ended.labels(label, _check(outcome, RUN_OUTCOMES, "outcome")).inc()
        self.run_duration.labels(label).observe(max(seconds, 0.0))

    def set_pending(self, provider: str, kind: str, count: int) -> None:
        """Set how many records or forgets wait for a retry; kind is record or forget."""
        self.pending.labels(_check_name(provider, "provider"), _check(kind, PENDING_KINDS, "kind")).set(count)

    def set_actor_queue_depth(self, actor: str, depth: int) -> None:
        """Export an actor inbox's current depth (from ``MemoryReceiveChannel.statistics()``)."""
        self.actor_queue_depth.labels(_check_name(actor, "actor")).set(depth)

    def _harness_label(self, harness: str) -> str:
        # A run token may be minted for any harness name (`memactors token mint`), not only a configured
        # one: a name that could not be a configuration key is counted as the other harnesses, never a
        # failed briefing (it raised, and the agent's briefing call failed with a traceback).
        if not isinstance(harness, str) or not _NAME.fullmatch(harness):
            return OTHER_HARNESS
        if harness in self._harnesses:
            return harness
        if len(self._harnesses) >= self._max_harnesses:
            return OTHER_HARNESS
        self._harnesses.add(harness)
        return harness

    # -- exposition ------------------------------------------------------------------------------

    def watch_mailboxes(self, addresses: Callable[[], Iterable[Any]]) -> None:
        """Export the queue depth of these actors' mailboxes at every scrape (``statistics().queued``)."""
        self._mailboxes = addresses

    def watch_embeddings(self, pending: Callable[[], tuple[int, str | None]]) -> None:
        """Export the built-in provider's episodes without a vector, and since when (`pending`: its
        count and ISO time), at every scrape."""
        self._embeddings = pending

    def refresh(self) -> None:
        """Bring scrape-time gauges (actor queue depths, the vector back-fill) up to date."""
        for address in self._mailboxes():
            stats = address.statistics()
            self.set_actor_queue_depth(stats.name, stats.queued)
        if self._embeddings is not None:
            count, since = self._embeddings()
            self.embeddings_pending.set(count)
            age = (self._wall_clock() - datetime.fromisoformat(since)).total_seconds() if since and count else 0.0
            self.embeddings_pending_seconds.set(max(0.0, age))

    def exposition(self) -> bytes:
        """Return the registry in Prometheus text format (``CONTENT_TYPE_LATEST``), without ``*_created``."""
        self.refresh()
        return generate_latest(self.exported)

    @property
    def exported(self) -> _WithoutCreated:
        """The registry as scrapes see it (what ``/metrics`` serves)."""
        return _WithoutCreated(self.registry)


class _WithoutCreated:
    """The registry as the exposition sees it, minus the ``*_created`` samples prometheus_client adds to
    counters and histograms: the exported families are exactly REQ-21's (and the queue depth), and a
    per-registry filter leaves the process-global ``disable_created_metrics()`` switch to the host."""

    def __init__(self, registry: CollectorRegistry, source: Collector | None = None) -> None:
        self._registry = registry
        self._source: Collector = registry if source is None else source

    def collect(self) -> Iterable[Metric]:
        for family in self._source.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family

    def restricted_registry(self, names: Iterable[str]) -> _WithoutCreated:
        """``/metrics?name[]=…`` (prometheus_client's ASGI app asks for this): the named families of the
        same registry, still without ``*_created``."""
        return _WithoutCreated(self._registry, self._registry.restricted_registry(names))


# ------------------------------------------------------------------------------------ HTTP server

#: The readiness probe: None when ready, else a short reason (e.g. "provider down").
Readiness = Callable[[], Awaitable[str | None]]


async def _always_ready() -> str | None:
    return None


def metrics_app(metrics: Metrics, ready: Readiness = _always_ready) -> Any:
    """The ASGI app of the metrics listener.

    * ``GET /metrics``: prometheus_client's exposition (``make_asgi_app``), which negotiates OpenMetrics
      (``Accept: application/openmetrics-text``) and gzip (``Accept-Encoding: gzip``);
    * ``GET /healthz``: liveness, 200 whenever the daemon's loop answers;
    * ``GET /readyz``: 200 when the memory provider is ready, 503 with a one-line reason otherwise;
    * anything else 404, other methods 405.
    """
    exposition = make_asgi_app(registry=metrics.exported)

    async def plain(send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        body = text.encode("utf-8")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), *(extra or [])]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path not in ("/metrics", "/healthz", "/readyz"):
            await plain(send, 404, "not found; try /metrics, /healthz or /readyz\n")
            return
        if method not in ("GET", "HEAD"):
            await plain(send, 405, "method not allowed\n", [(b"allow", b"GET, HEAD")])
            return
        if path == "/metrics":
            metrics.refresh()
            await exposition(scope, receive, send)
        elif path == "/healthz":
            await plain(send, 200, "ok\n")
        else:
            reason = await ready()
            if reason is None:
                await plain(send, 200, "ready\n")
            else:
                await plain(send, 503, f"not ready: {reason}\n")

    return app


async def serve_metrics(
    metrics: Metrics,
    host: str,
    port: int,
    *,
    ready: Readiness = _always_ready,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` with hypercorn until cancelled;
    reports ``(host, actual_port)``. Keep-alive, HTTP/1.1 and h2c come from hypercorn; the listener is
    capped like every other (see ``net.listen``)."""
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_asgi, metrics_app(metrics, ready), host, port, name="metrics"))
        _log.bind(host=bound[0], port=bound[1]).info("metrics listening")
        task_status.started(bound)
    raise AssertionError("serve_asgi returned")  # pragma: no cover
