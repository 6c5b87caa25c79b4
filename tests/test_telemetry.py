"""REQ-18: memory spans carry ids, provider, outcome and sizes only, and only with consent."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memactors.service import open_memory_service
from memactors.telemetry import memory_span
from support import example, wait_ready

_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))
trace.set_tracer_provider(_provider)


@pytest.fixture(autouse=True)
def _clear() -> None:
    _exporter.clear()


@pytest.mark.req18
async def test_req18_telemetry_carries_no_episode_text(make_holder) -> None:  # type: ignore[no-untyped-def]
    record = example("run-42-api-fixer.json")
    async with open_memory_service(make_holder("[telemetry]\nexport_all = true\n")) as memory:
        await wait_ready(memory)
        result = await memory.ingest_run(record)
    spans = [s for s in _exporter.get_finished_spans() if s.name == "memory.episode.record"]
    assert len(spans) == 1
    attributes = dict(spans[0].attributes or {})
    assert attributes["memory.episode_id"] == result["episode_id"]
    assert attributes["memory.provider"] == "builtin"
    assert attributes["memory.outcome"] == "recorded"
    exported = json.dumps(attributes)
    for field in ("ledger", "reconcile", "fix/flaky", "TestLedgerReconcile", "forge.example"):
        assert field not in exported  # no field of the episode body


async def test_no_span_without_consent(make_holder) -> None:  # type: ignore[no-untyped-def]
    async with open_memory_service(make_holder("")) as memory:
        await wait_ready(memory)
        await memory.ingest_run(example("run-42-api-fixer.json"))
    assert [s for s in _exporter.get_finished_spans() if s.name.startswith("memory.")] == []


def test_a_body_attribute_is_refused_even_when_export_is_off() -> None:
    with pytest.raises(ValueError, match="not allowed"), memory_span("memory.x", enabled=False, text="body"):
        pass
