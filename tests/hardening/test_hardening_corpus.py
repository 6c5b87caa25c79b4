"""Redaction that generalizes: every format of the generated corpus (tests/support_corpus.py:
300+ valid-shaped FAKE credentials — the structural forms, vendor prefixes, one sample per gitleaks rule,
memactors' own formats) placed in every field through the real surfaces, with the daemon as a process:

* run records through the CLI (`memactors runs ingest DIR`, a subprocess, one batch): result text, trace
  id, trigger, harness, run, session and model names, cwd, branch, edited paths, verify failure text,
  message and tool-call events;
* facts, presence and run tokens (harness, workdir) through the operator RPC;
* the stderr of the daemon's real stdio memory provider (every format, key blocks over many lines).

Afterwards no random part of any secret is in any file of the state directory (SQLite database, WAL and
shared memory: scanned while the daemon runs and after it stopped), in any served answer (RPC reads,
and recall and briefing through the gateway with a real MCP client over streamable HTTP) or in the
daemon's log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from memactors.rpc.client import connect_rpc
from support_corpus import full
from support_hardening import secret_record, start_leaky_daemon, stored_files
from support_readside import gateway_client

SERVICE = "harness.v1.MemoryService"
API = "forge.example/acme/api"
#: Gateway sessions are the slow part: one for every Nth format's run token (each holds its harness name).
GATEWAY_EVERY = 25
#: Facts hold several formats each (a fact's text has room; one RPC per format would only add time).
FACT_BATCH = 6


def _leaks(data: bytes | str, where: str) -> list[tuple[str, str]]:
    return [(where, s.id) for s in full() if s.found_in(data)]


async def _cli(env: dict[str, str], *args: str) -> trio.Process:
    return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=env, capture_stdout=True,
                                  capture_stderr=True, check=False)


def _text_of(result: object) -> str:
    return "\n".join(getattr(c, "text", "") for c in getattr(result, "content", []))


@pytest.mark.req6
@pytest.mark.slow
async def test_no_format_of_the_generated_corpus_reaches_disk_an_answer_or_the_log(tmp_path: Path) -> None:
    corpus = full()
    assert len(corpus) >= 300
    records = tmp_path / "records"
    records.mkdir()
    for i, sample in enumerate(corpus):
        (records / f"run-{i:04d}.json").write_text(json.dumps(secret_record(i, sample)), encoding="utf-8")
    daemon = await trio.to_thread.run_sync(start_leaky_daemon, tmp_path, corpus)
    state = tmp_path / "state"
    leaks: list[tuple[str, str]] = []
    answers: list[str] = []
    try:
        ingested = await _cli(daemon.env, "runs", "ingest", str(records), "--json")
        assert ingested.returncode == 0, ingested.stderr.decode()[-3000:]
        answers += [ingested.stdout.decode(), ingested.stderr.decode()]
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            tokens: list[str] = []
            for n in range(0, len(corpus), FACT_BATCH):
                text = "\n".join(f"fact {s.text}" for s in corpus[n : n + FACT_BATCH])
                answers.append(json.dumps(await rpc.call(f"{SERVICE}/AddFact", {
                    "scope": f"project:{API}", "text": text, "confidence": 0.5})))
            for i, sample in enumerate(corpus):
                short = str(secret_record(i, sample)["harness"])
                answers.append(json.dumps(await rpc.call(f"{SERVICE}/ReportPresence", {
                    "harness": f"p{short}", "run_id": f"{i}", "session_id": f"s-{i}", "repo": API, "branch": "main"})))
                minted = await rpc.call(f"{SERVICE}/MintRunToken", {"harness": f"m{short}", "run_id": f"m{i}",
                                                                   "workdir": f"/w/{sample.one_line}"[:900]})
                tokens.append(minted["token"])
            status = await rpc.call(f"{SERVICE}/Status", {})
            assert status["counts"]["episodes"] == len(corpus), status["counts"]
            answers.append(json.dumps(status))
            page = await rpc.call(f"{SERVICE}/ListEpisodes", {"limit": 1000})
            answers.append(json.dumps(page))
            for episode in page["episodes"][:: max(1, len(page["episodes"]) // 40)]:
                answers.append(json.dumps(await rpc.call(f"{SERVICE}/GetEpisode", {"episode_id": episode["episode_id"]})))
            for query in ("password token secret key", "ledger", "authorization cookie", "private key block"):
                answers.append(json.dumps(await rpc.call(f"{SERVICE}/Recall", {"query": query, "repo": API})))
        for token in tokens[::GATEWAY_EVERY]:
            async with gateway_client(daemon.info["gateway"], token) as client:
                for name, arguments in (("recall", {"query": "password token secret"}), ("briefing", {})):
                    result = await client.call_tool(name, arguments)
                    answers.append(_text_of(result))
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
    for n, answer in enumerate(answers):
        leaks += _leaks(answer, f"answer {n}")
    log = daemon.log_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    leaks += _leaks(log, "daemon log")
    assert leaks == []
    # The provider's stderr was logged, every sample's marker line: its secrets were there to leak; and
    # the answers held the episodes (with markers where the secrets were).
    for sample in corpus:
        assert f"SAMPLE {sample.id}" in log, sample.id
    assert "[REDACTED]" in log and "[REDACTED]" in json.dumps(page)
