"""The write side of memory through the embedded service: eligibility, trust class, scope, summaries,
the index, metrics, crash safety and reproducibility across a restart (REQ-5, 6, 7, 8, 9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from memactors._wire import episode_json, load_run_record
from memactors.actors.assembler import Assemble, Assembler
from memactors.actors.summary import Summarize, SummaryActor, model_api_settings
from memactors.config import ConfigHolder
from memactors.episode import assemble, render_text, resolve_sessions
from memactors.errors import MemactorsError
from memactors.metrics import Metrics
from memactors.modelapi import SUMMARY_DEADLINE
from memactors.repo import clear_cache
from memactors.service import MemoryService, open_memory_service
from memactors.store import pull_requests
from memactors.store.memory_index import add_index_rows
from memactors.testing.fake_model_api import FakeBehaviour, FakeModelApi, run_fake_model_api
from support import EXAMPLES, example, run_record, wait_ready, within, write_config
from support_readside import sample

API = "forge.example/acme/api"
GHP = "gh" + "p_" + "Idg53Z131ckMzKyTs2mP" + "Ln6YYc8kkswFm9il"
RECORDED = "harness_memory_episodes_recorded_total"
SUMMARIES = "harness_memory_episode_summaries_total"
Holder = Callable[[str], ConfigHolder]


pytestmark = pytest.mark.usefixtures("isolated_git")


@asynccontextmanager
async def service(holder: ConfigHolder) -> AsyncIterator[MemoryService]:
    async with open_memory_service(holder) as svc:
        await wait_ready(svc)
        yield svc


async def count(svc: MemoryService, table: str) -> int:
    return await svc.store.read(lambda db: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


async def stored_run_record(svc: MemoryService, harness: str, run_id: str) -> str | None:
    row = await svc.store.read(lambda db: db.execute(
        "SELECT rr.record FROM runs r JOIN run_records rr ON rr.id = r.record_id WHERE r.harness = ? AND r.run_id = ?",
        [harness, run_id]).fetchone())
    return None if row is None else row[0]


def git_repo(path: Path, remote: str) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "-C", str(path), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(path), "remote", "add", "origin", remote], check=True)
    return path.resolve()


def model_api(fake: FakeModelApi, extra: str = "") -> str:
    return f'[model_api]\nbase_url = "{fake.base_url}"\nutility_model = "u"\n' + extra


# -- REQ-5 --------------------------------------------------------------------------------------------

@pytest.mark.req5
async def test_req5_a_failed_run_yields_a_complete_episode_through_the_service(memory: MemoryService) -> None:
    data = example("run-42-api-fixer.json")
    result = await memory.ingest_run(data)
    view = await memory.get_episode(result["episode_id"])
    ep = view["episode"]
    assert ep["files_touched"] == ["internal/clock/clock.go", "internal/ledger/reconcile.go",
                                   "internal/ledger/reconcile_test.go"]
    assert ep["verify_failures"] == [{"error_class": "test_failure", "count": 2}]
    assert (ep["outcome"], ep["repo"], ep["branch"], ep["run_id"]) == ("failed", API, "fix/flaky", "42")
    assert "verify_failures: test_failure: 2\n" in view["text"]
    stored = await stored_run_record(memory, "api-fixer", "42")
    assert stored is not None
    for text in (json.dumps(view), stored):
        assert data["prompt"] not in text and "Fix the flaky ledger test" not in text
        assert "never stored" not in text  # event payloads are never kept
    assert "prompt" not in json.loads(stored)


@pytest.mark.req5
async def test_req5_the_pull_request_linked_to_the_branch_is_in_the_episode(memory: MemoryService) -> None:
    url = "https://forge.example/acme/api/pull/7"
    await memory.store.write(lambda db: pull_requests.link_pull_request(
        db, repo=API, branch="fix/flaky", url=url, now=datetime(2026, 11, 28, tzinfo=UTC)))
    result = await memory.ingest_run(example("run-42-api-fixer.json"))
    view = await memory.get_episode(result["episode_id"])
    assert view["episode"]["pull_request"] == url and f"pull_request: {url}\n" in view["text"]


@pytest.mark.req5
async def test_req5_assembly_is_reproducible_across_a_restart(make_holder: Holder, tmp_path: Path) -> None:
    top = git_repo(tmp_path / "api", "git@forge.example:acme/api.git")
    (top / "pkg").mkdir()
    data = run_record(
        run_id="77", result_text="fixed it \u00e9\u2028 \x07 ok",
        sessions=[{"session_id": "s1", "cwd": str(top / "pkg"), "git_branch": "fix/x"},
                  {"session_id": "s2", "cwd": str(top), "subagent": True}],
        events=[{"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z", "path": "a.go"},
                {"kind": "edit", "session_id": "s2", "at": "2026-11-28T09:01:00Z", "path": str(top / "b.go")},
                {"kind": "verify", "session_id": "s2", "at": "2026-11-28T09:02:00Z", "ok": False,
                 "error_class": "lint"}])
    holder = make_holder("")
    async with service(holder) as svc:
        result = await svc.ingest_run(data)
    clear_cache()
    async with service(holder) as svc:
        view = await svc.get_episode(result["episode_id"])
        stored = await stored_run_record(svc, "api-fixer", "77")
        assert stored is not None
        record = load_run_record(stored)
        again = assemble(record, await resolve_sessions(record), excerpt_chars=svc.config.episodes.excerpt_chars)
        assert render_text(again).encode() == view["text"].encode()
        body = await svc.store.read(lambda db: db.execute(
            "SELECT b.body FROM episodes e JOIN episode_bodies b ON b.id = e.body_id WHERE e.episode_id = ?",
            [result["episode_id"]]).fetchone()[0])
        assert episode_json(again) == body
        assert again.files_touched == ("b.go", "pkg/a.go") and again.repo == API


# -- REQ-8 --------------------------------------------------------------------------------------------

@pytest.mark.req8
async def test_req8_no_repository_no_episode(memory: MemoryService, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    result = await memory.ingest_run(run_record(sessions=[{"session_id": "s1", "cwd": str(work)}]))
    assert (result["outcome"], result["reason"]) == ("skipped", "no_repository")
    assert sample(memory, RECORDED, provider="builtin", outcome="skipped") == 1
    assert await count(memory, "episodes") == 0 and await count(memory, "pending") == 0
    assert await count(memory, "runs") == 1  # the graph still knows the run


@pytest.mark.req8
async def test_req8_opting_a_harness_out(make_holder: Holder) -> None:
    holder = make_holder('[harness.scratch]\nharness = "claude-code"\nmemory_record = false\n')
    async with service(holder) as svc:
        result = await svc.ingest_run(run_record(harness="scratch", events=[
            {"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z", "path": "x.go"}]))
        assert (result["outcome"], result["reason"]) == ("skipped", "memory_record_off")
        assert await count(svc, "episodes") == 0 and await count(svc, "builtin_docs") == 0
        assert sample(svc, RECORDED, provider="builtin", outcome="skipped") == 1
        assert sample(svc, RECORDED, provider="builtin", outcome="ok") == 0
        paths = await svc.store.read(lambda db: db.execute("SELECT repo, path FROM run_paths").fetchall())
        assert paths == [(API, "x.go")]


@pytest.mark.req8
async def test_req8_record_trace_off_records_nothing_and_no_process_no_episode(make_holder: Holder) -> None:
    holder = make_holder('[harness.quiet]\nharness = "claude-code"\nrecord_trace = false\n')
    async with service(holder) as svc:
        quiet = await svc.ingest_run(run_record(harness="quiet"))
        assert quiet["reason"] == "record_trace_off"
        assert await count(svc, "runs") == 0 and await count(svc, "episodes") == 0
        idle = await svc.ingest_run(run_record(run_id="2", spawned_process=False))
        assert idle["reason"] == "no_process"
        assert await count(svc, "runs") == 1 and await count(svc, "episodes") == 0
        assert sample(svc, RECORDED, provider="builtin", outcome="skipped") == 2


# -- REQ-6 trust class and scope ----------------------------------------------------------------------

@pytest.mark.req6
async def test_req6_a_webhook_triggered_run_is_marked(memory: MemoryService) -> None:
    hook = await memory.ingest_run(run_record(trigger={"source": "webhook", "name": "forge-pr"}))
    chat = await memory.ingest_run(run_record(run_id="2", trigger={"source": "channel", "name": "ops"}))
    plain = await memory.ingest_run(run_record(run_id="3", trigger={"source": "schedule", "name": "nightly"}))
    classes = [(await memory.get_episode(r["episode_id"]))["episode"]["trust_class"] for r in (hook, chat, plain)]
    assert classes == ["untrusted_input", "untrusted_input", "standard"]


@pytest.mark.req6
async def test_an_untrusted_inline_harness_is_marked(make_holder: Holder) -> None:
    async with service(make_holder('[harness.bot]\nharness = "claude-code"\nuntrusted_inline = true\n')) as svc:
        result = await svc.ingest_run(run_record(harness="bot"))
        assert (await svc.get_episode(result["episode_id"]))["episode"]["trust_class"] == "untrusted_input"


@pytest.mark.req6
async def test_req6_scope_never_changes_once_recorded(memory: MemoryService) -> None:
    """The first record of a run wins: re-ingesting it with another repository changes nothing."""
    first = await memory.ingest_run(run_record(run_id="5"))
    moved = run_record(run_id="5", sessions=[{"session_id": "s1", "cwd": "/srv/b", "repo": "forge.example/acme/billing"}])
    before = await stored_run_record(memory, "api-fixer", "5")
    second = await memory.ingest_run(moved)
    assert second == {"harness": "api-fixer", "run_id": "5", "outcome": "duplicate", "episode_id": first["episode_id"]}
    view = await memory.get_episode(first["episode_id"])
    assert view["scope"] == f"project:{API}" and view["episode"]["repo"] == API
    assert [i["provider"] for i in view["index"]] == ["builtin"]
    index_scope = await memory.store.read(lambda db: db.execute("SELECT DISTINCT scope FROM memory_index").fetchall())
    assert index_scope == [(f"project:{API}",)]
    assert await stored_run_record(memory, "api-fixer", "5") == before


# -- REQ-9 storage side -------------------------------------------------------------------------------

@pytest.mark.req9
async def test_recording_the_same_run_twice_adds_no_rows(memory: MemoryService) -> None:
    first = await memory.ingest_run(example("run-42-api-fixer.json"))
    tables = ("runs", "run_paths", "episodes", "memory_index", "pending", "builtin_docs")
    counts = [await count(memory, t) for t in tables]
    assert counts == [1, 3, 1, 1, 0, 1]
    second = await memory.ingest_run(example("run-42-api-fixer.json"))
    assert second["episode_id"] == first["episode_id"] and second["outcome"] == "duplicate"
    assert [await count(memory, t) for t in tables] == counts
    row = await memory.store.read(lambda db: db.execute(
        "SELECT provider, provider_id, episode_id, scope, forgotten_at FROM memory_index").fetchone())
    assert row == ("builtin", first["episode_id"], first["episode_id"], f"project:{API}", None)
    assert sample(memory, RECORDED, provider="builtin", outcome="ok") == 1


@pytest.mark.req9
async def test_ids_of_an_episode_forgotten_in_flight_are_indexed_forgotten_and_queued(memory: MemoryService) -> None:
    result = await memory.ingest_run(run_record())
    eid = result["episode_id"]
    at = "2026-11-29T00:00:00.000000Z"
    await memory.store.write(lambda db: db.execute("UPDATE episodes SET forgotten_at = ? WHERE episode_id = ?",
                                                   [at, eid]))
    await memory.store.write(lambda db: add_index_rows(db, provider="zep", episode_id=eid, ids=["z-1"],
                                                       scope="project:forge.example/acme/billing", now=at))
    rows = await memory.store.read(lambda db: db.execute(
        "SELECT provider_id, scope, forgotten_at FROM memory_index WHERE provider = 'zep'").fetchall())
    assert rows == [("z-1", f"project:{API}", at)]  # the stored scope, never the caller's
    pending = await memory.store.read(lambda db: db.execute(
        "SELECT kind, provider, provider_id FROM pending WHERE provider = 'zep'").fetchall())
    assert pending == [("forget", "zep", "z-1")]


@pytest.mark.req5
async def test_a_failed_assembly_writes_nothing(memory: MemoryService, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """git missing for a session that needs it: the ingest fails and neither run nor episode is stored."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    with pytest.raises(MemactorsError):
        await memory.ingest_run(run_record(sessions=[{"session_id": "s1", "cwd": str(tmp_path)}]))
    assert [await count(memory, t) for t in ("runs", "episodes", "pending")] == [0, 0, 0]
    monkeypatch.undo()
    await memory.ingest_run(run_record())  # the assembler survived
    assert await count(memory, "episodes") == 1


