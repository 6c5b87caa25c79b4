"""The MCP gateway over real streamable HTTP on 127.0.0.1 (REQ-12 tool, REQ-15, REQ-2's reserve)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx2
import mcp
import mcp.types as t
import pytest
import trio
import trio.lowlevel
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import memactors.view as view_module
from fix_daemon import daemon_in_process
from memactors.actors.spawn import prepare_spawn
from memactors.config import ConfigHolder
from memactors.gateway import BRIEFING_URI
from memactors.service import MemoryService
from support import RESIDENT, example, serving
from support_readside import API, as_run, calls, count, fault_toml, gateway_client
from support_runs import git, make_repo


async def seed(service: MemoryService) -> None:
    await service.ingest_run(example("run-42-api-fixer.json"))
    await service.add_fact(scope=f"project:{API}", text="ledger tests need a fixed clock", confidence=0.9)


def text_of(result: t.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, t.TextContent))


@pytest.mark.req15
async def test_req15_the_resource_matches_the_tool(served: tuple[MemoryService, str]) -> None:
    service, url = served
    await seed(service)
    token, _ = await as_run(service, "api-fixer", "100", API, branch="fix/flaky")
    async with gateway_client(url, token) as client:
        resource = await client.read_resource(BRIEFING_URI)
        [content] = resource.contents
        assert isinstance(content, t.TextResourceContents) and content.mime_type == "text/plain"
        tool = await client.call_tool("briefing", {})
        assert not tool.is_error
        assert text_of(tool) == content.text != ""
        assert tool.structured_content is None and text_of(tool).startswith('<memory-data kind="briefing"')
    surfaces = await service.store.read(lambda db: [r[0] for r in db.execute(
        "SELECT surface FROM exposures WHERE run_id = '100' ORDER BY id").fetchall()])
    assert surfaces == ["briefing_resource", "briefing_tool"]


@pytest.mark.req15
async def test_req15_a_resident_pulls_its_briefing(served: tuple[MemoryService, str]) -> None:
    service, url = served
    await seed(service)
    token, _ = await as_run(service, "api-fixer", "100", API, branch="fix/flaky")
    plan = await prepare_spawn(service, harness="api-fixer", run_id="100", workdir="/nonexistent",
                               base_argv=["claude"])
    assert plan.kind == "resident" and plan.argv == ("claude",) and not plan.composed  # nothing prepended
    async with gateway_client(url, token) as client:
        result = await client.call_tool("briefing", {})
    text = text_of(result)
    assert text.startswith('<memory-data kind="briefing"') and "ledger tests need a fixed clock" in text
    cached = await service.store.read(lambda db: db.execute(
        "SELECT document FROM briefings WHERE run_id = '100'").fetchone()[0])
    assert cached == text  # computed at spawn, served unchanged


@pytest.mark.req15
async def test_req15_unattributed_callers_get_not_attributed_and_no_episodes(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    await seed(service)
    for token in (None,):  # a forged token is refused with 401 before MCP (tests/gateway/test_gateway_auth.py)
        async with gateway_client(url, token) as client:
            result = await client.call_tool("briefing", {})
            assert result.is_error and text_of(result).startswith("not_attributed")
            with pytest.raises(MCPError, match="not_attributed"):
                await client.read_resource(BRIEFING_URI)
            recall = await client.call_tool("recall", {"query": "flaky ledger"})
            assert not recall.is_error
            assert recall.structured_content is None
            assert "[episode " not in text_of(recall) and "api-fixer" not in text_of(recall)
    assert await count(service, "SELECT count(*) FROM exposures") == 0


@pytest.mark.req12
async def test_req12_recall_over_the_gateway_is_the_fenced_wrapper_text_only(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    await seed(service)
    token, _ = await as_run(service, "api-fixer", "100", API)
    async with gateway_client(url, token) as client:
        listed = await client.list_tools()
        recall_tool = next(tool for tool in listed.tools if tool.name == "recall")
        assert recall_tool.input_schema["properties"]["query"]["maxLength"] == 512
        result = await client.call_tool("recall", {"query": "flaky ledger", "paths": ["internal/ledger"]})
        bad = await client.call_tool("recall", {"query": "q", "limit": 50})
    text = text_of(result)
    assert text.startswith('<memory-data kind="recall"')
    # The agent receives the SPEC-0027 document and nothing else: no second, unfenced JSON form.
    assert result.structured_content is None and len(result.content) == 1
    nonce = re.match(r'<memory-data kind="recall" nonce="([0-9a-f]{16})"', text).group(1)  # type: ignore[union-attr]
    assert text.endswith(f'</memory-data nonce="{nonce}">')
    assert text.count("\n<item") == text.count(f'</item nonce="{nonce}">') == 2  # fact, episode
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## facts", "## episodes", "## recent_runs"]
    assert bad.is_error and text_of(bad).startswith("invalid_argument")
    rows = await service.store.read(lambda db: db.execute(
        "SELECT surface, call_id FROM exposures WHERE run_id = '100'").fetchall())
    assert [r[0] for r in rows] == ["recall"] and rows[0][1] is not None


@pytest.mark.req2
async def test_req2_call_tool_cannot_reach_the_provider(
        tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    async with serving(make_holder(fault_toml(tmp_path))) as (service, url):
        await service.ingest_run(example("run-42-api-fixer.json"))
        token, _ = await as_run(service, "api-fixer", "100", API)
        sent_before = len(calls(tmp_path))
        async with gateway_client(url, token) as client:
            assert sorted(tool.name for tool in (await client.list_tools()).tools) == ["briefing", "recall"]
            for name in ("zep__memory_forget", "fault__memory_forget", "memory_forget", "memory_record_episode"):
                result = await client.call_tool(name, {"id": "ep_x"})
                assert result.is_error and text_of(result).startswith("not_permitted")
        assert [c["tool"] for c in calls(tmp_path)[sent_before:]] == []  # the upstream received nothing
        await service.call_log.flush()  # written in batches, off the request path
        denied = await service.store.read(lambda db: db.execute(
            "SELECT caller, server, tool FROM call_log WHERE outcome = 'denied' ORDER BY id").fetchall())
        assert denied == [("api-fixer/100", "zep", "zep__memory_forget"),
                          ("api-fixer/100", "fault", "fault__memory_forget"),
                          ("api-fixer/100", "fault", "memory_forget"),
                          ("api-fixer/100", "fault", "memory_record_episode")]


async def test_the_daemon_serves_the_gateway_and_reports_its_url(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path, RESIDENT) as (_, listening):
        assert listening.gateway.startswith("http://127.0.0.1:") and listening.gateway.endswith("/mcp")
        async with gateway_client(listening.gateway, None) as client:
            assert sorted(tool.name for tool in (await client.list_tools()).tools) == ["briefing", "recall"]
            resources = await client.list_resources()
            assert [str(r.uri) for r in resources.resources] == [BRIEFING_URI]


@pytest.mark.req12
async def test_req12_recall_refuses_an_unknown_argument_naming_it(served: tuple[MemoryService, str]) -> None:
    service, url = served
    token, _ = await as_run(service, "api-fixer", "100", API)
    async with gateway_client(url, token) as client:
        result = await client.call_tool("recall", {"query": "ledger", "scope": "project:forge.example/acme/billing"})
        briefing = await client.call_tool("briefing", {"everything": True})
    assert result.is_error and text_of(result).startswith("invalid_argument") and "'scope'" in text_of(result)
    assert briefing.is_error and "'everything'" in text_of(briefing)
    assert await count(service, "SELECT count(*) FROM exposures") == 0


class _Recording(httpx2.AsyncBaseTransport):
    """An HTTP transport that keeps every response body exactly as it came over the socket."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        bodies, inner = self.bodies, response.stream

        class Stream(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                body = bytearray()
                async for chunk in inner:  # type: ignore[union-attr]
                    body += chunk
                    yield chunk
                bodies.append(bytes(body))

            async def aclose(self) -> None:
                await inner.aclose()  # type: ignore[union-attr]

        return httpx2.Response(response.status_code, headers=response.headers, stream=Stream(),
                               extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.mark.req12
async def test_req12_the_whole_recall_response_on_the_wire_is_at_most_16_kib(
        served: tuple[MemoryService, str]) -> None:
    """Facts full of quotes and line breaks (each escaped to two bytes in JSON) far over the cap: the
    HTTP body carrying the tool result — envelope, escaping and all — stays within 16 KiB."""
    service, url = served
    await seed(service)
    for n in range(20):
        text = f'ledger fact {n}: ' + '"quoted" \\ path\n' * 60
        await service.add_fact(scope=f"project:{API}", text=text, confidence=0.5)
    token, _ = await as_run(service, "api-fixer", "100", API)
    recording = _Recording()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=None,
                                  transport=recording) as http, \
            mcp.Client(streamable_http_client(url, http_client=http)) as client:
        before = len(recording.bodies)
        result = await client.call_tool("recall", {"query": "ledger", "limit": 20})
        await trio.lowlevel.checkpoint()
    text = text_of(result)
    assert 'truncated="' in text.splitlines()[0]  # the cap did bite
    [body] = [b for b in recording.bodies[before:] if b'"content"' in b]
    assert len(body) <= 16384, len(body)
    assert len(body) > 12000  # and the document was cut near the cap, not far below it


@pytest.mark.req18
async def test_req18_provider_calls_serving_a_runs_recall_are_the_daemons_own_call_log_rows(
        tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    async with serving(make_holder(fault_toml(tmp_path))) as (service, url):
        await service.ingest_run(example("run-42-api-fixer.json"))
        token, _ = await as_run(service, "api-fixer", "100", API)
        async with gateway_client(url, token) as client:
            assert not (await client.call_tool("recall", {"query": "flaky ledger"})).is_error
        await service.call_log.flush()  # rows are written in batches off the request path
        rows = await service.store.read(lambda db: db.execute(
            "SELECT DISTINCT caller FROM call_log WHERE tool = 'memory_recall'").fetchall())
        assert rows == [("daemon",)]


@pytest.mark.req2
async def test_req2_a_provider_tool_is_refused_as_provider_reserved(served: tuple[MemoryService, str]) -> None:
    from memactors.errors import ProviderReserved

    service, url = served
    token, _ = await as_run(service, "api-fixer", "100", API)
    async with gateway_client(url, token) as client:
        reserved = await client.call_tool("memory_forget", {"id": "ep_x"})
        other = await client.call_tool("shell__exec", {})
    assert reserved.is_error and text_of(reserved).startswith(f"{ProviderReserved.mcp_code}: ")
    assert "reserved to the daemon" in text_of(reserved) and "provider=builtin" in text_of(reserved)
    assert other.is_error and text_of(other).startswith("not_permitted: ") and "shell__exec" in text_of(other)


async def test_a_run_token_before_its_first_session_reads_the_checkouts_branch_without_starting_git(
        served: tuple[MemoryService, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token whose run has no recorded place yet resolves to its workdir's repository and branch on every
    request: the branch is read from the checkout's HEAD (a linked worktree's too), as `git symbolic-ref`
    says it, a new checkout seen at the next request, a detached HEAD no branch - without a git process."""
    service, _ = served
    started: list[str] = []
    real = view_module._git_branch_sync
    monkeypatch.setattr(view_module, "_git_branch_sync", lambda d: started.append(d) or real(d))
    checkout = make_repo(tmp_path / "api")

    async def branch_of(workdir: Path, run_id: str) -> str | None:
        _, view = await as_run(service, "api-fixer", run_id, None, workdir=str(workdir))
        assert view.repo == API
        return view.branch

    assert await branch_of(checkout, "1") == "main" == git(checkout, "symbolic-ref", "--short", "HEAD").strip()
    git(checkout, "checkout", "-q", "-b", "fix/flaky")
    assert await branch_of(checkout, "2") == "fix/flaky"
    git(checkout, "worktree", "add", "-q", "-b", "docs/wt", str(tmp_path / "linked"))
    assert await branch_of(tmp_path / "linked", "3") == "docs/wt"
    (checkout / "docs").mkdir()
    assert await branch_of(checkout / "docs", "4") == "fix/flaky"  # a workdir below the top
    git(checkout, "checkout", "-q", "--detach")
    assert await branch_of(checkout, "5") is None  # no branch, and no run of this harness recorded one
    assert started == []
