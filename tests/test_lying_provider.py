"""A lying provider cannot put another repository's text in front of an agent (issue 9, REQ-9).

The fault provider runs as a real stdio subprocess; in ``swap_text`` mode it answers ids of the caller's
repository with the text it holds for another repository. memactors checks each item's text against
the episode it names (actors/index.text_belongs) and drops what is not drawn from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from memactors.actors.index import text_belongs
from memactors.config import ConfigHolder, load_config
from memactors.daemon import Listening, run_daemon
from memactors.rpc import connect_rpc, read_token
from memactors.service import open_memory_service
from support import example, wait_ready, write_config
from support_readside import API, as_run, fault_toml, sample

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike (issue 19)

SERVICE = "harness.v1.MemoryService"
DROPPED = "harness_memory_results_dropped_total"
# Words only the billing episode (run-7-billing-bot.json) has.
BILLING_WORDS = ("proration", "invoice")
QUERIES = ["ledger", "ledger rounding", "rounding", "ledger proration", "invoice ledger"]


@asynccontextmanager
async def daemon(tmp_path: Path, extra: str) -> AsyncIterator[Listening]:
    path = write_config(tmp_path, extra)
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(lambda task_status: run_daemon(lambda: load_config(path),
                                                                       task_status=task_status))
        yield listening
        nursery.cancel_scope.cancel()


def test_text_belongs_accepts_snippets_of_the_episode_and_refuses_foreign_words() -> None:
    stored = ("episode_id: ep_1\nharness: api-fixer\nrepo: forge.example/acme/api\n"
              "result_excerpt: Fixed the ledger rounding\\nin cents.\nsummary: Rounding fixed.\n")
    assert text_belongs("api-fixer · forge.example/acme/api: …fixed the [ledger] rounding…", stored)
    assert text_belongs("ledger rounding in cents...", stored)  # the escaped line break counts as a space
    assert text_belongs("", stored) and text_belongs("… [] …", stored)
    assert not text_belongs("Fixed the ledger rounding for billing", stored)
    assert not text_belongs("proration invoice", stored)


@pytest.mark.req9
@pytest.mark.slow
async def test_req9_a_text_swapping_provider_serves_no_foreign_text_over_many_recalls(tmp_path: Path) -> None:
    async with daemon(tmp_path, fault_toml(tmp_path)) as listening:
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "control")) as rpc:
            with trio.fail_after(30):  # the provider subprocess connects after the daemon starts serving
                while (await rpc.call(f"{SERVICE}/Status"))["state"] != "ready":  # noqa: ASYNC110 -- polls the daemon over RPC
                    await trio.sleep(0.05)
            for name in ("run-42-api-fixer.json", "run-7-billing-bot.json"):
                result = await rpc.call(f"{SERVICE}/IngestRun", {"record": example(name)})
                assert result["outcome"] == "recorded", result
            # Behaving, the provider's own text of the api episode is served: the check accepts it.
            honest = await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "repo": API})
            assert len(honest["episodes"]) == 1 and "ledger" in honest["episodes"][0]["text"].lower()
            (tmp_path / "control").write_text("swap_text")
            served = 0
            for i in range(60):
                answer = await rpc.call(f"{SERVICE}/Recall", {"query": QUERIES[i % len(QUERIES)], "repo": API})
                served += len(answer["episodes"])
                document = answer["document"].lower()
                assert not any(word in document for word in BILLING_WORDS), answer["document"]
            assert served == 0


@pytest.mark.req9
@pytest.mark.parametrize("own_text", [False, True], ids=["episode-text", "own-text"])
async def test_req9_swapped_text_is_counted_invalid_and_only_own_text_providers_may_write_their_own(
        own_text: bool, tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    toml = fault_toml(tmp_path)
    if own_text:
        toml = toml.replace("[mcp.fault]\n", "[mcp.fault]\nown_text = true\n")
    async with open_memory_service(make_holder(toml)) as service:
        await wait_ready(service)
        for name in ("run-42-api-fixer.json", "run-7-billing-bot.json"):
            assert (await service.ingest_run(example(name)))["outcome"] == "recorded"
        (tmp_path / "control").write_text("swap_text")
        _, view = await as_run(service, "api-fixer", "100", API)
        before = sample(service, DROPPED, provider="fault", reason="invalid")
        answer = await service.agent_recall(view, query="ledger")
        foreign = "proration" in answer.text.lower()
        after = sample(service, DROPPED, provider="fault", reason="invalid")
    if own_text:
        # What own_text = true gives up (README): the text is the provider's, the provenance is ours.
        assert foreign and after == before
    else:
        assert not foreign and after == before + 1
