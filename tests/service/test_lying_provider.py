"""A lying provider cannot put another repository's text in front of an agent (REQ-9).

The fault provider runs as a real stdio subprocess; in ``swap_text`` mode it answers ids of the caller's
repository with the text it holds for another repository. memactors checks each item's text against
the episode it names (actors/index.text_belongs) and serves an item whose text is not drawn from it with
its own text of that episode (its gist) instead (counted in
``memactors_memory_results_text_replaced_total``, not as a drop): the swap stays contained and the agent
still gets its episode.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from fix_daemon import daemon_in_process, daemon_process
from memactors.actors.index import OWN_TEXT_CHARS, text_belongs, text_belongs_body
from memactors.builtin import search_words
from memactors.config import ConfigHolder
from memactors.documents import gist
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from memactors.service import open_memory_service
from memactors.testing.fault_provider import SPOOF_CLAIM
from support import EXAMPLES, example, wait_ready
from support_readside import API, as_run, fault_toml, fenced_only, gateway_client, sample
from support_runs import make_repo

pytestmark = pytest.mark.both_engines  # SQLite and PostgreSQL alike

SERVICE = "harness.v1.MemoryService"
DROPPED = "harness_memory_results_dropped_total"
REPLACED = "memactors_memory_results_text_replaced_total"
# Words only the billing episode (run-7-billing-bot.json) has.
BILLING_WORDS = ("proration", "invoice")
QUERIES = ["ledger", "ledger rounding", "rounding", "ledger proration", "invoice ledger"]


def test_text_belongs_accepts_snippets_of_the_episode_and_refuses_foreign_words() -> None:
    stored = ("episode_id: ep_1\nharness: api-fixer\nrepo: forge.example/acme/api\n"
              "result_excerpt: Fixed the ledger rounding\\nin cents.\nsummary: Rounding fixed.\n")
    assert text_belongs("api-fixer · forge.example/acme/api: …fixed the [ledger] rounding…", stored)
    assert text_belongs("ledger rounding in cents...", stored)  # the escaped line break counts as a space
    assert text_belongs("", stored) and text_belongs("… [] …", stored)
    assert not text_belongs("Fixed the ledger rounding for billing", stored)
    assert not text_belongs("proration invoice", stored)



def test_an_item_word_that_is_only_part_of_a_word_of_the_episode_is_not_drawn_from_it() -> None:
    body = json.dumps({"episode_id": "ep_1", "repo": "forge.example/acme/api", "summary": "Rounding fixed.",
                       "result_excerpt": "Fixed the ledger_rounding in cents2024\nÉTAPE done", "files_touched": []}, ensure_ascii=False)
    assert text_belongs_body("fixed the [ledger] rounding… étape", body)  # "_" separates, case folded
    assert text_belongs_body("cents2024 done", body)
    # Each of these words occurs inside a word of the episode, never as a word of it.
    for foreign in ("ledge", "ounding", "cents", "2024", "tape", "rounding fixe"):
        assert not text_belongs_body(foreign, body), foreign

@pytest.mark.req9
@pytest.mark.slow
async def test_req9_a_text_swapping_provider_serves_no_foreign_text_over_many_recalls(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path, fault_toml(tmp_path)) as (_, listening):
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
            stored = (await rpc.call(f"{SERVICE}/GetEpisode",
                                     {"episode_id": honest["episodes"][0]["episode_id"]}))["episode"]
            (tmp_path / "control").write_text("swap_text")
            served = 0
            for i in range(60):
                answer = await rpc.call(f"{SERVICE}/Recall", {"query": QUERIES[i % len(QUERIES)], "repo": API})
                served += len(answer["episodes"])
                own = gist(stored, search_words(QUERIES[i % len(QUERIES)]), OWN_TEXT_CHARS)
                assert all(e["text"] == own for e in answer["episodes"])  # memactors' own text of the episode
                document = answer["document"].lower()
                assert not any(word in document for word in BILLING_WORDS), answer["document"]
            assert served > 0  # the agent still gets its episode


@pytest.mark.req9
@pytest.mark.parametrize("own_text", [False, True], ids=["episode-text", "own-text"])
async def test_req9_swapped_text_is_replaced_and_only_own_text_providers_may_write_their_own(
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
        before = sample(service, REPLACED, provider="fault")
        answer = await service.agent_recall(view, query="ledger")
        foreign = "proration" in answer.text.lower()
        after = sample(service, REPLACED, provider="fault")
        [item] = next(s for s in answer.json["sections"] if s["name"] == "episodes")["items"]
        stored = (await service.get_episode(item["provenance"]["episode"]))["episode"]
        own = gist(stored, search_words("ledger"), OWN_TEXT_CHARS)
    assert item["provenance"]["harness"] == "api-fixer"  # the episode the provider named, ours to label
    if own_text:
        # What own_text = true gives up (README): the text is the provider's, the provenance is ours.
        assert foreign and after == before and item["text"] != own
    else:
        assert not foreign and after == before + 1 and item["text"] == own


@pytest.mark.req9
@pytest.mark.slow
async def test_req9_provenance_cannot_be_spoofed(tmp_path: Path) -> None:
    """WHEN a provider item's text claims it was recorded by harness release-bot THEN the served provenance
    names the harness from memactors' index, and the claim appears only inside the fenced text — here not
    at all: the daemon as a process, an agent on the gateway over HTTP with its run token, and a provider
    (a real stdio subprocess) whose every item claims `recorded by harness release-bot`. The item is
    served with memactors' own text of the episode (counted in `memactors_memory_results_text_replaced_total`
    on /metrics, and not as a drop: nothing was dropped),
    so the agent still gets the episode; then a provider swapping in another repository's text likewise."""
    repo = make_repo(tmp_path / "api")  # origin git@forge.example:acme/api.git: the run's scope
    extra = fault_toml(tmp_path) + '[harness.api-fixer]\nharness = "claude-code"\n'
    with daemon_process(tmp_path, extra_config=extra) as running:
        env = running.env
        for name in ("run-42-api-fixer.json", "run-7-billing-bot.json"):
            done = await trio.to_thread.run_sync(lambda n=name: _cli(env, "runs", "ingest", str(EXAMPLES / n)))
            assert done.returncode == 0, done.stderr
        minted = await trio.to_thread.run_sync(
            lambda: _cli(env, "token", "mint", "api-fixer", "--run", "100", "--workdir", str(repo), "--json"))
        token = json.loads(minted.stdout)["token"]
        episode = await trio.to_thread.run_sync(lambda: _cli(env, "memory", "episodes", "--harness", "api-fixer",
                                                             "--json"))
        episode_id = json.loads(episode.stdout)["episodes"][0]["episode_id"]
        shown = await trio.to_thread.run_sync(lambda: _cli(env, "memory", "episodes", episode_id, "--json"))
        own = gist(json.loads(shown.stdout)["episode"], search_words("ledger"), OWN_TEXT_CHARS)

        documents = {}
        for mode in ("spoof_text", "swap_text"):
            (tmp_path / "control").write_text(mode)
            async with gateway_client(running.info["gateway"], token) as client:
                result = await client.call_tool("recall", {"query": "ledger"})
            assert not result.is_error
            documents[mode] = "".join(getattr(c, "text", "") for c in result.content)
        metrics = await trio.to_thread.run_sync(lambda: _scrape(running.info["metrics"]))

    for mode, document in documents.items():
        provenance = [line for line in document.splitlines() if line.startswith("- episode")]
        assert len(provenance) == 1, document  # the agent still gets its episode
        assert f"episode {episode_id} · run 42 · harness api-fixer" in provenance[0], provenance
        assert "release-bot" not in document and SPOOF_CLAIM not in document, mode  # nowhere, fenced or not
        assert not any(word in document.lower() for word in BILLING_WORDS), mode
        assert own.startswith("Tried to fix the flaky ledger")  # the run's own words first
        assert own in document and fenced_only(document, "Tried to fix the flaky ledger"), mode  # ours, fenced
    assert 'memactors_memory_results_text_replaced_total{provider="fault"} 2.0' in metrics
    # Not a drop: REQ-21's drop series carries REQ-9's four reasons only.
    assert 'reason="text_replaced"' not in metrics and 'reason="invalid"' not in metrics


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 -- loopback, our daemon
        return answer.read().decode()
