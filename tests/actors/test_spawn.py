"""Prompt one-shots (REQ-16, REQ-20), exposure before spawn (REQ-17) and the dead provider (REQ-13).

Config scenarios live with the config tests: tests/config/test_config.py::test_req16_a_project_file_cannot_turn_it_on
and tests/config/test_config.py::test_req20_memory_briefing_does_not_open_the_event_fence.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio
from loguru import logger

from memactors.actors.spawn import prepare_spawn
from memactors.agents.prompt import ARG_MAX_SINGLE
from memactors.config import ConfigHolder
from memactors.service import MemoryService, open_memory_service
from support import run_record, wait_ready, within
from support_readside import API, as_run, count, fault_toml, sample

TRIAGE = (
    '[harness.nightly-triage]\nharness = "claude-code"\nprompt_file = "~/prompts/triage.md"\n'
    "memory_briefing = true\n"
)
FENCE = re.compile(
    r'\A<untrusted-data source="harness-memory" field="briefing" nonce="(?P<nonce>[^"]+)">\n'
    r"(?P<briefing>.*)\n</untrusted-data nonce=\"(?P=nonce)\">\n\n(?P<prompt>.*)\Z",
    re.DOTALL,
)
BRIEFINGS = "harness_memory_briefings_total"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "triage.md").write_text("Triage the open issues.\n\n  Keep   spacing.\n")
    return tmp_path


@pytest.fixture
async def triage(home: Path, make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    async with open_memory_service(make_holder(TRIAGE + '[harness.plain]\nharness = "codex"\nprompt = "triage"\n'
                                               "memory_briefing = true\n")) as service:
        await wait_ready(service)
        await service.add_fact(scope=f"project:{API}", text="ledger tests need a fixed clock", confidence=0.9,
                               fact_id="f_812")
        yield service


@pytest.fixture
def warnings() -> list[str]:
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(f"{m.record['message']} {m.record['extra']}"), level="WARNING")
    yield seen  # type: ignore[misc]
    logger.remove(sink)


@pytest.mark.req16
async def test_req16_a_one_shot_receives_the_fenced_briefing(triage: MemoryService, home: Path) -> None:
    await as_run(triage, "nightly-triage", "n1", API)
    plan = await prepare_spawn(triage, harness="nightly-triage", run_id="n1", workdir=str(home),
                               base_argv=["claude", "-p"])
    assert plan.argv[:2] == ("claude", "-p") and plan.composed and plan.skipped is None
    match = FENCE.match(plan.argv[-1])
    assert match is not None
    assert match["prompt"] == (home / "prompts" / "triage.md").read_text()  # byte for byte
    assert match["nonce"] not in match["briefing"]
    assert match["briefing"].startswith('<memory-data kind="briefing"') and "f_812" in match["briefing"]
    cached = await triage.store.read(lambda db: db.execute(
        "SELECT document FROM briefings WHERE run_id = 'n1'").fetchone()[0])
    assert cached == match["briefing"]
    assert sample(triage, BRIEFINGS, harness="nightly-triage", delivery="prompt", outcome="ok") == 1


@pytest.mark.req16
async def test_req16_a_respawn_reuses_its_briefing(triage: MemoryService, home: Path) -> None:
    await as_run(triage, "nightly-triage", "n1", API)
    first = await prepare_spawn(triage, harness="nightly-triage", run_id="n1", workdir=str(home), base_argv=["c"])
    await triage.add_fact(scope=f"project:{API}", text="a later fact", confidence=1.0)
    second = await prepare_spawn(triage, harness="nightly-triage", run_id="n1", workdir=str(home), base_argv=["c"])
    a, b = FENCE.match(first.argv[-1]), FENCE.match(second.argv[-1])
    assert a and b and a["briefing"] == b["briefing"] and a["nonce"] != b["nonce"]  # fresh fence per spawn


@pytest.mark.req16
async def test_req16_an_empty_briefing_prepends_nothing(triage: MemoryService, home: Path) -> None:
    plan = await prepare_spawn(triage, harness="plain", run_id="p1", workdir=str(home), base_argv=["codex"])
    assert plan.argv == ("codex", "triage") and plan.skipped == "empty"  # home is in no repository
    assert sample(triage, BRIEFINGS, harness="plain", delivery="prompt", outcome="empty") == 1


@pytest.mark.req16
async def test_req16_an_oversized_prompt_still_runs(
        home: Path, make_holder: Callable[[str], ConfigHolder], warnings: list[str]) -> None:
    big = "p" * (127 * 1024)
    toml = (f'[harness.huge]\nharness = "claude-code"\nprompt = "{big}"\nmemory_briefing = true\n'
            "briefing_max_chars = 4000\n")
    async with open_memory_service(make_holder(toml)) as service:
        await wait_ready(service)
        for i in range(40):
            await service.add_fact(scope=f"project:{API}", text=f"fact {i} " + "q" * 80, confidence=0.5)
        for i in range(10):
            await service.report_presence(harness=f"other-{i}", run_id=f"o{i}", session_id="s", repo=API,
                                          branch="main", paths=(f"pkg/{i}/file.go",), ttl_seconds=3600)
        await as_run(service, "huge", "h1", API)
        plan = await prepare_spawn(service, harness="huge", run_id="h1", workdir=str(home), base_argv=["claude"])
        assert plan.argv == ("claude", big) and not plan.composed and plan.skipped == "argument_limit"
        assert plan.briefing_bytes > 2000  # with the fence, it really would not have fitted
        assert len(big) + plan.briefing_bytes + 1 > ARG_MAX_SINGLE
        assert any("briefing skipped" in w and "'harness': 'huge'" in w and "'run': 'h1'" in w for w in warnings)
        assert sample(service, BRIEFINGS, harness="huge", delivery="prompt", outcome="skipped") == 1
        # Not prepended, so not shown: no exposure.
        assert await count(service, "SELECT count(*) FROM exposures") == 0


@pytest.mark.req20
async def test_req20_the_stored_prompt_is_unchanged(triage: MemoryService, home: Path) -> None:
    await as_run(triage, "plain", "p2", API)
    plan = await prepare_spawn(triage, harness="plain", run_id="p2", workdir=str(home), base_argv=["codex"])
    match = FENCE.match(plan.argv[-1])
    assert match and match["prompt"] == "triage"
    assert triage.config.harness["plain"].prompt == "triage"
    await triage.ingest_run(run_record(harness="plain", run_id="p2", prompt="triage"))
    stored = await triage.store.read(lambda db: db.execute(
        "SELECT rr.record FROM runs r JOIN run_records rr ON rr.id = r.record_id WHERE r.run_id = 'p2'").fetchone()[0])
    assert "untrusted-data" not in stored and match["nonce"] not in stored
    raw = b"".join(p.read_bytes() for p in (home / "state").glob("memactors.db*"))
    assert match["nonce"].encode() not in raw and b"untrusted-data" not in raw


@pytest.mark.req20
async def test_req20_a_template_is_rendered_before_the_briefing_is_prepended(
        home: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    toml = ('[harness.t]\nharness = "claude-code"\nmemory_briefing = true\nuntrusted_inline = true\n'
            'prompt_template = "Fix {{untrusted event.title}} now"\n')
    async with open_memory_service(make_holder(toml)) as service:
        await wait_ready(service)
        await service.add_fact(scope=f"project:{API}", text="some fact", confidence=0.5)
        await as_run(service, "t", "t1", API)
        plan = await prepare_spawn(service, harness="t", run_id="t1", workdir=str(home), base_argv=["c"],
                                   event={"title": "the build"})
        match = FENCE.match(plan.argv[-1])
        assert match and match["prompt"].startswith('Fix <untrusted-data source="event" field="title"')
        assert "the build" in match["prompt"] and match["prompt"].endswith(" now")


@pytest.mark.req17
async def test_req17_a_prepended_briefing_blocks_a_vote(triage: MemoryService, home: Path) -> None:
    await as_run(triage, "nightly-triage", "n1", API)
    plan = await prepare_spawn(triage, harness="nightly-triage", run_id="n1", workdir=str(home), base_argv=["c"])
    assert "f_812" in plan.argv[-1] and plan.exposed == 1
    rows = await triage.store.read(lambda db: db.execute(
        "SELECT surface, call_id FROM exposures WHERE run_id = 'n1' AND fact_id = 'f_812'").fetchall())
    assert rows == [("briefing_prompt", None)]
    vote = await triage.cast_vote(fact_id="f_812", run_id="n1", harness="nightly-triage", stance="support")
    assert vote["counted"] is False
    assert await count(triage, "SELECT count(*) FROM votes WHERE fact_id = 'f_812'") == 1
    fresh = await triage.cast_vote(fact_id="f_812", run_id="other", harness="nightly-triage", stance="support")
    assert fresh["counted"] is True


@pytest.mark.req17
async def test_req17_facts_are_left_out_of_the_prompt_when_exposure_fails(triage: MemoryService, home: Path) -> None:
    await as_run(triage, "nightly-triage", "n1", API)
    await triage.store.write(lambda db: db.execute(
        "CREATE TRIGGER no_exposure BEFORE INSERT ON exposures BEGIN SELECT RAISE(ABORT, 'no'); END"))
    plan = await prepare_spawn(triage, harness="nightly-triage", run_id="n1", workdir=str(home), base_argv=["c"])
    assert "f_812" not in plan.argv[-1] and "ledger tests need a fixed clock" not in plan.argv[-1]
    assert plan.exposed == 0


@pytest.mark.req13
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
async def test_req13_a_dead_provider_leaves_spawns_alone(
        home: Path, tmp_path: Path, make_holder: Callable[[str], ConfigHolder], sig: signal.Signals,
        trio_clock: trio.testing.MockClock) -> None:
    pidfile = tmp_path / "provider.pid"
    async with open_memory_service(make_holder(fault_toml(tmp_path, timeout="500ms", pidfile=pidfile) + TRIAGE)) \
            as service:
        await wait_ready(service)
        await service.add_fact(scope=f"project:{API}", text="ledger tests need a fixed clock", confidence=0.9)
        await as_run(service, "nightly-triage", "n1", API)
        pid = int(pidfile.read_text())
        os.kill(pid, sig)
        try:
            plan, _ = await within(trio_clock, 0.5, lambda: prepare_spawn(
                service, harness="nightly-triage", run_id="n1", workdir=str(home), base_argv=["claude"]))
            assert plan.composed and plan.degraded == "provider_unavailable"
            assert "## episodes (provider_unavailable)" in plan.argv[-1]
            # The run record is unaffected: it is stored, its episode queued for a later record.
            result = await service.ingest_run(run_record(harness="nightly-triage", run_id="n1"))
            assert result["outcome"] in ("queued", "recorded")
            assert await count(service, "SELECT count(*) FROM runs WHERE run_id = 'n1'") == 1
        finally:
            if sig == signal.SIGSTOP:
                os.kill(pid, signal.SIGCONT)
