"""Briefings that show episodes, and answers that facts do not crowd out, through the surfaces
users touch: the gateway's briefing tool and harness://memory/briefing resource with a real MCP client
and a run token, the recall tool, `memactors memory briefing` as a subprocess, and `memactors run` of a
memory_briefing = true harness with a real child process.

The records look like real runs (a subject line and a few sentences, several files, verify failures).
The tests count and read what a briefing shows; which episodes the provider picks is not theirs to say.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import mcp.types as t
import pytest
import trio

from fix_daemon import daemon_process
from memactors.actors.index import text_belongs
from memactors.builtin import BRIEFING_ITEM_TEXT
from memactors.config import ConfigHolder
from memactors.documents import BRIEFING_MAX_BYTES, gist
from memactors.gateway import BRIEFING_URI
from memactors.service import MemoryService
from support import RESIDENT, serving, write_config
from support_briefing import COMPACT, REPO, empty_run, episode_blocks, real_run, sections
from support_readside import NOW, as_run, fixed_clock, gateway_client
from support_runs import command_harness, make_repo

#: Near-identical facts as a real session had them: the same advice, added again and again.
TZ_FACTS = tuple(
    f"The ledger tests need TZ=UTC and a fixed clock; run them with make test-ledger before {when}"
    for when in ("pushing", "pushing.", "every push", "Pushing!", "you push", "pushing to main", "a push",
                 "pushing again")
)
OTHER_FACTS = (
    "Webhook deliveries retry five times with jitter before they are marked dead.",
    "Invoice exports stream rows to the CSV writer; never load a tenant's line items at once.",
    "Sessions are stored as JSON with a schema version; pickled sessions are dropped at read.",
)


@pytest.fixture
async def gateway(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[tuple[MemoryService, str]]:
    """A resident api-fixer (memory_briefing = true, default briefing_max_chars), its gateway on
    127.0.0.1, and a wall clock fixed at NOW."""
    async with serving(make_holder(RESIDENT), wall_clock=fixed_clock) as answer:
        yield answer


def text_of(result: t.CallToolResult) -> str:
    assert not result.is_error, result
    return "".join(c.text for c in result.content if isinstance(c, t.TextContent))


async def stored_text(service: MemoryService, run_id: str) -> tuple[dict, str]:
    """The daemon's own episode of `run_id` and its text rendering."""
    episode_id = await service.store.read(lambda db: db.execute(
        "SELECT episode_id FROM episodes WHERE run_id = ?", [run_id]).fetchone()[0])
    shown = await service.get_episode(episode_id)
    return shown["episode"], shown["text"]


async def check_episodes_read_well(service: MemoryService, document: str, *, at_least: int = 1) -> list[str]:
    """The briefing shows at least `at_least` episodes, each with the one-line provenance of the daemon's
    row and the built-in provider's text of it whole (REQ-14: placed whole or dropped whole, never
    shortened); their run ids."""
    assert len(document) <= 2000 and len(document.encode()) <= BRIEFING_MAX_BYTES
    blocks = episode_blocks(document)
    assert len(blocks) >= at_least, document
    runs = []
    for line, text in blocks:
        m = COMPACT.match(line)
        assert m, line
        run_id, harness, outcome, age = m.groups()
        episode, rendering = await stored_text(service, run_id)
        assert (harness, outcome) == (episode["harness"], episode["outcome"])  # the daemon's row, not the text
        started = datetime.fromisoformat(episode["started_at"])
        assert age == f"{(NOW - started).days}d"
        assert text.strip(), line
        assert text_belongs(text, rendering)  # REQ-9's check holds
        assert text == gist(episode, (), BRIEFING_ITEM_TEXT, subject=True)  # the provider's item text, whole
        runs.append(run_id)
    return runs


