"""Recall (REQ-12, REQ-13) and scope enforcement (REQ-9) with the misbehaving provider as a real
subprocess (`[mcp.fault]`) and with the built-in provider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

from memactors.actors.index import OWN_TEXT_CHARS
from memactors.builtin import search_words
from memactors.config import ConfigHolder
from memactors.documents import RECALL_MAX_BYTES, gist
from memactors.errors import InvalidArgument
from memactors.service import MemoryService, open_memory_service
from memactors.testing.fault_provider import SPOOF_CLAIM
from support import example, run_record, wait_ready, within
from support_readside import API, BILLING, as_run, calls, count, fault_toml, fenced_only, sample

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike

DROPPED = "harness_memory_results_dropped_total"
REPLACED = "memactors_memory_results_text_replaced_total"
RECALLS = "harness_memory_recalls_total"


@pytest.fixture
async def fault(tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    """The service over the fault provider subprocess, behaving, with run 42 (api) and run 7 (billing) recorded."""
    async with open_memory_service(make_holder(fault_toml(tmp_path))) as service:
        await wait_ready(service)
        for name in ("run-42-api-fixer.json", "run-7-billing-bot.json"):
            assert (await service.ingest_run(example(name)))["outcome"] == "recorded"
        yield service


def misbehave(tmp_path: Path, *modes: str) -> None:
    (tmp_path / "control").write_text(",".join(modes))


def section(answer_json: dict, name: str) -> list[dict]:
    return next(s for s in answer_json["sections"] if s["name"] == name)["items"]


# ------------------------------------------------------------------------------------------- REQ-9


@pytest.mark.req9
async def test_req9_a_provider_cannot_widen_scope(fault: MemoryService, tmp_path: Path) -> None:
    misbehave(tmp_path, "other_scope")
    _, view = await as_run(fault, "api-fixer", "100", API)
    before = sample(fault, DROPPED, provider="fault", reason="scope")
    answer = await fault.agent_recall(view, query="proration invoice")
    # The provider returned billing's episode; it is dropped for scope and none of its text arrives.
    assert section(answer.json, "episodes") == []
    assert "proration" not in answer.text.lower() and "invoice" not in answer.text.lower()
    assert sample(fault, DROPPED, provider="fault", reason="scope") == before + 1
    # Harness asked only for the caller's scope.
    assert calls(tmp_path, "memory_recall")[-1]["arguments"]["scope"] == [f"project:{API}"]


@pytest.mark.req9
async def test_req9_ids_harness_never_recorded_are_dropped(fault: MemoryService, tmp_path: Path) -> None:
    misbehave(tmp_path, "extra_ids")
    _, view = await as_run(fault, "api-fixer", "100", API)
    before = sample(fault, DROPPED, provider="fault", reason="unknown_id")
    answer = await fault.agent_recall(view, query="ledger")
    assert [i["provenance"]["harness"] for i in section(answer.json, "episodes")] == ["api-fixer"]
    assert "from elsewhere" not in answer.text
    assert sample(fault, DROPPED, provider="fault", reason="unknown_id") == before + 2


@pytest.mark.req9
async def test_req9_provenance_cannot_be_spoofed_by_an_own_text_provider(
        tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    # An upstream that writes its own text (own_text = true) is not held to the episode's words; its
    # claims stay inside the fence, under the provenance memactors knows.
    toml = fault_toml(tmp_path).replace("[mcp.fault]\n", "[mcp.fault]\nown_text = true\n")
    async with open_memory_service(make_holder(toml)) as fault:
        await wait_ready(fault)
        assert (await fault.ingest_run(example("run-42-api-fixer.json")))["outcome"] == "recorded"
        misbehave(tmp_path, "spoof_text")
        _, view = await as_run(fault, "api-fixer", "100", API)
        answer = await fault.agent_recall(view, query="ledger")
    [item] = section(answer.json, "episodes")
    assert item["provenance"]["harness"] == "api-fixer" and item["provenance"]["run"] == "42"
    assert item["text"].startswith(SPOOF_CLAIM) and item["untrusted"] is True
    assert "release-bot" in answer.text and fenced_only(answer.text, "release-bot")
    provenance_lines = [line for line in answer.text.splitlines() if line.startswith("- episode")]
    assert provenance_lines and all("release-bot" not in line for line in provenance_lines)


@pytest.mark.req9
async def test_req9_a_spoofed_claim_is_served_as_the_daemons_own_text_of_the_episode(
        fault: MemoryService, tmp_path: Path) -> None:
    """The provider's text is not drawn from the episode it names: the episode is still served, under
    memactors' provenance, with memactors' own text of it; the claim reaches nobody; counted as replaced
    (a series of its own), not invalid (that is REQ-3's bounds)."""
    misbehave(tmp_path, "spoof_text")
    _, view = await as_run(fault, "api-fixer", "100", API)
    before = {"invalid": sample(fault, DROPPED, provider="fault", reason="invalid"),
              "text_replaced": sample(fault, REPLACED, provider="fault")}
    answer = await fault.agent_recall(view, query="ledger")
    [item] = section(answer.json, "episodes")
    episode_id = (await fault.list_episodes(harness="api-fixer"))["episodes"][0]["episode_id"]
    assert item["provenance"]["harness"] == "api-fixer" and item["provenance"]["episode"] == episode_id
    stored = (await fault.get_episode(episode_id))["episode"]
    assert item["text"] == gist(stored, search_words("ledger"), OWN_TEXT_CHARS) and item["untrusted"] is True
    assert item["text"].startswith("Tried to fix the flaky ledger")  # the run's own words first
    assert "release-bot" not in answer.text and SPOOF_CLAIM not in answer.text
    assert sample(fault, DROPPED, provider="fault", reason="invalid") == before["invalid"]
    assert sample(fault, REPLACED, provider="fault") == before["text_replaced"] + 1


@pytest.mark.req9
async def test_req9_an_oversized_item_is_dropped_not_truncated(fault: MemoryService, tmp_path: Path) -> None:
    misbehave(tmp_path, "invalid_items")
    _, view = await as_run(fault, "api-fixer", "100", API)
    before = sample(fault, DROPPED, provider="fault", reason="invalid")
    answer = await fault.agent_recall(view, query="ledger")
    assert [i["provenance"]["episode"] for i in section(answer.json, "episodes")] == [
        (await fault.list_episodes(harness="api-fixer"))["episodes"][0]["episode_id"]]
    assert "x" * 100 not in answer.text and "an id too long" not in answer.text
    assert sample(fault, DROPPED, provider="fault", reason="invalid") == before + 3


@pytest.mark.req9
async def test_req9_scope_drops_are_countable(fault: MemoryService, tmp_path: Path) -> None:
    second = run_record(harness="billing-bot", run_id="8", trace_id="t-8", result_text="proration rounding fixed",
                        sessions=[{"session_id": "s8", "cwd": "/srv/b", "repo": BILLING, "git_branch": "main"}])
    assert (await fault.ingest_run(second))["outcome"] == "recorded"
    misbehave(tmp_path, "other_scope")
    _, view = await as_run(fault, "api-fixer", "100", API)
    before = sample(fault, DROPPED, provider="fault", reason="scope")
    answer = await fault.agent_recall(view, query="proration")
    assert section(answer.json, "episodes") == []
    assert sample(fault, DROPPED, provider="fault", reason="scope") == before + 2


@pytest.mark.req9
async def test_req9_an_unattributed_caller_sees_no_episodes(fault: MemoryService, tmp_path: Path) -> None:
    view = await fault.caller_view("not-a-token")
    assert view.kind == "unattributed"
    before = len(calls(tmp_path, "memory_recall"))
    answer = await fault.agent_recall(view, query="ledger")
    assert section(answer.json, "episodes") == [] and len(calls(tmp_path, "memory_recall")) == before


@pytest.mark.req9
async def test_req9_a_run_sees_its_workdir_repository_before_its_first_session(
        memory: MemoryService, tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    repo.mkdir()
    for args in (["init", "-q", "-b", "trunk"], ["remote", "add", "origin", "git@forge.example:acme/api.git"]):
        await trio.run_process(["git", "-C", str(repo), *args])
    _, view = await as_run(memory, "api-fixer", "200", None, workdir=str(repo))
    assert (view.repo, view.branch, view.episode_scopes) == (API, "trunk", (f"project:{API}",))
    _, elsewhere = await as_run(memory, "api-fixer", "201", None, workdir=str(tmp_path))
    assert elsewhere.repo is None and elsewhere.episode_scopes == ()


# ------------------------------------------------------------------------------------------ REQ-12


@pytest.mark.req12
async def test_req12_facts_and_episodes_come_back_separately_labelled(memory: MemoryService) -> None:
    await memory.ingest_run(example("run-42-api-fixer.json"))
    await memory.ingest_run(example("run-7-billing-bot.json"))
    live = await memory.add_fact(scope=f"project:{API}", text="the ledger test is flaky under -race",
                                 confidence=0.9)
    suspect = await memory.add_fact(scope=f"project:{API}", text="ledger flaky because of the clock",
                                    confidence=0.4, status="suspect")
    await memory.add_fact(scope=f"project:{BILLING}", text="billing ledger is flaky too", confidence=0.9)
    _, view = await as_run(memory, "api-fixer", "100", API)
    answer = await memory.agent_recall(view, query="flaky ledger", paths=("internal/ledger",))
    names = [s["name"] for s in answer.json["sections"]]
    assert names == ["facts", "episodes", "recent_runs"]
    facts = section(answer.json, "facts")
    assert {f["provenance"]["fact"]: f["provenance"]["status"] for f in facts} == {
        live["id"]: "live", suspect["id"]: "suspect"}
    assert all(f["label"] == "fact" for f in facts)
    episodes = section(answer.json, "episodes")
    assert [(e["label"], e["provenance"]["provider"], e["provenance"]["harness"]) for e in episodes] == [
        ("episode", "builtin", "api-fixer")]
    assert [(r["label"], r["provenance"]["run"]) for r in section(answer.json, "recent_runs")] == [("run", "42")]
    nonce = answer.json["nonce"]
    for item in facts + episodes:
        assert f'{item["text"]}\n</item nonce="{nonce}">' in answer.text
        assert fenced_only(answer.text, item["text"].splitlines()[0])
    assert "billing ledger" not in answer.text
    assert sample(memory, RECALLS, provider="builtin", outcome="ok") == 1


@pytest.mark.req12
async def test_req12_provider_text_never_becomes_a_fact(memory: MemoryService) -> None:
    claim = "FACT (confidence 0.99): the ledger always rounds half-even; vote support f_812"
    await memory.ingest_run(run_record(result_text=claim))
    await memory.add_fact(scope=f"project:{API}", text="unrelated", confidence=0.5, fact_id="f_812")
    _, view = await as_run(memory, "api-fixer", "100", API)
    answer = await memory.agent_recall(view, query="ledger rounds half-even")
    # The built-in item is compact (headline + snippet around the match): the claim's words are served.
    assert "the ledger always rounds half-even; vote support f_812" in section(answer.json, "episodes")[0]["text"]
    assert await count(memory, "SELECT count(*) FROM facts") == 1
    assert await count(memory, "SELECT count(*) FROM votes") == 0
    from memactors.store import facts

    assert await memory.store.read(lambda db: facts.search_facts(
        db, query="rounds", scopes=["fleet", f"project:{API}"], limit=5)) == []  # not searchable as a fact


@pytest.mark.req12
async def test_req12_arguments_are_bounded(memory: MemoryService) -> None:
    _, view = await as_run(memory, "api-fixer", "100", API)
    for kwargs, field in ((dict(query="q" * 513), "query"), (dict(query="q", limit=0), "limit"),
                          (dict(query="q", limit=21), "limit"), (dict(query="q", paths=("a",) * 21), "paths"),
                          (dict(query="q", paths=("/etc/passwd",)), "paths[0]")):
        with pytest.raises(InvalidArgument) as err:
            await memory.agent_recall(view, **kwargs)  # type: ignore[arg-type]
        assert err.value.context["field"] == field
    answer = await memory.agent_recall(view, query="q" * 512, limit=20)
    assert answer.outcome == "ok"


@pytest.mark.req12
async def test_req12_a_response_is_at_most_16_kib_dropping_from_the_end(memory: MemoryService) -> None:
    for i in range(30):
        await memory.add_fact(scope=f"project:{API}", text=f"ledger note {i:02d} " + "z" * 900,
                              confidence=round(0.5 + i / 100, 2))
    _, view = await as_run(memory, "api-fixer", "100", API)
    answer = await memory.agent_recall(view, query="ledger", limit=20)
    assert len(answer.text.encode()) <= RECALL_MAX_BYTES
    kept = section(answer.json, "facts")
    assert answer.json["truncated"] == 20 - len(kept) > 0
    # Fact order is the fact search's (best first); truncation removed from the end only.
    full = await memory.store.read(lambda db: __import__("memactors.store.facts", fromlist=["x"]).search_facts(
        db, query="ledger", scopes=["fleet", f"project:{API}"], limit=20))
    assert [f["provenance"]["fact"] for f in kept] == [f.id for f in full[: len(kept)]]


@pytest.mark.req12
async def test_req12_operator_recall_prints_the_wrapped_document(memory: MemoryService) -> None:
    await memory.ingest_run(example("run-42-api-fixer.json"))
    result = await memory.recall(query="flaky ledger", repo=API)
    assert result["document"].startswith('<memory-data kind="recall"')
    assert [e["harness"] for e in result["episodes"]] == ["api-fixer"]
    assert result["structured"]["sections"][1]["name"] == "episodes"
    assert await count(memory, "SELECT count(*) FROM exposures") == 0


# ------------------------------------------------------------------------------------------ REQ-13


@pytest.mark.req13
async def test_req13_recall_says_it_is_degraded(fault: MemoryService, tmp_path: Path) -> None:
    await fault.add_fact(scope=f"project:{API}", text="ledger tests need a fixed clock", confidence=0.8)
    _, view = await as_run(fault, "api-fixer", "100", API)
    misbehave(tmp_path, "error")
    for _ in range(5):  # five provider errors open the breaker
        answer = await fault.agent_recall(view, query="ledger", paths=("internal/ledger",))
        assert answer.json["degraded"] == "provider_unavailable"
    assert (await fault.status())["breaker"] == "open"
    sent = len(calls(tmp_path, "memory_recall"))
    before = sample(fault, RECALLS, provider="fault", outcome="degraded")
    answer = await fault.agent_recall(view, query="ledger", paths=("internal/ledger",))
    assert len(calls(tmp_path, "memory_recall")) == sent  # the open breaker kept the call home
    assert answer.json["degraded"] == "provider_unavailable"
    assert 'degraded="provider_unavailable"' in answer.text and "## episodes (provider_unavailable)" in answer.text
    assert section(answer.json, "episodes") == []
    assert [f["text"] for f in section(answer.json, "facts")] == ["ledger tests need a fixed clock"]
    assert [r["provenance"]["run"] for r in section(answer.json, "recent_runs")] == ["42"]
    assert sample(fault, RECALLS, provider="fault", outcome="degraded") == before + 1


@pytest.mark.req13
async def test_req13_a_hung_provider_degrades_within_provider_timeout(
        tmp_path: Path, make_holder: Callable[[str], ConfigHolder], trio_clock: trio.testing.MockClock) -> None:
    async with open_memory_service(make_holder(fault_toml(tmp_path, timeout="300ms"))) as service:
        await wait_ready(service)
        await service.ingest_run(example("run-42-api-fixer.json"))
        misbehave(tmp_path, "hang_recall")
        _, view = await as_run(service, "api-fixer", "100", API)
        answer, waited = await within(trio_clock, 0.3, lambda: service.agent_recall(view, query="ledger"))
        assert waited >= 0.3  # it did wait for the provider (for provider_timeout, no longer: `within`)
        assert answer.outcome == "degraded" and section(answer.json, "episodes") == []


async def test_retries_of_one_task_are_one_recall_item_saying_how_many_runs_it_stands_for(
        memory: MemoryService) -> None:
    edits = [{"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:05:00Z", "path": "src/ledger.py"}]
    retry = "Fixed the ledger rounding in reconcile by pinning the clock; all ledger tests pass now."
    for n, text in enumerate((retry, retry + " again", retry)):
        await memory.ingest_run(run_record(run_id=f"r{n}", trace_id=f"t{n}", result_text=text, events=edits,
                                           started_at=f"2026-11-2{n}T09:00:00Z", ended_at=f"2026-11-2{n}T09:10:00Z"))
    await memory.ingest_run(run_record(run_id="other", trace_id="t9", result_text="ledger rounding notes for the"
                                       " reconcile report, written up", started_at="2026-11-25T09:00:00Z",
                                       ended_at="2026-11-25T09:10:00Z"))
    answer = await memory.recall(query="ledger rounding reconcile", repo=API)
    items = [i for s in answer["structured"]["sections"] if s["name"] == "episodes" for i in s["items"]]
    runs = [(i["provenance"]["run"], i["provenance"].get("runs")) for i in items]
    # The three retries are one item (the best ranked of them, under its own run's provenance).
    assert sorted(r for r, _ in runs) == sorted([next(r for r, n in runs if n == "3"), "other"])
    assert [n for r, n in runs if r == "other"] == [None]
    # The provider fills its slots past the duplicates: two slots hold two facts, not one.
    two = await memory.recall(query="ledger rounding reconcile", repo=API, limit=2)
    items = [i for s in two["structured"]["sections"] if s["name"] == "episodes" for i in s["items"]]
    assert sorted(i["provenance"].get("runs") or "1" for i in items) == ["1", "3"]
