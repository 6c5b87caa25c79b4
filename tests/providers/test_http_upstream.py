"""An [mcp.<name>] upstream over streamable HTTP (`url` + `headers`): the built-in provider served by
hypercorn on loopback, behind a bearer check, stands in for a remote memory service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from memactors.builtin import BuiltinProvider
from memactors.gateway import serve_mcp_http
from memactors.service import open_memory_service
from memactors.store.engines import open_store
from support import example, wait_ready

TOKEN = "s3cret-upstream-token"


def _require_bearer(app: Any, seen: list[str]) -> Any:
    """ASGI middleware: 401 unless the request carries our bearer token (proves `headers` are sent)."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
            seen.append(auth)
            if auth != f"Bearer {TOKEN}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


def _upstream(url: str, token: str) -> str:
    return (f'[memory]\nprovider = "remote"\n[mcp.remote]\nurl = "{url}"\n'
            f'headers = {{ Authorization = "Bearer {token}" }}\n')


@pytest.mark.req1
async def test_an_http_upstream_with_headers_records_and_recalls(tmp_path: Path, make_holder) -> None:  # type: ignore[no-untyped-def]
    remote = await open_store(tmp_path / "remote.db")
    seen: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            app = BuiltinProvider(remote).server().streamable_http_app(host="127.0.0.1")
            url = await nursery.start(serve_mcp_http, _require_bearer(app, seen), "127.0.0.1", 0)
            async with open_memory_service(make_holder(_upstream(url, TOKEN))) as memory:
                await wait_ready(memory)
                result = await memory.ingest_run(example("run-42-api-fixer.json"))
                assert result["outcome"] == "recorded"
                hit = await memory.recall(query="flaky ledger", repo="forge.example/acme/api")
                assert [i["episode_id"] for i in hit["episodes"]] == [result["episode_id"]]
                status = await memory.status()
                assert status["transport"] == "http" and status["state"] == "ready"
                note = {r["name"]: r for r in (await memory.doctor())["rows"]}["memory privacy"]
                assert "127.0.0.1" in note["message"] and "leave this host" in note["message"]
            nursery.cancel_scope.cancel()
    finally:
        remote.close()
    assert seen and all(s == f"Bearer {TOKEN}" for s in seen)
    stored = await trio.to_thread.run_sync(lambda: _episode_ids(tmp_path / "remote.db"))
    assert stored == [result["episode_id"]]


async def test_a_refused_http_upstream_is_down_not_fatal(tmp_path: Path, make_holder) -> None:  # type: ignore[no-untyped-def]
    remote = await open_store(tmp_path / "remote.db")
    try:
        async with trio.open_nursery() as nursery:
            app = BuiltinProvider(remote).server().streamable_http_app(host="127.0.0.1")
            url = await nursery.start(serve_mcp_http, _require_bearer(app, []), "127.0.0.1", 0)
            async with open_memory_service(make_holder(_upstream(url, "wrong"))) as memory:
                with trio.fail_after(60):
                    while (await memory.status())["last_error"] is None:  # noqa: ASYNC110 -- polls the actor
                        await trio.sleep(0.05)
                assert (await memory.status())["state"] != "ready"
                result = await memory.ingest_run(example("run-42-api-fixer.json"))
                assert result["outcome"] == "queued"  # nothing lost: it waits in the pending queue
                degraded = await memory.recall(query="ledger", repo="forge.example/acme/api")
                assert degraded["degraded"] == "provider_unavailable"
            nursery.cancel_scope.cancel()
    finally:
        remote.close()


def _episode_ids(path: Path) -> list[str]:
    import sqlean

    conn = sqlean.connect(str(path))
    try:
        return [r[0] for r in conn.execute("SELECT episode_id FROM builtin_docs")]
    finally:
        conn.close()