# -- REQ-7 summaries ----------------------------------------------------------------------------------

@pytest.mark.req7
async def test_req7_one_summary_per_episode_redacted_again_and_rendered(make_holder: Holder) -> None:
    async with run_fake_model_api(behaviour=FakeBehaviour(chat_reply={"summary": f"Fixed it with {GHP}."})) as fake:
        async with service(make_holder(model_api(fake))) as svc:
            result = await svc.ingest_run(example("run-42-api-fixer.json"))
            await svc.ingest_run(example("run-42-api-fixer.json"))  # a duplicate asks for nothing
            view = await svc.get_episode(result["episode_id"])
            assert view["episode"]["summary"] == "Fixed it with [REDACTED]."
            assert "summary: Fixed it with [REDACTED].\n" in view["text"]
            assert sample(svc, SUMMARIES, outcome="ok") == 1
        chats = fake.requests_to("/v1/chat/completions")
        assert len(chats) == 1
        body = chats[0].body
        assert body["model"] == "u" and "tools" not in body and body["max_tokens"] == 128
        user = body["messages"][-1]["content"]
        assert "run_id: 42\n" in user and "summary: \n" in user  # the episode text, without a summary yet
        assert "Fix the flaky ledger test" not in json.dumps(body)


@pytest.mark.req7
async def test_req7_no_model_api_means_no_summary_not_no_episode(memory: MemoryService) -> None:
    result = await memory.ingest_run(example("run-42-api-fixer.json"))
    assert result["outcome"] == "recorded"
    view = await memory.get_episode(result["episode_id"])
    assert view["episode"]["summary"] is None and "summary: \n" in view["text"]
    assert sample(memory, SUMMARIES, outcome="fallback") == 1
    assert sample(memory, SUMMARIES, outcome="ok") == 0


