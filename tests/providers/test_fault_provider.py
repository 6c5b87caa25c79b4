"""The fault-injection provider, exercised through its real stdio subprocess (memactors.testing)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from fix_providers import poll
from memactors.conformance import synthetic_episode
from memactors.contract import TOOLS, check_request, split_items, tool_result_payload, validate_response
from memactors.testing import fault_provider_params
from memactors.testing.fault_provider import EXTRA_IDS, SPOOF_CLAIM
from support import within

pytestmark = [pytest.mark.req3, pytest.mark.slow]

SCOPE_A = "project:forge.example/acme/api"
SCOPE_B = "project:forge.example/acme/billing"


def _record_request(nonce: str, scope: str, text: str) -> dict[str, Any]:
    episode, _ = synthetic_episode(nonce)
    episode["scope"] = scope
    request = {
        "episode_id": episode["episode_id"],
        "scope": scope,
        "trust_class": "standard",
        "episode": episode,
        "text": text,
    }
    check_request("memory_record_episode", request)
    return request


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    with trio.fail_after(60):
        result = await client.call_tool(tool, arguments)
    return validate_response(tool, tool_result_payload(result, provider="fault", tool=tool), provider="fault")


def _calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_normal_mode_records_recalls_by_scope_and_forgets(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    async with Client(fault_provider_params(state_file=state)) as client:
        tools = (await client.list_tools()).tools
        assert [tool.name for tool in tools] == list(TOOLS)
        contract = await _call(client, "memory_contract", {})
        assert contract == {"contract": 1, "provider": {"name": "fault", "version": "1"}}

        first = _record_request("one", SCOPE_A, "fixed the Flaky login test")
        second = _record_request("two", SCOPE_B, "billing flaky invoice")
        assert await _call(client, "memory_record_episode", first) == {"ids": [first["episode_id"]]}
        await _call(client, "memory_record_episode", second)
        assert set(json.loads(state.read_text())["items"]) == {first["episode_id"], second["episode_id"]}

        recalled = await _call(client, "memory_recall", {"query": "FLAKY", "scope": [SCOPE_A], "limit": 5})
        items, invalid = split_items(recalled)
        assert [item.id for item in items] == [first["episode_id"]] and invalid == 0
        assert items[0].text == "fixed the Flaky login test"

        none = await _call(
            client, "memory_recall", {"query": "unrelated", "scope": [SCOPE_A, SCOPE_B], "limit": 5}
        )
        assert none == {"items": []}

        assert await _call(client, "memory_forget", {"id": first["episode_id"]}) == {"forgotten": True}
        assert await _call(client, "memory_forget", {"id": first["episode_id"]}) == {"forgotten": False}
        again = await _call(client, "memory_recall", {"query": "flaky", "scope": [SCOPE_A], "limit": 5})
        assert again == {"items": []}
    assert set(json.loads(state.read_text())["items"]) == {second["episode_id"]}


async def test_contract_v2_answers_version_2() -> None:
    async with Client(fault_provider_params("contract_v2")) as client:
        assert (await _call(client, "memory_contract", {}))["contract"] == 2


async def test_omit_contract_lists_no_memory_contract_tool() -> None:
    async with Client(fault_provider_params("omit_contract")) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
    assert "memory_contract" not in names and "memory_recall" in names


async def test_hang_mode_call_returns_control_under_a_deadline_and_the_session_stays_usable(
        trio_clock: trio.testing.MockClock) -> None:
    async with Client(fault_provider_params("hang")) as client:
        async def hung_call() -> trio.CancelScope:
            with trio.move_on_after(0.5) as scope:
                await client.call_tool("memory_recall", {"query": "q", "scope": [SCOPE_A], "limit": 1})
            return scope

        scope, _ = await within(trio_clock, 0.5, hung_call)  # control is back at the deadline, not later
        assert scope.cancelled_caught
        assert (await _call(client, "memory_contract", {}))["contract"] == 1


async def test_exit_mid_call_kills_the_process_and_the_call_fails(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    async with Client(fault_provider_params("exit_mid_call", calls_file=calls)) as client:
        await _call(client, "memory_contract", {})  # memory_contract still answers
        with trio.fail_after(60), pytest.raises(Exception) as info:  # noqa: B017 - any transport error
            await client.call_tool("memory_forget", {"id": "x"})
        assert "Connection closed" in str(info.value)
        # the provider logged the call before dying, and no process answers any more
        assert [c["tool"] for c in _calls(calls)] == ["memory_contract", "memory_forget"]
        with trio.fail_after(60), pytest.raises(Exception):  # noqa: B017
            await client.call_tool("memory_contract", {})


async def test_exit_on_record_leaves_no_process_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "calls.jsonl"
    params = fault_provider_params("exit_on_record", calls_file=pid_file)
    async with Client(params) as client:
        await _call(client, "memory_recall", {"query": "q", "scope": [SCOPE_A], "limit": 1})
        with trio.fail_after(60), pytest.raises(Exception):  # noqa: B017
            await client.call_tool("memory_record_episode", _record_request("n", SCOPE_A, "t"))
    assert [c["tool"] for c in _calls(pid_file)] == ["memory_recall", "memory_record_episode"]


async def test_the_subprocess_exits_when_its_stdin_closes_even_with_a_call_hanging(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    params = fault_provider_params("hang", calls_file=calls)
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    hang = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "memory_forget", "arguments": {"id": "x"}},
    }
    proc = await trio.lowlevel.open_process(
        [params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        for message in (init, initialized, hang):
            await proc.stdin.send_all((json.dumps(message) + "\n").encode())
        with trio.fail_after(60):
            first = await proc.stdout.receive_some()
        assert b'"id":1' in first
        # the provider logs a call just before it hangs: wait for that state, not for a guessed time
        await poll(lambda: calls.exists() and '"memory_forget"' in calls.read_text(), what="the call hanging")
        await proc.stdin.aclose()
        with trio.fail_after(60):
            code = await proc.wait()
        assert code == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.aclose()


async def test_calls_file_records_each_call_with_its_arguments(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    async with Client(fault_provider_params(calls_file=calls)) as client:
        await _call(client, "memory_contract", {})
        await _call(client, "memory_forget", {"id": "ep_0000"})
    assert _calls(calls) == [
        {"tool": "memory_contract", "arguments": {}},
        {"tool": "memory_forget", "arguments": {"id": "ep_0000"}},
    ]


async def test_lying_modes_return_what_they_promise() -> None:
    modes = ("other_scope", "extra_ids", "spoof_text", "invalid_items", "ignore_forget")
    async with Client(fault_provider_params(*modes)) as client:
        request = _record_request("n", SCOPE_B, "deploy notes")
        await _call(client, "memory_record_episode", request)
        payload = await _call(client, "memory_recall", {"query": "deploy", "scope": [SCOPE_A], "limit": 5})
        ids = [item["id"] for item in payload["items"]]
        assert ids[:3] == [request["episode_id"], *EXTRA_IDS]  # other scope's item, then foreign ids
        assert payload["items"][0]["text"].startswith(SPOOF_CLAIM)
        kept, invalid = split_items(payload)
        assert invalid == 3 and len(kept) == 3
        assert await _call(client, "memory_forget", {"id": request["episode_id"]}) == {"forgotten": True}
        again = await _call(client, "memory_recall", {"query": "deploy", "scope": [SCOPE_B], "limit": 5})
        assert request["episode_id"] in [item["id"] for item in again["items"]]


async def test_text_only_mode_sends_nan_as_json_text() -> None:
    async with Client(fault_provider_params("text_only", "invalid_items")) as client:
        result = await client.call_tool("memory_recall", {"query": "q", "scope": [SCOPE_A], "limit": 1})
    assert result.structured_content is None and len(result.content) == 1
    payload = tool_result_payload(result, provider="fault", tool="memory_recall")
    assert math.isnan(payload["items"][2]["score"])


async def test_whole_invalid_and_error_modes() -> None:
    async with Client(fault_provider_params("whole_invalid")) as client:
        result = await client.call_tool("memory_recall", {"query": "q", "scope": [SCOPE_A], "limit": 1})
        assert result.structured_content == {"things": 1}
    async with Client(fault_provider_params("error")) as client:
        result = await client.call_tool("memory_contract", {})
        assert result.is_error


async def test_slow_mode_waits_the_delay() -> None:
    async with Client(fault_provider_params("slow", delay=0.4)) as client:
        started = trio.current_time()
        await _call(client, "memory_contract", {})
        assert trio.current_time() - started >= 0.4


async def test_control_file_switches_modes_at_runtime(tmp_path: Path) -> None:
    control = tmp_path / "control"
    async with Client(fault_provider_params(control_file=control)) as client:
        control.write_text("hang_recall")
        with trio.move_on_after(0.5) as scope:
            await client.call_tool("memory_recall", {"query": "q", "scope": [SCOPE_A], "limit": 1})
        assert scope.cancelled_caught
        control.write_text("")  # the provider comes back
        assert await _call(client, "memory_recall", {"query": "q", "scope": [SCOPE_A], "limit": 1}) == {
            "items": []
        }


def test_unknown_modes_are_refused_before_spawning() -> None:
    with pytest.raises(ValueError, match="unknown fault modes"):
        fault_provider_params("explode")


async def test_modes_from_the_environment(tmp_path: Path) -> None:
    params = fault_provider_params()
    params.env = {"MEMACTORS_FAULT_MODES": "contract_v2,omit_forget"}
    async with Client(params) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert (await _call(client, "memory_contract", {}))["contract"] == 2
    assert "memory_forget" not in names
