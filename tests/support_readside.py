"""Helpers for the read-side tests (recall, briefings, gateway, spawn): the fault provider as a real
subprocess configured through `[mcp.fault]`, run views through real run tokens, metric reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import mcp
from mcp.client.streamable_http import streamable_http_client

from fix_providers import FaultFiles
from fix_providers import fault_toml as providers_fault_toml
from memactors.service import MemoryService
from memactors.view import View

API = "forge.example/acme/api"
BILLING = "forge.example/acme/billing"
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def fixed_clock() -> datetime:
    return NOW


def fault_toml(tmp_path: Path, *modes: str, timeout: str = "2s", pidfile: Path | None = None,
               control: bool = True) -> str:
    """`[memory] provider = "fault"` over the fault provider as a real stdio subprocess, as the read-side
    tests want it (fix_providers.fault_toml with these defaults): its calls in tmp_path/"calls.jsonl", its
    items in memory, summaries off, a provider timeout of 2 s.

    With `control`, the file tmp_path/"control" replaces the modes while it exists (write it to make a
    running provider misbehave). With `pidfile`, the subprocess writes its pid there first, so a test can
    SIGKILL or SIGSTOP it.
    """
    return providers_fault_toml(FaultFiles(tmp_path), *modes, provider_timeout=timeout,
                                extra_episodes="summary = false\n", state=False, control=control,
                                pid=pidfile or False)


def calls(tmp_path: Path, tool: str | None = None) -> list[dict[str, Any]]:
    path = tmp_path / "calls.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if tool is None or r["tool"] == tool]


def sample(service: MemoryService, name: str, **labels: str) -> float:
    value = service.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def as_run(service: MemoryService, harness: str, run_id: str, repo: str | None, branch: str | None = "main",
                 paths: tuple[str, ...] = (), workdir: str = "") -> tuple[str, View]:
    """A run token for (harness, run) and its view; with `repo`, the run reports live presence there."""
    if repo is not None:
        await service.report_presence(harness=harness, run_id=run_id, session_id=f"s-{run_id}", repo=repo,
                                      branch=branch, paths=paths, ttl_seconds=86400 * 365)
    token = (await service.mint_run_token(harness=harness, run_id=run_id, workdir=workdir))["token"]
    return token, await service.caller_view(token)


def fenced_only(document: str, needle: str) -> bool:
    """True when every occurrence of `needle` in a wrapper document lies inside an item fence.

    Read as docs/wrapper.md says: a fence opens on the `<item…>` line after a provenance line and ends
    only at `</item nonce="N">` with the header's nonce N."""
    nonce = document.split('nonce="', 1)[1].split('"', 1)[0]
    closing = f'</item nonce="{nonce}">'
    inside = False
    previous = ""
    for line in document.splitlines():
        if not inside and line.startswith("<item") and previous.startswith("- "):
            inside = True
        elif inside and line == closing:
            inside = False
        elif needle in line and not inside:
            return False
        previous = line
    return True


async def count(service: MemoryService, sql: str, *params: Any) -> int:
    return int(await service.store.read(lambda db: db.execute(sql, list(params)).fetchone()[0]))


@asynccontextmanager
async def gateway_client(url: str, token: str | None) -> AsyncIterator[mcp.Client]:
    """An MCP client over real streamable HTTP, presenting `token` as its run's bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=None) as http, \
            mcp.Client(streamable_http_client(url, http_client=http)) as client:
        yield client
