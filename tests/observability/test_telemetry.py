"""REQ-18: memory spans carry ids, provider, outcome and sizes only, and only with consent."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from fix_providers import FaultFiles, fault_toml
from memactors.config import ConfigHolder
from memactors.gateway import BRIEFING_URI
from memactors.service import open_memory_service
from memactors.telemetry import memory_span
from support import example, serving, wait_ready
from support_readside import API, as_run, gateway_client

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


def _sdk_spans() -> list[str]:
    return [s.name for s in _exporter.get_finished_spans() if not s.name.startswith("memory.")]


@pytest.mark.req18
@pytest.mark.slow
@pytest.mark.parametrize("export_all", [False, True])
async def test_req18_the_mcp_sdks_provider_call_spans_follow_telemetry_consent(
        make_holder, tmp_path, export_all: bool) -> None:  # type: ignore[no-untyped-def]
    """With a tracer provider installed by the host, the SDK's own spans for the provider session's calls
    (`MCP send tools/call memory_record_episode` …) are exported only under `export_all`."""
    files = FaultFiles(tmp_path / "fault")
    extra = fault_toml(files) + f"[telemetry]\nexport_all = {'true' if export_all else 'false'}\n"
    async with open_memory_service(make_holder(extra)) as memory:
        await wait_ready(memory)
        assert (await memory.ingest_run(example("run-42-api-fixer.json")))["outcome"] == "recorded"
        await memory.recall(query="ledger", repo="forge.example/acme/api")
    names = _sdk_spans()
    if export_all:
        assert any("tools/call memory_record_episode" in n for n in names), names
    else:
        assert names == []


@pytest.mark.req18
async def test_req18_a_harness_export_telemetry_key_is_accepted_and_consents_for_its_runs(make_holder) -> None:  # type: ignore[no-untyped-def]
    extra = '[harness.api-fixer]\nharness = "claude-code"\nexport_telemetry = true\n'
    async with open_memory_service(make_holder(extra)) as memory:
        assert memory.config.harness["api-fixer"].export_telemetry
        await wait_ready(memory)
        await memory.ingest_run(example("run-42-api-fixer.json"))  # harness api-fixer: consented
        await memory.ingest_run(example("run-7-billing-bot.json"))  # another harness: not
    spans = [s for s in _exporter.get_finished_spans() if s.name == "memory.episode.record"]
    assert [dict(s.attributes or {})["memory.harness"] for s in spans] == ["api-fixer"]


# -- the gateway's MCP server spans -----------------------------------------------------------

GATEWAY_HARNESSES = ('[harness.api-fixer]\nharness = "claude-code"\nexport_telemetry = true\n'
                     '[harness.billing-bot]\nharness = "claude-code"\n')


async def _agent_session(url: str, token: str | None) -> None:
    """What an agent does on the gateway: initialize, tools/list, a recall, a briefing, the resource."""
    async with gateway_client(url, token) as client:
        await client.list_tools()
        assert not (await client.call_tool("recall", {"query": "flaky ledger"})).is_error
        await client.call_tool("briefing", {})
        if token is not None:
            await client.read_resource(BRIEFING_URI)


def _server_spans() -> list[Any]:
    return [s for s in _exporter.get_finished_spans() if s.kind == SpanKind.SERVER]


@pytest.mark.req18
@pytest.mark.parametrize("export_all", [False, True])
async def test_req18_the_gateways_mcp_server_spans_need_consent(
        make_holder: Callable[[str], ConfigHolder], export_all: bool) -> None:
    """The mcp SDK opens a SERVER span for every message the gateway handles (`tools/call recall`,
    `tools/list`, `initialize`, …). Exported only under consent: `[telemetry] export_all`, or the calling
    run's harness's `export_telemetry`; a harness without it, and an unattributed caller, export none."""
    extra = GATEWAY_HARNESSES + f"[telemetry]\nexport_all = {'true' if export_all else 'false'}\n"
    async with serving(make_holder(extra)) as (service, url):
        await service.ingest_run(example("run-42-api-fixer.json"))
        quiet, _ = await as_run(service, "billing-bot", "7", API)
        _exporter.clear()
        await _agent_session(url, quiet)  # a harness that did not consent
        await _agent_session(url, None)  # an unattributed caller
        unconsented = [s.name for s in _server_spans()]
        consenting, _ = await as_run(service, "api-fixer", "42", API)
        _exporter.clear()
        await _agent_session(url, consenting)
        consented = [s.name for s in _server_spans()]
    if export_all:
        assert "tools/call recall" in unconsented and "tools/list" in unconsented
    else:
        assert unconsented == []
    assert {"tools/list", "tools/call recall", "tools/call briefing", "resources/read"} <= set(consented)
    exported = json.dumps([dict(s.attributes or {}) for s in _exporter.get_finished_spans()])
    for text in ("flaky ledger", "TestLedgerReconcile", "<memory-data", "fix/flaky"):
        assert text not in exported  # ids, names and outcomes only: no query, no document


@pytest.mark.req18
@pytest.mark.parametrize("export_all", [False, True])
async def test_req18_the_provider_checks_spans_follow_telemetry_consent(make_holder, export_all: bool) -> None:  # type: ignore[no-untyped-def]
    """`memory provider check` opens its own MCP session (in-process for the built-in provider): its SDK
    spans (`tools/call memory_record_episode` of the synthetic episode, …) need consent too."""
    async with open_memory_service(make_holder(f"[telemetry]\nexport_all = {str(export_all).lower()}\n")) as memory:
        await wait_ready(memory)
        _exporter.clear()
        assert (await memory.check_provider())["ok"]
    names = [s.name for s in _exporter.get_finished_spans()]
    if export_all:
        assert "tools/call memory_record_episode" in names
    else:
        assert names == []