@pytest.mark.req7
@pytest.mark.parametrize("behaviour", [
    FakeBehaviour(chat_reply={"summary": "x" * 900}),
    FakeBehaviour(chat_reply="this is not json"),
    FakeBehaviour(chat_reply={"summary": "ok", "extra": 1}),
    FakeBehaviour(chat_status=500),
], ids=["900_chars", "non_json", "extra_key", "status_500"])
async def test_req7_an_off_schema_summary_is_discarded(make_holder: Holder, behaviour: FakeBehaviour) -> None:
    async with run_fake_model_api(behaviour=behaviour) as fake, service(make_holder(model_api(fake))) as svc:
        result = await svc.ingest_run(example("run-42-api-fixer.json"))
        assert result["outcome"] == "recorded"
        assert (await svc.get_episode(result["episode_id"]))["episode"]["summary"] is None
        assert sample(svc, SUMMARIES, outcome="fallback") == 1
        assert len(fake.requests_to("/v1/chat/completions")) == 1


@pytest.mark.req7
async def test_summary_false_sends_no_request(make_holder: Holder) -> None:
    extra = "[memory.episodes]\nsummary = false\n"
    async with run_fake_model_api() as fake, service(make_holder(model_api(fake) + extra)) as svc:
        result = await svc.ingest_run(example("run-42-api-fixer.json"))
        assert (await svc.get_episode(result["episode_id"]))["episode"]["summary"] is None
        assert fake.requests == []
        assert sample(svc, SUMMARIES, outcome="fallback") == 0 and sample(svc, SUMMARIES, outcome="ok") == 0


