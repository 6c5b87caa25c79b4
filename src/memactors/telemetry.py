"""REQ-18 telemetry: memory spans carry ids, provider, outcome and sizes — never episode text.

Spans go through the OpenTelemetry API (already a dependency of the mcp SDK); whatever SDK and
exporter the embedding daemon installs decides where they go. They are emitted only with consent:
`[telemetry] export_all = true`. Attribute names are a closed set checked at the call, so a later change
cannot attach a body, a query or a prompt by accident.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

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