@pytest.mark.req14
@pytest.mark.req15
async def test_the_briefing_tool_and_resource_show_whole_episodes_at_the_default_cap(
        gateway: tuple[MemoryService, str]) -> None:
    """At briefing_max_chars = 2000 no briefing showed an episode. With a one-line provenance
    the built-in provider's items fit the 500-character episodes share whole (REQ-14: never shortened);
    the ones that do not fit are counted and the section points to recall."""
    service, url = gateway
    for i in range(6):
        await service.ingest_run(real_run(i))
    for i, text in enumerate(OTHER_FACTS):
        await service.add_fact(scope=f"project:{REPO}", text=text, confidence=0.8 - i / 100)
    token, _ = await as_run(service, "api-fixer", "100", REPO)
    async with gateway_client(url, token) as client:
        tool = text_of(await client.call_tool("briefing", {}))
        [resource] = (await client.read_resource(BRIEFING_URI)).contents
    assert isinstance(resource, t.TextResourceContents) and resource.text == tool
    runs = await check_episodes_read_well(service, tool)
    assert len(set(runs)) == len(runs)
    episodes = sections(tool)["episodes"]
    # The episodes section stays within its share (25 % of 2000), fences and labels included.
    assert sum(len(line) + 1 for line in episodes.splitlines() if not line.startswith("(")) <= 500
    assert episodes.endswith(" more not shown; use the recall tool for more)")
    # The other sections are still there, in order, and the full provenance stays recall's.
    assert list(sections(tool)) == ["collisions", "recent_runs", "facts", "episodes"]
    async with gateway_client(url, token) as client:
        recall = text_of(await client.call_tool("recall", {"query": "ledger rounding", "limit": 3}))
    assert re.search(r"^- episode · provider builtin · episode ep_\w+ · run ", recall, re.M)


@pytest.mark.req14
async def test_empty_runs_never_take_a_briefings_episode_slot(gateway: tuple[MemoryService, str]) -> None:
    """Agent CLIs that exited at once (newest and shortest: what a metadata query ranks first) leave the
    slots to the runs that did something; the provider is asked for spares so the slots still fill."""
    service, url = gateway
    for i in range(3):
        await service.ingest_run(real_run(i))
    empties = [empty_run(i) for i in range(7)]
    for record in empties:
        await service.ingest_run(record)
    token, _ = await as_run(service, "api-fixer", "100", REPO)
    async with gateway_client(url, token) as client:
        document = text_of(await client.call_tool("briefing", {}))
    runs = await check_episodes_read_well(service, document)
    assert not {r["run_id"] for r in empties} & set(runs)
    # The operator's preview applies the same rule.
    preview = (await service.get_briefing("api-fixer"))["document"]
    assert not {r["run_id"] for r in empties} & set(await check_episodes_read_well(service, preview))


@pytest.mark.req12
@pytest.mark.req17
async def test_near_duplicate_facts_collapse_and_exposure_covers_only_the_one_shown(
        gateway: tuple[MemoryService, str]) -> None:
    """In a real session 8 near-identical facts took ~3.4 KB before the first episode. They are one fact
    now, the highest-confidence one, saying how many it stands for; only it is exposed (REQ-17)."""
    service, url = gateway
    for i in range(4):
        await service.ingest_run(real_run(i))
    ids = []
    for i, text in enumerate(TZ_FACTS):
        ids.append((await service.add_fact(scope=f"project:{REPO}", text=text, confidence=0.6 + i / 40))["id"])
    for text in OTHER_FACTS:
        await service.add_fact(scope=f"project:{REPO}", text=text, confidence=0.5)
    best = ids[-1]  # the highest confidence of the near-duplicates
    token, _ = await as_run(service, "api-fixer", "100", REPO)
    async with gateway_client(url, token) as client:
        briefing = text_of(await client.call_tool("briefing", {}))
        recall = text_of(await client.call_tool("recall", {"query": "ledger tests TZ fixed clock push"}))
    for document in (briefing, recall):
        facts = sections(document)["facts"]
        shown = re.findall(r"^- fact (f_\w+) ", facts, re.M)
        assert sum(1 for f in shown if f in ids) == 1 and best in shown, facts
        assert re.search(rf"^- fact {best} · .* · similar 7$", facts, re.M)
    assert len(sections(recall)["facts"]) < 1200  # one fact's room, not eight
    assert len(episode_blocks(briefing)) >= 1
    exposed = await service.store.read(lambda db: db.execute(
        "SELECT surface, fact_id FROM exposures WHERE run_id = '100'").fetchall())
    assert {s for s, _ in exposed} == {"briefing_tool", "recall"}
    assert {f for _, f in exposed} & set(ids) == {best}  # the folded ones were not shown: not exposed


