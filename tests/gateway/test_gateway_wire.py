"""The gateway's wire over real streamable HTTP on 127.0.0.1, as the two kinds of client speak it:
the handshake era (initialize, ``Mcp-Session-Id``; what Claude Code speaks) and the 2026-07-28
single-exchange POST (what ``mcp.Client`` speaks). Answers are JSON bodies, not SSE streams
(``json_response``: the gateway's handlers send no notifications), with the SDK's session handling."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from memactors.service import MemoryService
from support_readside import API, as_run, gateway_client

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
LEGACY = "2025-06-18"
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}


def rpc(id_: int | None, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id_ is not None:
        message["id"] = id_
    if params is not None:
        message["params"] = params
    return message


async def test_the_handshake_era_session_is_answered_in_json_with_its_session_id(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    token, _ = await as_run(service, "api-fixer", "r-wire", API)
    auth = {"authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(timeout=None, headers={**HEADERS, **auth}) as http:
        opened = await http.post(url, json=rpc(1, "initialize", {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}))
        assert opened.status_code == 200
        assert opened.headers["content-type"].startswith("application/json")
        session = opened.headers["mcp-session-id"]
        assert opened.json()["result"]["protocolVersion"] == LEGACY
        in_session = {"mcp-session-id": session, "mcp-protocol-version": LEGACY}
        acked = await http.post(url, json=rpc(None, "notifications/initialized"), headers=in_session)
        assert acked.status_code == 202
        listed = await http.post(url, json=rpc(2, "tools/list"), headers=in_session)
        assert listed.headers["content-type"].startswith("application/json")
        assert [tool["name"] for tool in listed.json()["result"]["tools"]] == ["recall", "briefing"]
        called = await http.post(url, json=rpc(3, "tools/call", {"name": "recall", "arguments": {"query": "ledger"}}),
                                 headers=in_session)
        assert called.status_code == 200 and called.headers["content-type"].startswith("application/json")
        body = called.json()
        assert body["id"] == 3 and body["result"]["isError"] is False
        assert body["result"]["content"][0]["text"].startswith("<memory-data kind=\"recall\"")
        refused = await http.post(url, json=rpc(4, "tools/call", {"name": "memory_forget", "arguments": {}}),
                                  headers=in_session)
        assert refused.json()["result"]["isError"] is True
        assert "not_permitted" in refused.json()["result"]["content"][0]["text"]
        unknown = await http.post(url, json=rpc(5, "tools/list"),
                                  headers={"mcp-session-id": "not-a-session", "mcp-protocol-version": LEGACY})
        assert unknown.status_code == 404
        closed = await http.delete(url, headers=in_session)
        assert closed.status_code == 200
        gone = await http.post(url, json=rpc(6, "tools/list"), headers=in_session)
        assert gone.status_code == 404


async def test_a_single_exchange_post_is_answered_in_json_without_a_session(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    token, _ = await as_run(service, "api-fixer", "r-modern", API)
    headers = {**HEADERS, "authorization": f"Bearer {token}", "mcp-protocol-version": MODERN,
               "mcp-method": "tools/call", "mcp-name": "recall"}
    async with httpx2.AsyncClient(timeout=None) as http:
        called = await http.post(url, headers=headers, json=rpc(7, "tools/call", {
            "name": "recall", "arguments": {"query": "ledger", "limit": 3}, "_meta": META}))
        bad = await http.post(url, headers=headers, json=rpc(8, "tools/call", {
            "name": "recall", "arguments": {"query": "ledger", "colour": "red"}, "_meta": META}))
    assert called.status_code == 200 and called.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in called.headers
    body = json.loads(called.content)
    assert body["jsonrpc"] == "2.0" and body["id"] == 7
    assert body["result"]["isError"] is False and body["result"]["resultType"] == "complete"
    assert bad.json()["result"]["isError"] is True
    assert "colour" in bad.json()["result"]["content"][0]["text"]  # the unknown argument, by name


async def test_mcp_client_and_the_raw_handshake_get_the_same_recall_document(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    token, _ = await as_run(service, "api-fixer", "r-same", API)
    async with gateway_client(url, token) as client:
        assert client.protocol_version == MODERN
        via_client = await client.call_tool("recall", {"query": "ledger"})
    async with httpx2.AsyncClient(timeout=None, headers={**HEADERS, "authorization": f"Bearer {token}"}) as http:
        opened = await http.post(url, json=rpc(1, "initialize", {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}))
        in_session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
        raw = (await http.post(url, json=rpc(2, "tools/call", {"name": "recall", "arguments": {"query": "ledger"}}),
                               headers=in_session)).json()["result"]
    strip = lambda text: text.split("nonce=")[0]  # noqa: E731 -- each document has its own nonce
    assert [strip(c.text) for c in via_client.content] == [strip(c["text"]) for c in raw["content"]]
    assert via_client.is_error is False and raw["isError"] is False


async def test_a_session_answers_only_the_run_token_that_opened_it(served: tuple[MemoryService, str]) -> None:
    """Another run's token with a session's Mcp-Session-Id was served in that session. The
    session is bound to the token that opened it: any other token is answered 404, as for a session that
    does not exist (MCP streamable HTTP), and the session goes on serving its own token."""
    service, url = served
    mine, _ = await as_run(service, "api-fixer", "r-owner", API)
    other, _ = await as_run(service, "api-fixer", "r-intruder", API)
    async with httpx2.AsyncClient(timeout=None, headers=HEADERS) as http:
        opened = await http.post(url, headers={"authorization": f"Bearer {mine}"}, json=rpc(1, "initialize", {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}))
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
        acked = await http.post(url, json=rpc(None, "notifications/initialized"),
                                headers={**session, "authorization": f"Bearer {mine}"})
        assert acked.status_code == 202
        call = rpc(2, "tools/call", {"name": "recall", "arguments": {"query": "ledger"}})
        stolen = await http.post(url, json=call, headers={**session, "authorization": f"Bearer {other}"})
        assert stolen.status_code == 404, stolen.text
        assert "result" not in stolen.json()
        ended = await http.delete(url, headers={**session, "authorization": f"Bearer {other}"})
        assert ended.status_code == 404  # nor may it end the session
        anonymous = await http.post(url, json=call, headers=session)  # no token: served statelessly, no session
        assert anonymous.headers.get("mcp-session-id") is None
        own = await http.post(url, json=call, headers={**session, "authorization": f"Bearer {mine}"})
        assert own.status_code == 200 and own.json()["result"]["isError"] is False
