"""REQ-18 telemetry: memory spans carry ids, provider, outcome and sizes — never episode text.

Spans go through the OpenTelemetry API (already a dependency of the mcp SDK); whatever SDK and
exporter the embedding daemon installs decides where they go. They are emitted only with consent:
`[telemetry] export_all = true`. Attribute names are a closed set checked at the call, so a later change
cannot attach a body, a query or a prompt by accident.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util._decorator import _agnosticcontextmanager  # what Tracer's own context managers are
from opentelemetry.util.types import Attributes

ALLOWED_ATTRIBUTES = frozenset({
    "memory.episode_id", "memory.provider", "memory.outcome", "memory.bytes", "memory.items",
    "memory.harness", "memory.run_id", "memory.dropped", "memory.degraded",
})

_tracer = trace.get_tracer("memactors")


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        _check(key)


def _check(key: str) -> None:
    if key not in ALLOWED_ATTRIBUTES:
        raise ValueError(f"span attribute {key!r} is not allowed on memory spans (REQ-18)")


@contextmanager
def memory_span(name: str, *, enabled: bool, **attributes: Any) -> Iterator[Any]:
    """A span named `name` when telemetry export is consented to (`enabled`), else a no-op.

    Keyword names map to `memory.<name>` attributes and must be in ALLOWED_ATTRIBUTES either way, so
    a disallowed attribute fails in every test run, not only where export is on.
    """
    attrs = {f"memory.{k}": v for k, v in attributes.items() if v is not None}
    for key in attrs:
        _check(key)
    if not enabled:
        yield _NoSpan()
        return
    with _tracer.start_as_current_span(name, attributes=attrs) as span:
        yield _Checked(span)


class _Checked:
    def __init__(self, span: Any) -> None:
        self._span = span

    def set_attribute(self, key: str, value: Any) -> None:
        _check(key)
        self._span.set_attribute(key, value)


# -- the mcp SDK's own spans ------------------------------------------------------------------------------
#
# The mcp SDK opens a span for every request it sends ("MCP send tools/call memory_recall") on its own
# module tracer. A host that installs a tracer provider would export those for the provider session's
# calls whatever `[telemetry] export_all` says. The guard below wraps that tracer once: in a context where
# `guard_sdk_spans` set a consent function, a span is started only while it answers True; elsewhere (the
# host's own MCP use, in an embedding process) the SDK behaves as shipped.

_sdk_consent: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "memactors_sdk_span_consent", default=None)


class _GuardedTracer(trace.Tracer):
    """The mcp SDK's tracer behind the consent of the task that opens a span (`guard_sdk_spans`)."""

    def __init__(self, inner: trace.Tracer) -> None:
        self._inner = inner

    @_agnosticcontextmanager
    def start_as_current_span(
        self, name: str, context: Context | None = None, kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Attributes = None, links: Sequence[trace.Link] | None = None, start_time: int | None = None,
        record_exception: bool = True, set_status_on_exception: bool = True, end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        consent = _sdk_consent.get()
        if consent is not None and not consent():
            yield trace.INVALID_SPAN
            return
        with self._inner.start_as_current_span(
                name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception,
                end_on_exit) as span:
            yield span

    def start_span(
        self, name: str, context: Context | None = None, kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Attributes = None, links: Sequence[trace.Link] | None = None, start_time: int | None = None,
        record_exception: bool = True, set_status_on_exception: bool = True,
    ) -> trace.Span:
        consent = _sdk_consent.get()
        if consent is not None and not consent():
            return trace.INVALID_SPAN
        return self._inner.start_span(name, context, kind, attributes, links, start_time, record_exception,
                                      set_status_on_exception)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard_sdk_spans(consent: Callable[[], bool]) -> None:
    """From here on in this task (and the tasks it starts), the mcp SDK's spans need `consent()`."""
    from mcp.shared import _otel

    if not isinstance(_otel._tracer, _GuardedTracer):
        _otel._tracer = _GuardedTracer(_otel._tracer)
    _sdk_consent.set(consent)


# -- the mcp SDK's server spans -----------------------------------------------------------------------------
#
# An mcp `Server` ships with the SDK's OpenTelemetryMiddleware, which opens a SERVER span for every message
# it handles (`tools/call recall`, `tools/list`, `resources/read`, …). For the gateway those are memory
# spans of the calling run: exported only under consent, like the daemon's own (REQ-18).


class _ConsentedServerSpans:
    """The SDK's per-message span middleware, run only for a message `consent(ctx)` allows; any other
    message goes straight to the next layer, with no span at all."""

    def __init__(self, inner: Any, consent: Callable[[Any], bool]) -> None:
        self._inner = inner
        self._consent = consent

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        if self._consent(ctx):
            return await self._inner(ctx, call_next)
        return await call_next(ctx)


def consent_server_spans(server: Any, consent: Callable[[Any], bool]) -> None:
    """Make `server`'s SDK span middleware ask `consent(ctx)` for each message it would trace."""
    from mcp.server._otel import OpenTelemetryMiddleware

    server.middleware = [_ConsentedServerSpans(m, consent) if isinstance(m, OpenTelemetryMiddleware) else m
                         for m in server.middleware]
