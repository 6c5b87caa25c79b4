"""Over the daemon as a process: every RPC frame gets an answer (a frame whose `id` is a lone
surrogate used to close the connection with no reply), and a method refuses a parameter it does not
take by name, as the gateway refuses an unknown tool argument (SPEC-0030 Error Handling Standards)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from fix_daemon import Daemon, daemon_process
from memactors.rpc.methods import SERVICE, operator_methods
from memactors.service import MemoryService


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with daemon_process(tmp_path_factory.mktemp("daemon")) as running:
        yield running


async def exchange(daemon: Daemon, frames: list[str], tier: str = "read") -> list[dict[str, Any]]:
    """Send raw text frames on one connection, one at a time, and return each reply in order."""
    token = daemon.token(tier).encode()
    replies = []
    async with open_websocket_url(daemon.info["operator"], extra_headers=[(b"authorization", b"Bearer " + token)]) as ws:
        for frame in frames:
            await ws.send_message(frame)
            with trio.fail_after(30):
                replies.append(json.loads(await ws.get_message()))
    return replies


STATUS = f"{SERVICE}/Status"


@pytest.mark.parametrize(("raw_id", "why"), [
    pytest.param('"\\ud800"', "lone surrogates", id="lone-surrogate"),
    pytest.param('"a\\udc00b"', "lone surrogates", id="low-surrogate-inside"),
    pytest.param('"line\\nbreak"', "control characters", id="control-character"),
    pytest.param('"' + "x" * 200 + '"', "at most 128 characters", id="too-long"),
    pytest.param(str(2**70), "64 bits", id="huge-integer"),
    pytest.param("1.5", "string or an integer", id="float"),
    pytest.param("null", "string or an integer", id="null"),
])
async def test_a_malformed_frame_id_gets_invalid_argument_and_the_connection_stays_open(
        daemon: Daemon, raw_id: str, why: str) -> None:
    bad = f'{{"id": {raw_id}, "method": "{STATUS}", "params": {{}}}}'
    refused, status = await exchange(daemon, [bad, json.dumps({"id": 7, "method": STATUS})])
    assert refused["id"] is None and refused["error"]["code"] == "INVALID_ARGUMENT", refused
    assert why in refused["error"]["message"]
    assert status["id"] == 7 and status["result"]["provider"] == "builtin"  # same connection, still served
    assert "rpc connection failed" not in daemon.log_text()


@pytest.mark.errors
async def test_rpc_recall_refuses_an_unknown_parameter_by_name(daemon: Daemon) -> None:
    recall = f"{SERVICE}/Recall"
    frames = [json.dumps({"id": 1, "method": recall,
                          "params": {"query": "ledger", "repo": "forge.example/acme/api", "limt": 3}}),
              # A key a client controls is shown escaped and cut, never raw.
              '{"id": 2, "method": "' + recall + '", "params": {"query": "x", "repo": "a/b/c", "bad\\u0000\\ud800key": 1}}',
              json.dumps({"id": 3, "method": recall, "params": {"query": "ledger", "repo": "forge.example/acme/api"}})]
    typo, odd, fine = await exchange(daemon, frames)
    assert typo["error"] == {"code": "INVALID_ARGUMENT", "message":
                             "Recall takes no parameter params.limt; it takes: as, limit, paths, query, repo"}
    assert odd["error"]["code"] == "INVALID_ARGUMENT"
    assert "params.bad\\x00\\ud800key" in odd["error"]["message"]
    assert fine["result"]["query_scope"] == "project:forge.example/acme/api"


async def test_every_method_declares_its_parameters_and_refuses_any_other_before_its_handler(
        daemon: Daemon, memory: MemoryService) -> None:
    """No method silently ignores what a caller sent. Control-tier methods too (a Forget with a typo'd
    parameter is refused before anything is forgotten)."""
    methods = operator_methods(memory)
    undeclared = [m.name for m in methods if m.params is None]
    assert undeclared == [], f"declare params= for {undeclared} in rpc.methods.operator_methods"
    frames = [json.dumps({"id": n, "method": m.name, "params": {"zz_not_a_parameter": 1}})
              for n, m in enumerate(methods)]
    for method, reply in zip(methods, await exchange(daemon, frames, tier="control"), strict=True):
        assert reply["error"]["code"] == "INVALID_ARGUMENT", (method.name, reply)
        assert "params.zz_not_a_parameter" in reply["error"]["message"], (method.name, reply)
    assert "handler failed" not in daemon.log_text()