def _real_time_then_autojump(clock: trio.testing.MockClock) -> Callable[[], None]:
    """Run on real time while real I/O starts up (provider handshake, HTTP server); then jump."""
    clock.autojump_threshold = float("inf")
    clock.rate = 1.0

    def jump() -> None:
        clock.rate = 0.0
        clock.autojump_threshold = 0.0

    return jump


@pytest.mark.req7
async def test_req7_a_slow_model_never_delays_recording_past_the_deadline(
    make_holder: Holder, trio_clock: trio.testing.MockClock
) -> None:
    """The assembler with a real summary actor and a model that answers after 600 s: back within the
    summary deadline (10 s of trio time), the episode without a summary."""
    async with run_fake_model_api(behaviour=FakeBehaviour(chat_delay=600)) as fake:
        holder = make_holder(model_api(fake))
        metrics = Metrics()
        summary = SummaryActor(settings=model_api_settings(holder.current.model_api), budget=None, metrics=metrics)

        async def no_pull_request(repo: str, branch: str | None) -> None:
            return None

        async with trio.open_nursery() as nursery:
            summary_address = await nursery.start(summary.run)
            assembler = Assembler(config=lambda: holder.current, pull_request_for=no_pull_request,
                                  summarize=lambda text, episode: summary_address.ask(Summarize(text, episode)),
                                  metrics=metrics)
            address = await nursery.start(assembler.run)
            record = load_run_record(json.dumps(example("run-42-api-fixer.json")))
            assembled, _ = await within(trio_clock, SUMMARY_DEADLINE, lambda: address.ask(Assemble(record)))
            nursery.cancel_scope.cancel()
    assert assembled.summary is not None and assembled.summary.outcome == "fallback"
    assert assembled.episode is not None and assembled.episode.summary is None
    assert metrics.registry.get_sample_value(SUMMARIES, {"outcome": "fallback"}) == 1


