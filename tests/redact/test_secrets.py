"""No secret leaves the daemon, and none stays in it (SPEC-0030 REQ-6).

Runs carrying every true-positive secret of tests/redact/test_redact.py in every string field are ingested with
summaries on (a real fake model API on loopback); afterwards the state directory's files are scanned as
raw bytes, the FTS vocabulary is listed, the model API's received bodies and the daemon's log lines are
checked. The scenario "A token in the result never leaves the daemon" also runs against a real stdio
upstream provider that logs what it received.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlean
from loguru import logger

from fix_daemon import daemon_in_process
from memactors.config import ConfigHolder
from memactors.service import open_memory_service
from memactors.testing.fake_model_api import FakeBehaviour, run_fake_model_api
from support import run_record, wait_ready
from support_secrets import TRUE_POSITIVES

API = "forge.example/acme/api"
GHP = "gh" + "p_" + "Idg53Z131ckMzKyTs2mP" + "Ln6YYc8kkswFm9il"
Holder = Callable[[str], ConfigHolder]


def model_api(base_url: str) -> str:
    return f'[model_api]\nbase_url = "{base_url}"\nutility_model = "u"\n'


def forms(secret: str) -> set[str]:
    """The ways a secret could sit in a file: raw, JSON-escaped, and its long alphanumeric runs
    (as FTS would tokenise them: lower-cased, possibly stemmed)."""
    out = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    for run in re.findall(r"[A-Za-z0-9]{12,}", secret):
        out |= {run, run.lower()}
        if len(run) >= 16:
            out.add(run.lower()[:-4])
    return {f for f in out if len(f) >= 8}


def secret_record(i: int, before: str, secret: str, after: str) -> dict[str, Any]:
    ctx = before + secret + after
    line = " ".join(ctx.split())  # one-line fields refuse line breaks: the same secret on one line
    at = "2026-11-28T09:01:00Z"
    return run_record(
        harness=f"h{i} {line}"[:250], run_id=f"r{i}", trace_id=ctx, result_text=f"RESULT-MARKER {ctx} end",
        prompt=f"PROMPT-MARKER {ctx}", model={"served": ctx}, trigger={"source": "api", "name": ctx},
        sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": API, "git_branch": line[:250]},
                  {"session_id": "s2", "cwd": f"/srv/{line}", "repo": API, "subagent": True}],
        events=[{"kind": "edit", "session_id": "s1", "at": at, "path": f"src/{line}"},
                {"kind": "edit", "session_id": "s2", "at": at, "path": line},
                {"kind": "verify", "session_id": "s1", "at": at, "ok": False, "error_class": ctx},
                {"kind": "tool_call", "session_id": "s1", "at": at, "payload": {"args": ctx}},
                {"kind": "message", "session_id": "s1", "at": at, "text": ctx}],
    )


def scan(state: Path, secrets: list[str]) -> list[tuple[str, str]]:
    """(file, secret) for every secret found in any file under `state`, token files excepted."""
    found = []
    files = [p for p in state.rglob("*") if p.is_file() and not p.name.endswith(".token")]
    assert any(p.name.endswith(".db") for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            if any(f.encode() in data for f in forms(secret)):
                found.append((path.name, secret))
    return found


@pytest.mark.req6
async def test_req6_no_true_positive_secret_survives_anywhere_in_the_state_directory(
    make_holder: Holder, tmp_path: Path
) -> None:
    secrets = [s for _, _, s, _ in TRUE_POSITIVES if len(s) >= 8]
    lines: list[str] = []
    sink = logger.add(lines.append, serialize=True, level="DEBUG")
    try:
        async with run_fake_model_api() as fake:
            async with open_memory_service(make_holder(model_api(fake.base_url))) as svc:
                await wait_ready(svc)
                for i, (_, before, secret, after) in enumerate(TRUE_POSITIVES):
                    fake.behaviour.chat_reply = {"summary": f"sum {before}{secret}{after}"[:280]}
                    result = await svc.ingest_run(secret_record(i, before, secret, after))
                    assert result["outcome"] == "recorded", result
                assert await svc.store.read(lambda db: db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]) \
                    == len(TRUE_POSITIVES)
                # While open the WAL holds the newest pages; closing checkpoints them into the db file.
                assert scan(tmp_path / "state", secrets) == []
            sent = json.dumps([r.body for r in fake.requests_to("/v1/chat/completions")])
            assert len(fake.requests_to("/v1/chat/completions")) == len(TRUE_POSITIVES)
    finally:
        logger.remove(sink)
    assert scan(tmp_path / "state", secrets) == []
    for secret in secrets:
        assert not any(f in sent for f in forms(secret)), secret
    assert "PROMPT-MARKER" not in sent
    # The FTS index holds tokens, not text: list them.
    db = sqlean.connect(str(tmp_path / "state" / "memactors.db"))
    try:
        db.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, builtin_fts, 'row')")
        terms = "\n".join(t for (t,) in db.execute("SELECT term FROM temp.vocab"))
        stored_body = "\n".join(t for (t,) in db.execute("SELECT body FROM episode_bodies"))
    finally:
        db.close()
    assert {"redact", "marker"} <= set(terms.split("\n"))  # porter-stemmed tokens of the episode text
    for secret in secrets:
        assert not any(f.lower() in terms for f in forms(secret)), secret
    assert stored_body.count("[REDACTED]") >= len(TRUE_POSITIVES)
    # Logs carry ids and counts only: no secret, no result text, no prompt.
    log = "\n".join(lines)
    assert "run ingested" in log
    assert "RESULT-MARKER" not in log and "PROMPT-MARKER" not in log and "sum " not in log
    for secret in secrets:
        assert not any(f in log for f in forms(secret)), secret


@pytest.mark.req6
async def test_req6_a_token_in_the_result_never_leaves_the_daemon(make_holder: Holder, tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    args = json.dumps(["-m", "memactors.testing.fault_provider", "--calls", str(calls)])
    result_text = f"Opened the PR using {GHP}; CI is green."
    async with run_fake_model_api(behaviour=FakeBehaviour(chat_reply={"summary": "Opened the PR."})) as fake:
        extra = (f'[memory]\nprovider = "fault"\n[mcp.fault]\ncommand = {json.dumps(sys.executable)}\n'
                 f"args = {args}\n" + model_api(fake.base_url))
        async with open_memory_service(make_holder(extra)) as svc:
            await wait_ready(svc)
            result = await svc.ingest_run(run_record(result_text=result_text))
            assert result["outcome"] == "recorded"
            view = await svc.get_episode(result["episode_id"])
        summary_request = json.dumps(fake.requests_to("/v1/chat/completions")[0].body)
    recorded = [c for c in map(json.loads, calls.read_text().splitlines()) if c["tool"] == "memory_record_episode"]
    assert len(recorded) == 1
    provider_input = json.dumps(recorded[0]["arguments"])
    assert recorded[0]["arguments"]["episode"]["result_excerpt"] == "Opened the PR using [REDACTED]; CI is green."
    for where in (json.dumps(view), provider_input, summary_request):
        assert "[REDACTED]" in where
        assert GHP not in where and GHP[4:] not in where
    assert view["episode"]["summary"] == "Opened the PR."
    assert [i["provider"] for i in view["index"]] == ["fault"]


# -- nothing secret: every credential family, every field and feed, through the real daemon --

CREDENTIAL_FAMILIES = ("stripe-access-token", "gcp-api-key", "npm-access-token", "pypi-upload-token",
                   "sendgrid-api-token", "vault-service-token", "docker-pat", "github-pat",
                   "github-fine-grained-pat", "aws-access-key-id", "slack-token", "private-key", "jwt",
                   "password-assignment", "url-userinfo-password")


def family_samples() -> list[tuple[str, str, str, str]]:
    return [tp for tp in TRUE_POSITIVES if tp[0] in CREDENTIAL_FAMILIES]


def telltales(secret: str) -> set[str]:
    """What must not appear: the secret's forms, and for short ones (hunter2, a password with '@') the
    secret itself and the tail after its last '@'."""
    out = forms(secret) | {secret}
    if "@" in secret:
        out.add(secret.rsplit("@", 1)[1])
    return {f for f in out if len(f) >= 5}


@pytest.mark.req6
@pytest.mark.slow
async def test_no_credential_family_reaches_the_state_directory_or_the_log_through_the_daemon(
        tmp_path: Path) -> None:
    from memactors.rpc.client import connect_rpc
    from memactors.rpc.tokens import read_token

    service = "harness.v1.MemoryService"
    samples = family_samples()
    assert {s[0] for s in samples} == set(CREDENTIAL_FAMILIES)
    lines: list[str] = []
    sink = logger.add(lines.append, serialize=True, level="DEBUG")
    state = tmp_path / "state"
    found: list[tuple[str, str]] = []
    try:
        async with daemon_in_process(tmp_path, "[memory.episodes]\nsummary = false\n") as (_, listening):
            async with connect_rpc(listening.operator, read_token(state, "control")) as rpc:
                for i, (_, before, secret, after) in enumerate(samples):
                    ctx = before + secret + after
                    line = " ".join(ctx.split())  # one-line fields refuse line breaks: the same secret on one line
                    record = run_record(
                        harness=f"h{i}-{line}"[:200], run_id=f"r{i} {line}"[:200], trace_id=ctx,
                        result_text="x" * 590 + " " + ctx + " end",  # the secret straddles the 600-char cut
                        model={"served": line[:200]}, trigger={"source": "operator", "name": ctx},
                        sessions=[{"session_id": f"s{i} {line}"[:200], "cwd": f"/srv/api/{line}"[:900],
                                   "repo": API, "git_branch": line[:200]}],
                        events=[{"kind": "edit", "session_id": f"s{i} {line}"[:200], "at": "2026-11-28T09:01:00Z",
                                 "path": f"/srv/api/src/{line}"[:900]},
                                {"kind": "verify", "session_id": f"s{i} {line}"[:200], "at": "2026-11-28T09:02:00Z",
                                 "ok": False, "error_class": ctx}])
                    result = await rpc.call(f"{service}/IngestRun", {"record": record, "source": f"file {line}"})
                    assert result["outcome"] in ("recorded", "queued"), result
                    await rpc.call(f"{service}/AddFact", {"scope": "fleet", "text": f"fact {ctx}", "confidence": 0.5})
                    await rpc.call(f"{service}/LinkPullRequest", {"repo": API, "branch": line[:200],
                                                                 "url": f"https://u:{secret.split()[0][:300]}@forge.example/pr/{i}"[:2000]})
                    await rpc.call(f"{service}/ReportPresence", {
                        "harness": f"p{i} {line}"[:200], "run_id": f"{i}", "session_id": f"s-{line}"[:200],
                        "repo": API, "branch": line[:200], "paths": [f"src/{line}"[:900]]})
                    await rpc.call(f"{service}/MintRunToken", {"harness": f"m{i} {line}"[:200], "run_id": f"{i}",
                                                              "workdir": f"/w/{line}"[:900]})
                # While the daemon runs, the newest pages are in the WAL: scan db, WAL and shm now ...
                for file in sorted(p for p in state.rglob("*") if p.is_file() and not p.name.endswith(".token")):
                    data = file.read_bytes()
                    found += [(file.name, s) for _, _, s, _ in samples if any(f.encode() in data for f in telltales(s))]
    finally:
        logger.remove(sink)
    # ... and again after the stop has checkpointed them into the db file.
    files = sorted(p for p in state.rglob("*") if p.is_file() and not p.name.endswith(".token"))
    assert any(p.name.endswith("-wal") or p.name.endswith(".db") for p in files)
    for file in files:
        data = file.read_bytes()
        found += [(file.name, s) for _, _, s, _ in samples if any(f.encode() in data for f in telltales(s))]
    assert found == []
    log = "\n".join(lines)
    assert "run ingested" in log
    for _, _, secret, _ in samples:
        assert not any(f in log for f in telltales(secret)), secret


@pytest.mark.req6
async def test_each_string_of_a_record_is_redacted_once_at_the_boundary(
        make_holder: Holder, monkeypatch: pytest.MonkeyPatch) -> None:
    from memactors import episode, redact

    big = "Refactored the ledger module; all tests pass. " * 4_000  # ~190 kB of result text
    async with open_memory_service(make_holder("[memory.episodes]\nsummary = false\n")) as svc:
        await wait_ready(svc)

        async def scanned(run_id: str) -> tuple[int, int]:
            calls, chars = redact.STATS["calls"], redact.STATS["chars"]
            assert (await svc.ingest_run(run_record(run_id=run_id, result_text=big)))["outcome"] == "recorded"
            return redact.STATS["calls"] - calls, redact.STATS["chars"] - chars

        once_calls, once_chars = await scanned("once")
        # The same ingest when assembly re-redacts what stored_record already redacted (the old path).
        monkeypatch.setattr(episode, "is_stored", lambda record: False)
        again_calls, again_chars = await scanned("again")
    print(f"redact per ingest: {once_calls} calls / {once_chars} chars once; "
          f"{again_calls} calls / {again_chars} chars re-redacting")
    assert once_chars < 1.2 * len(big)  # the result text is scanned once, plus short fields and lines
    assert again_chars > 2 * len(big)  # the measurement can tell the difference
    assert once_calls < again_calls


@pytest.mark.req6
@pytest.mark.parametrize("offset", [2, 8, 12, 20, 30])
def test_a_secret_straddling_the_excerpt_cut_is_redacted_before_the_cut(offset: int) -> None:
    from memactors._wire import parse_run_record
    from memactors.episode import SessionRepo, assemble, stored_record

    stripe = "sk" + "_live_" + "63BOHhbRv1uScBxw" + "S38IWJ654E9Vnc8O"
    text = "x" * (600 - offset) + " " + stripe + " rest of the result"
    record = stored_record(parse_run_record(run_record(result_text=text)))
    repos = {s.session_id: SessionRepo(key=s.repo, cwd=s.cwd) for s in record.sessions}
    excerpt = assemble(record, repos, excerpt_chars=600).result_excerpt
    assert len(excerpt) <= 600
    assert "sk_live" not in excerpt and "63BOH" not in excerpt
    assert excerpt.startswith("x" * (600 - offset))
