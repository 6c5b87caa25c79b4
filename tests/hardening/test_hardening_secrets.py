"""Secrets: every format of the corpus (tests/data/secret_corpus.json, 60+ realistic credential
formats) is redacted wherever the daemon keeps or writes text, with the daemon as a process.

Each format is put into a run record — result text, harness name, run id, trace id, model, trigger,
session id and cwd, branch, edited paths, a verify error class, message and tool-call events, the
ingest's source — into the operator feeds (a fact, presence, a run token's harness and workdir, whose
run then recalls and reads its briefing through the gateway, which logs its harness) and, with the key
blocks spread over many lines, into the stderr of the daemon's stdio memory provider. Afterwards no random part of any secret is in any file of the state directory (the
SQLite database, its WAL and shared memory, scanned while the daemon runs and after it stopped) or in
the daemon's log.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import trio

from memactors.rpc.client import connect_rpc
from support_hardening import secret_record, start_leaky_daemon, stored_files
from support_secrets import corpus

SERVICE = "harness.v1.MemoryService"
API = "forge.example/acme/api"


def test_the_corpus_has_sixty_realistic_formats_and_names_the_ones_once_missed() -> None:
    ids = [s.id for s in corpus()]
    assert len(ids) == len(set(ids)) >= 60
    for needed in ("azure-storage-account-key", "azure-sas-sig", "vault-batch-token", "huggingface-token",
                   "datadog-api-key", "datadog-app-key", "mailgun-api-key", "newrelic-user-key",
                   "telegram-bot-token", "discord-webhook-url", "age-secret-key", "rsa-private-key",
                   "ec-private-key", "openssh-private-key", "pgp-private-key"):
        assert needed in ids
    assert all(s.random_parts for s in corpus())


async def _recall_and_briefing(url: str, token: str) -> None:
    """A handshake-era session with the token: a recall and a briefing read, as an agent makes them."""
    headers = {"accept": "application/json, text/event-stream", "authorization": f"Bearer {token}"}
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    async with httpx2.AsyncClient(timeout=30, headers=headers) as http:
        opened = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        assert opened.status_code == 200, opened.text
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        for n, name in enumerate(("recall", "briefing")):
            arguments = {"query": "ledger"} if name == "recall" else {}
            called = await http.post(url, headers=session, json={"jsonrpc": "2.0", "id": n + 2, "method": "tools/call",
                                                                  "params": {"name": name, "arguments": arguments}})
            assert called.status_code == 200, called.text


def _leaks(data: bytes | str, where: str) -> list[tuple[str, str]]:
    return [(where, s.id) for s in corpus() if s.found_in(data)]


@pytest.mark.req6
@pytest.mark.slow
async def test_no_format_of_the_corpus_reaches_the_state_directory_or_the_log(tmp_path: Path) -> None:
    daemon = await trio.to_thread.run_sync(start_leaky_daemon, tmp_path, corpus())
    state = tmp_path / "state"
    leaks: list[tuple[str, str]] = []
    try:
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            for i, sample in enumerate(corpus()):
                result = await rpc.call(f"{SERVICE}/IngestRun", {"record": secret_record(i, sample),
                                                                "source": f"file {sample.one_line}"[:250]})
                assert result["outcome"] in ("recorded", "queued"), (sample.id, result)
                short = secret_record(i, sample)["harness"]
                await rpc.call(f"{SERVICE}/AddFact", {"scope": f"project:{API}", "text": f"fact {sample.text}",
                                                     "confidence": 0.5})
                await rpc.call(f"{SERVICE}/ReportPresence", {"harness": f"p{short}", "run_id": f"{i}",
                                                            "session_id": f"s-{i}", "repo": API, "branch": "main"})
                minted = await rpc.call(f"{SERVICE}/MintRunToken", {"harness": f"m{short}", "run_id": f"m{i}",
                                                                   "workdir": f"/w/{sample.one_line}"[:900]})
                await _recall_and_briefing(daemon.info["gateway"], minted["token"])
            status = await rpc.call(f"{SERVICE}/Status", {})
            assert status["counts"]["episodes"] == len(corpus())
        # While the daemon runs the newest pages are in the WAL: scan the database, WAL and shm now ...
        for file in stored_files(state):
            leaks += _leaks(file.read_bytes(), file.name)
    finally:
        code = await trio.to_thread.run_sync(daemon.stop)
    # ... and again after the stop has checkpointed them into the database file.
    files = stored_files(state)
    assert any(p.suffix == ".db" for p in files)
    for file in files:
        leaks += _leaks(file.read_bytes(), file.name)
    log = daemon.log_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    leaks += _leaks(log, "daemon log")
    assert leaks == []
    # The provider's stderr was logged, every sample's marker line: its key blocks were there to leak.
    for sample in corpus():
        assert f"SAMPLE {sample.id}" in log, sample.id
    assert log.count("provider stderr") >= len(corpus())
    assert "[REDACTED]" in log
