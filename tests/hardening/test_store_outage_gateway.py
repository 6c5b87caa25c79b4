"""An outage degrades instead of erroring: PostgreSQL stopped under a running daemon (a real
server, memactors.testing.postgres), and a run-token holder calling every gateway tool and resource over
real MCP. REQ-13: each answer is degraded ``store_unavailable`` (never an HTTP 500 with an empty body),
and the daemon's log names the store (host, port, database; never the password).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from fix_daemon import start_daemon
from memactors.rpc.client import connect_rpc
from memactors.testing.postgres import Cluster
from support import example, write_config
from support_hardening import INIT, LEGACY, Http, rpc_message
from support_readside import gateway_client

pytestmark = [pytest.mark.slow]

SERVICE = "harness.v1.MemoryService"
API = "forge.example/acme/api"


async def test_a_postgresql_outage_answers_a_run_token_holder_degraded_on_every_tool_and_resource(
        tmp_path: Path) -> None:
    cluster = Cluster()
    try:
        url = cluster.create_database("memory")
        config = write_config(tmp_path, '[memory.episodes]\nprovider_timeout = "1s"\nsummary = false\n',
                              store_url=url)
        daemon = await trio.to_thread.run_sync(lambda: start_daemon(tmp_path, config=config))
        try:
            async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
                await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})
                await rpc.call(f"{SERVICE}/ReportPresence", {"harness": "api-fixer", "run_id": "r-out",
                                                             "session_id": "s-out", "repo": API, "branch": "main"})
                token = str((await rpc.call(f"{SERVICE}/MintRunToken",
                                            {"harness": "api-fixer", "run_id": "r-out"}))["token"])
            gateway = daemon.info["gateway"]
            async with gateway_client(gateway, token) as before:  # served while the store is up
                result = await before.call_tool("recall", {"query": "flaky ledger"})
                assert result.is_error is False and "ep_" in result.content[0].text

            await trio.to_thread.run_sync(cluster.stop)
            with trio.fail_after(60):  # until the daemon itself finds the store down (its status says so)
                while True:
                    async with connect_rpc(daemon.info["operator"], daemon.token("read")) as rpc:
                        status = await rpc.call(f"{SERVICE}/Status", {})
                    if not status["store"]["reachable"]:
                        break
                    await trio.sleep(0.2)

            texts: list[str] = []
            with trio.fail_after(120):  # a hang guard only
                async with gateway_client(gateway, token) as client:
                    tools = await client.list_tools()
                    assert {t.name for t in tools.tools} == {"recall", "briefing"}
                    for name, arguments in (("recall", {"query": "flaky ledger"}), ("briefing", {}),
                                            ("briefing", {"refresh": True})):
                        result = await client.call_tool(name, arguments)
                        assert result.is_error is False, result
                        texts.append(result.content[0].text)
                    resource = await client.read_resource("harness://memory/briefing")
                    texts.append(resource.contents[0].text)
                    denied = await client.call_tool("memory_forget", {"episode_id": "ep_x"})
                    assert denied.is_error is True and "not_permitted" in denied.content[0].text

                # The same over raw HTTP: status 200 with a JSON body on every request, never a 500.
                port = int(gateway.rsplit(":", 1)[1].split("/")[0])
                http = await Http.open(port)
                try:
                    auth = {"Authorization": f"Bearer {token}"}
                    status, headers, body = await http.request(INIT, auth)
                    assert status == 200 and body, (status, body)
                    session = {**auth, "Mcp-Session-Id": headers["mcp-session-id"], "Mcp-Protocol-Version": LEGACY}
                    status, _, _ = await http.request(rpc_message(None, "notifications/initialized"), session)
                    assert status == 202
                    for i, (method, params) in enumerate((
                            ("tools/call", {"name": "recall", "arguments": {"query": "ledger"}}),
                            ("tools/call", {"name": "briefing", "arguments": {}}),
                            ("resources/read", {"uri": "harness://memory/briefing"}),
                            ("tools/list", {}), ("resources/list", {}))):
                        status, _, body = await http.request(rpc_message(10 + i, method, params), session)
                        assert status == 200 and body, (method, status, body)
                        answer = json.loads(body)
                        assert "result" in answer, answer
                        if method != "tools/list" and method != "resources/list":
                            texts.append(json.dumps(answer["result"]))
                finally:
                    await http.aclose()

            assert len(texts) == 7
            for text in texts:
                assert "store_unavailable" in text, text[:2000]
            log = daemon.log_text()
            assert "store unavailable" in log
            assert f"127.0.0.1:{cluster.port}/memory" in log  # the store named
            assert cluster.password not in log
            assert "Traceback" not in log, log[-4000:]
        finally:
            await trio.to_thread.run_sync(daemon.stop)
    finally:
        cluster.close()
