"""Gateway authentication over real streamable HTTP on 127.0.0.1: a bearer token that is not a live run
token is refused with HTTP 401; no Authorization header stays unattributed (SPEC-0030)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import httpx2
import mcp.types as t
import pytest
from loguru import logger
from mcp.shared.exceptions import MCPError

from memactors.config import ConfigHolder
from memactors.service import MemoryService
from support import serving
from support_readside import API, as_run, gateway_client

RESIDENT = '[harness.api-fixer]\nharness = "claude-code"\nmemory_briefing = true\n'
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class Clock:
    """A wall clock the test moves (token expiry is wall time)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def served(make_holder: Callable[[str], ConfigHolder], clock: Clock
                 ) -> AsyncIterator[tuple[MemoryService, str]]:
    async with serving(make_holder(RESIDENT), wall_clock=clock) as answer:
        yield answer


def leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in leaves(e)]
    return [group]


async def post_initialize(url: str, authorization: str | None) -> httpx2.Response:
    headers = dict(HEADERS, **({"authorization": authorization} if authorization is not None else {}))
    async with httpx2.AsyncClient(timeout=None) as http:
        return await http.post(url, json=INIT, headers=headers)


@pytest.mark.parametrize("authorization", [
    "Bearer not-a-run-token", "Basic dXNlcjpwYXNz", "Bearer"])
async def test_a_bearer_token_that_is_not_a_live_run_token_is_refused_401_with_a_message(
        served: tuple[MemoryService, str], authorization: str) -> None:
    _, url = served
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(f"{m.record['message']} {m.record['extra']}"), level="WARNING")
    try:
        response = await post_initialize(url, authorization)
    finally:
        logger.remove(sink)
    assert response.status_code == 401
    body = response.json()
    assert body["error"] == "invalid_token"
    assert "run token" in body["message"]
    assert response.headers["www-authenticate"].startswith("Bearer")
    [line] = [ln for ln in lines if "gateway refused" in ln]
    assert "not-a-run-token" not in line and "dXNlcjpwYXNz" not in line  # the log names no token
    assert "401" in line


async def test_the_mcp_client_with_a_wrong_token_fails_to_connect_instead_of_running_unattributed(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    logged = "SELECT count(*) FROM call_log WHERE tool = 'recall'"
    before = await service.store.read(lambda db: db.execute(logged).fetchone()[0])
    reached = False
    with pytest.raises(BaseExceptionGroup) as caught:
        async with gateway_client(url, "not-a-run-token") as client:
            reached = True
            await client.call_tool("recall", {"query": "ledger"})
    assert not reached  # the session never initialised, so no tool ran as "unattributed"
    assert [type(e) for e in leaves(caught.value)] == [MCPError]
    assert await service.store.read(lambda db: db.execute(logged).fetchone()[0]) == before


async def test_an_expired_or_revoked_run_token_is_refused_like_an_unknown_one(
        served: tuple[MemoryService, str], clock: Clock) -> None:
    service, url = served
    minted = await service.mint_run_token(harness="api-fixer", run_id="r-ttl", ttl_seconds=600)
    assert minted["expires_at"] == "2026-11-30T12:10:00.000000Z"
    assert (await post_initialize(url, f"Bearer {minted['token']}")).status_code == 200
    clock.now += timedelta(seconds=600)
    assert (await post_initialize(url, f"Bearer {minted['token']}")).status_code == 401
    revoked, _ = await as_run(service, "api-fixer", "r-gone", None)
    await service.store.write(lambda db: db.execute("DELETE FROM run_callers WHERE run_id = 'r-gone'"))
    assert (await post_initialize(url, f"Bearer {revoked}")).status_code == 401


async def test_no_authorization_header_stays_unattributed(served: tuple[MemoryService, str]) -> None:
    _, url = served
    assert (await post_initialize(url, None)).status_code == 200
    async with gateway_client(url, None) as client:
        result = await client.call_tool("briefing", {})
    assert result.is_error and "not_attributed" in "".join(
        c.text for c in result.content if isinstance(c, t.TextContent))


async def test_a_live_token_reaches_the_tools_as_its_run(served: tuple[MemoryService, str]) -> None:
    service, url = served
    token, _ = await as_run(service, "api-fixer", "r-live", API, branch="fix/flaky")
    async with gateway_client(url, token) as client:
        result = await client.call_tool("briefing", {})
    assert not result.is_error
    cached = await service.store.read(lambda db: db.execute(
        "SELECT count(*) FROM briefings WHERE run_id = 'r-live' AND harness = 'api-fixer'").fetchone()[0])
    assert cached == 1  # attributed to its run through the caller the gate resolved


async def test_a_tools_call_resolves_its_token_and_the_runs_place_once(
        served: tuple[MemoryService, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate reads the token and the run's place in one hop and hands the view to the handler: one
    ``caller_view`` per HTTP request, none again in the handler (a read hop per request less)."""
    service, url = served
    token, view = await as_run(service, "api-fixer", "r-once", API)
    calls: list[str] = []
    real_view = service.caller_view

    async def counted_view(*args: object, **kwargs: object) -> object:
        calls.append("caller_view")
        return await real_view(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service, "caller_view", counted_view)
    async with gateway_client(url, token) as client:
        await client.call_tool("recall", {"query": "ledger"})  # the first call may also list the tools
        calls.clear()
        result = await client.call_tool("recall", {"query": "ledger"})
    assert not result.is_error
    assert calls == ["caller_view"]
    assert view.repo == API