# --- the CLI and `memactors run` as a user runs them ---------------------------------------------------


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=env, capture_stdout=True,
                                  capture_stderr=True, check=False)


@pytest.mark.slow
@pytest.mark.req16
@pytest.mark.req19
async def test_memory_briefing_and_a_memory_briefing_run_show_episodes(tmp_path: Path) -> None:
    """`memactors memory briefing` (the operator's preview) and the briefing a `memactors run` of a
    memory_briefing = true harness prepends to its prompt (and serves it through the gateway as itself)
    each show whole episodes of the repository's real-looking history, never an empty run."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    config = write_config(tmp_path, command_harness("api-fixer", workdir=repo, mode="briefing", out=out,
                                                    extra="memory_briefing = true"))
    records = tmp_path / "records"
    records.mkdir()
    for i in range(6):
        (records / f"run-{i}.json").write_text(json.dumps(real_run(i)), encoding="utf-8")
    for i in range(4):
        (records / f"empty-{i}.json").write_text(json.dumps(empty_run(i)), encoding="utf-8")
    with daemon_process(tmp_path, config=config) as daemon:
        env = daemon.env
        ingested = await cli(env, "runs", "ingest", str(records))
        assert ingested.returncode == 0, ingested.stderr
        preview = await cli(env, "memory", "briefing", "api-fixer")
        assert preview.returncode == 0, preview.stderr
        as_json = json.loads((await cli(env, "memory", "briefing", "api-fixer", "--json")).stdout)
        done = await cli(env, "run", "api-fixer", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        log = daemon.log_text()
    empties = {f"r202611{28:02d}T10{i:02d}00-dead{i:02x}" for i in range(4)}
    text = preview.stdout.decode()
    shown = [COMPACT.match(line) for line, _ in episode_blocks(text)]
    assert len(shown) >= 1 and all(shown) and not {m.group(1) for m in shown if m} & empties, text
    assert as_json["items"]["episodes"] >= 1
    prompt = (out / "prompt-0.txt").read_text(encoding="utf-8")
    fence = re.match(r'<untrusted-data source="harness-memory" field="briefing" nonce="([^"]+)">\n', prompt)
    assert fence, prompt[:200]
    prepended = prompt[fence.end():prompt.index(f'\n</untrusted-data nonce="{fence.group(1)}">')]
    blocks = episode_blocks(prepended)
    assert len(blocks) >= 1 and all(COMPACT.match(line) for line, _ in blocks), prepended
    assert not any(e in sections(prepended)["episodes"] for e in empties)  # (recent_runs lists them: runs)
    assert prompt.endswith("\n\nfix the ledger")
    served = (out / "briefing.txt").read_text(encoding="utf-8")
    assert served == prepended  # the run's briefing tool serves what was prepended (REQ-15)
    prepend_line = next(line for line in log.splitlines() if "briefing prepended" in line)
    assert re.search(r"\bepisodes=[123]\b", prepend_line), prepend_line  # it logged episodes=0 before


@pytest.mark.slow
@pytest.mark.req14
async def test_req14_deterministic_without_the_provider(tmp_path: Path) -> None:
    """WHEN a briefing is computed twice at the same instant over the same store with the provider
    unavailable THEN both documents are byte-identical — as the operator sees it: the daemon as a
    process, its provider a real stdio subprocess failing every call, a store with collisions, recent
    runs and facts, and `memactors memory briefing` run twice as a subprocess. The two previews are
    composed some milliseconds apart; nothing in them depends on that (the nonce is derived from the
    content), so the whole documents, nonces included, are the same bytes."""
    from support_readside import fault_toml

    config = write_config(tmp_path, fault_toml(tmp_path, "error") + '[harness.api-fixer]\nharness = "claude-code"\n')
    records = tmp_path / "records"
    records.mkdir()
    for i in range(4):
        (records / f"run-{i}.json").write_text(json.dumps(real_run(i)), encoding="utf-8")
    with daemon_process(tmp_path, config=config) as daemon:
        env = daemon.env
        steps = [("runs", "ingest", str(records))]
        steps += [("facts", "add", f"The ledger needs a fixed clock in test {i}.", "--scope", f"project:{REPO}",
                   "--confidence", f"0.{5 + i}") for i in range(3)]
        steps += [("presence", "report", f"other-{i}", "--run", f"o{i}", "--session", "s", "--repo", REPO,
                   "--branch", "main", "--paths", f"src/ledger/{i}.py", "--ttl", "3600") for i in range(2)]
        for step in steps:
            done = await cli(env, *step)
            assert done.returncode == 0, (step, done.stderr)
        first = await cli(env, "memory", "briefing", "api-fixer")
        second = await cli(env, "memory", "briefing", "api-fixer")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout  # the whole documents, byte for byte, nonce included
    text = first.stdout.decode()
    assert re.match(r'<memory-data kind="briefing" nonce="[0-9a-f]{16}" degraded="provider_unavailable"', text)
    assert "## episodes (provider_unavailable)" in text
    for section in ("collisions", "recent_runs", "facts"):  # the deterministic sections have something
        assert sections(text)[section].strip(), text


@pytest.mark.slow
@pytest.mark.req14
async def test_req14_an_upstreams_req5_rendering_is_placed_whole_or_dropped_whole(tmp_path: Path) -> None:
    """A text-only upstream (the fault provider behaving: it stores the REQ-5 rendering memactors sends
    and returns it as its item text, as REQ-3 suggests) through `memactors memory briefing` as a
    subprocess, the daemon as a process: each episode item is the rendering whole, or it is dropped
    whole, counted, and the section points to recall. Never the rendering's first lines alone."""
    from support import run_record
    from support_readside import calls, fault_toml

    config = write_config(tmp_path, fault_toml(tmp_path) + '[harness.api-fixer]\nharness = "claude-code"\n'
                          '[harness.api-wide]\nharness = "claude-code"\nbriefing_max_chars = 4000\n')
    records = tmp_path / "records"
    records.mkdir()
    short = run_record(harness="api-wide", run_id="r-short", started_at="2026-11-19T09:00:00Z", ended_at="2026-11-19T09:01:00Z",
                       result_text="Bumped the ledger precision.")
    (records / "a-short.json").write_text(json.dumps(short), encoding="utf-8")
    for i in range(3):
        (records / f"b-run-{i}.json").write_text(json.dumps(real_run(i)), encoding="utf-8")
    with daemon_process(tmp_path, config=config) as daemon:
        env = daemon.env
        ingested = await cli(env, "runs", "ingest", str(records))
        assert ingested.returncode == 0, ingested.stderr
        with trio.fail_after(120):  # a hang guard: a record the deadline queued is retried in the background
            while len(calls(tmp_path, "memory_record_episode")) < 4:  # noqa: ASYNC110 -- another process's state
                await trio.sleep(0.05)
        default = await cli(env, "memory", "briefing", "api-fixer")
        wide = await cli(env, "memory", "briefing", "api-wide")
    assert default.returncode == wide.returncode == 0, default.stderr + wide.stderr
    stored = {c["arguments"]["text"] for c in calls(tmp_path, "memory_record_episode")}
    assert len(stored) == 4 and all(t.startswith("episode_id: ep_") for t in stored)
    shown_total = 0
    for out in (default, wide):
        text = out.stdout.decode()
        episodes = sections(text)["episodes"]
        blocks = episode_blocks(text)
        assert all(body in stored for _, body in blocks), text  # each one whole, as the provider returned it
        assert text.count("episode_id: ") == len(blocks)  # no first lines of a dropped one
        assert re.search(r"^\((\d+) more not shown; use the recall tool for more\)$", episodes, re.M), text
        shown_total += len(blocks)
    assert episode_blocks(default.stdout.decode()) == []  # at 2000 no rendering fits the 500-character share
    assert shown_total >= 1  # at 4000 the short run's rendering fits its 1000 characters, whole