@pytest.mark.req7
async def test_req7_a_slow_model_still_records_the_episode_without_summary(
    make_holder: Holder, autojump_clock: trio.testing.MockClock
) -> None:
    jump = _real_time_then_autojump(autojump_clock)
    async with run_fake_model_api(behaviour=FakeBehaviour(chat_delay=600)) as fake:
        async with service(make_holder(model_api(fake))) as svc:
            jump()
            result = await svc.ingest_run(example("run-42-api-fixer.json"))
            view = await svc.get_episode(result["episode_id"])
            assert view["episode"]["summary"] is None and view["episode"]["run_id"] == "42"
            assert sample(svc, SUMMARIES, outcome="fallback") == 1


# -- through the real CLI against a running daemon ----------------------------------------------------

def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.slow
@pytest.mark.req5
def test_req5_a_failed_run_yields_a_complete_episode_shown_by_the_cli(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard: a loaded machine takes a minute to start a daemon
        while not (state / "daemon.json").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "daemon exited"
            assert time.monotonic() < deadline, "daemon did not start"
            time.sleep(0.05)
        run42 = str(EXAMPLES / "run-42-api-fixer.json")
        ingest = _cli(env, "runs", "ingest", run42, "--json")
        assert ingest.returncode == 0, ingest.stderr
        episode_id = json.loads(ingest.stdout)[0]["episode_id"]
        shown = _cli(env, "memory", "episodes", episode_id, "--json")
        assert shown.returncode == 0, shown.stderr
        ep = json.loads(shown.stdout)["episode"]
        assert ep["files_touched"] == ["internal/clock/clock.go", "internal/ledger/reconcile.go",
                                       "internal/ledger/reconcile_test.go"]
        assert ep["verify_failures"] == [{"error_class": "test_failure", "count": 2}]
        assert ep["outcome"] == "failed" and ep["run_id"] == "42" and ep["repo"] == API
        assert "Fix the flaky ledger test" not in shown.stdout and "prompt" not in shown.stdout
        text = _cli(env, "memory", "episodes", episode_id)
        assert "verify_failures: test_failure: 2\n" in text.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "Traceback" not in err
