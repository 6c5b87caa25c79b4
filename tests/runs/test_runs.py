"""The runs actor through MemoryService.StartRun/WaitRun with the `command` adapter and a real child process.

Each test runs a real stand-in agent (tests/data/agent_script.py) in a real git repository, and reads
what the daemon recorded: the episode, the run's outcome and reason, the token's life.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from memactors.config import ConfigHolder
from memactors.errors import ConfigError, InvalidArgument, UnknownRun
from memactors.service import MemoryService, open_memory_service
from memactors.store import iso, run_tokens
from support import LogRecords, wait_ready
from support_runs import REPO_KEY, command_harness, fake_claude, make_repo, wait_for_file

pytestmark = pytest.mark.slow


@asynccontextmanager
async def service(make_holder: Callable[[str], ConfigHolder], extra: str) -> AsyncIterator[MemoryService]:
    async with open_memory_service(make_holder(extra)) as memory:
        await wait_ready(memory)
        yield memory


async def run_to_end(memory: MemoryService, harness: str, **params: Any) -> dict[str, Any]:
    started = await memory.start_run(harness=harness, **params)
    assert started["state"] == "running"
    with trio.fail_after(60):
        while True:
            state = await memory.wait_run(harness=harness, run_id=started["run_id"], wait_seconds=30)
            if state["state"] == "ended":
                return state


async def test_a_run_is_recorded_with_the_files_it_wrote(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    async with service(make_holder, command_harness("fixer", workdir=repo, mode="write", out=out)) as memory:
        state = await run_to_end(memory, "fixer")
        assert (state["outcome"], state["reason"], state["exit_code"]) == ("succeeded", "completed", 0)
        assert state["ingest"] in ("recorded", "queued")
        episode = await memory.get_episode(state["episode_id"])
    assert episode["episode"]["files_touched"] == ["notes.txt"]
    assert episode["episode"]["repo"] == REPO_KEY
    assert episode["episode"]["branch"] == "main"
    assert episode["episode"]["adapter"] == "command"
    assert "all good" in episode["episode"]["result_excerpt"]
    # The configured prompt reached the agent as its last argument.
    assert (out / "prompt-0.txt").read_text(encoding="utf-8") == "fix the ledger"


@pytest.mark.req20
async def test_prompt_flag_replaces_the_configured_prompt_for_one_run(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    async with service(make_holder, command_harness("fixer", workdir=repo, mode="write", out=out)) as memory:
        await run_to_end(memory, "fixer", prompt="only this once")
        await run_to_end(memory, "fixer")
        assert memory.config.harness["fixer"].prompt == "fix the ledger"  # the stored prompt is unchanged
        records = await memory.store.read(lambda db: [json.loads(r) for (r,) in db.execute(
            "SELECT rr.record FROM runs r JOIN run_records rr ON rr.id = r.record_id WHERE r.harness = 'fixer'")
            .fetchall()])
    assert len(records) == 2 and all(r.get("prompt") is None for r in records)  # no prompt in any record
    assert all(r["trigger"] == {"source": "operator", "name": "memactors run"} for r in records)
    assert (out / "prompt-0.txt").read_text(encoding="utf-8") == "only this once"
    assert (out / "prompt-1.txt").read_text(encoding="utf-8") == "fix the ledger"


async def test_a_non_zero_exit_is_a_failed_run(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    async with service(make_holder, command_harness("fixer", workdir=repo, mode="fail", out=tmp_path / "o")) as memory:
        state = await run_to_end(memory, "fixer")
        episode = await memory.get_episode(state["episode_id"])
    assert (state["outcome"], state["reason"], state["exit_code"]) == ("failed", "exit_nonzero", 3)
    assert episode["episode"]["outcome"] == "failed"


async def test_timeout_stops_the_agent_and_records_timed_out(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    extra = command_harness("slow", workdir=repo, mode="sleep", out=tmp_path / "o", extra='timeout = "1s"')
    async with service(make_holder, extra) as memory:
        state = await run_to_end(memory, "slow")
        episode = await memory.get_episode(state["episode_id"])
    assert (state["outcome"], state["reason"]) == ("timed_out", "deadline")
    assert state["exit_code"] == -signal.SIGTERM
    assert (episode["episode"]["outcome"], episode["episode"]["reason"]) == ("timed_out", "deadline")


async def test_an_agent_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    extra = command_harness("stubborn", workdir=repo, mode="stubborn", out=tmp_path / "o", extra='timeout = "1s"')
    async with service(make_holder, extra) as memory:
        memory.runs.kill_grace = 0.5
        state = await run_to_end(memory, "stubborn")
    assert (state["outcome"], state["reason"], state["exit_code"]) == ("timed_out", "deadline", -signal.SIGKILL)


async def test_an_agent_killed_by_someone_else_is_a_crash(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    async with service(make_holder, command_harness("victim", workdir=repo, mode="sleep", out=out)) as memory:
        started = await memory.start_run(harness="victim")
        os.kill(int(await wait_for_file(out / "pid")), signal.SIGKILL)
        state = await memory.wait_run(harness="victim", run_id=started["run_id"], wait_seconds=60)
    assert (state["state"], state["outcome"], state["reason"]) == ("ended", "crashed", "signal")
    assert state["exit_code"] == -signal.SIGKILL


async def test_stopping_the_service_stops_running_runs_and_still_records_them(tmp_path: Path,
                                                                              make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    extra = command_harness("long", workdir=repo, mode="sleep", out=out)
    async with service(make_holder, extra) as memory:
        started = await memory.start_run(harness="long")
        pid = int(await wait_for_file(out / "pid"))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    async with service(make_holder, extra) as memory:
        episodes = (await memory.list_episodes(harness="long"))["episodes"]
    assert [(e["run_id"], e["outcome"]) for e in episodes] == [(started["run_id"], "cancelled")]


@pytest.mark.req8
async def test_a_run_outside_any_repository_records_no_episode_and_is_counted(tmp_path: Path,
                                                                              make_holder: Any) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    async with service(make_holder, command_harness("loose", workdir=plain, mode="write", out=tmp_path / "o")) as memory:
        state = await run_to_end(memory, "loose")
        skipped = memory.metrics.registry.get_sample_value(
            "harness_memory_episodes_recorded_total", {"provider": "builtin", "outcome": "skipped"})
    assert (state["outcome"], state["ingest"], state["episode_id"]) == ("succeeded", "skipped", None)
    assert skipped == 1


@pytest.mark.req8
async def test_a_project_file_turning_memory_record_off_is_honoured_for_a_run(tmp_path: Path,
                                                                              make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    (repo / "harness.toml").write_text("[harness.fixer]\nmemory_record = false\n", encoding="utf-8")
    async with service(make_holder, command_harness("fixer", workdir=repo, mode="write", out=tmp_path / "o")) as memory:
        state = await run_to_end(memory, "fixer")
    assert (state["ingest"], state["episode_id"]) == ("skipped", None)


@pytest.mark.req8
async def test_a_project_file_cannot_turn_record_trace_back_on(tmp_path: Path, make_holder: Any) -> None:
    """REQ-8's narrowing rule for the other half of eligibility: the global file's `record_trace = false`
    holds over a project file's `true` (ignored, with a WARNING naming the file and the key)."""
    repo = make_repo(tmp_path / "api")
    project = repo / "harness.toml"
    project.write_text("[harness.fixer]\nrecord_trace = true\n", encoding="utf-8")
    extra = command_harness("fixer", workdir=repo, mode="write", out=tmp_path / "o", extra="record_trace = false")
    with LogRecords() as logs:
        async with service(make_holder, extra) as memory:
            state = await run_to_end(memory, "fixer")
    assert (state["outcome"], state["ingest"], state["episode_id"]) == ("succeeded", "skipped", None)
    [warned] = [r for r in logs.records if r["level"] == "WARNING" and "record_trace" in r["message"]]
    assert warned["extra"]["file"] == str(project) and warned["extra"]["key"] == "[harness.fixer] record_trace"


@pytest.mark.parametrize(("project", "named"), [
    pytest.param("[harness.fixer]\nmemory_briefing = true\n", "[harness.fixer] memory_briefing",
                 marks=pytest.mark.req16, id="memory_briefing"),
    pytest.param('[memory]\nprovider = "mem0"\n', "[memory]", marks=pytest.mark.req1, id="memory_provider"),
])
async def test_a_project_file_cannot_widen_a_run(tmp_path: Path, make_holder: Any, project: str, named: str) -> None:
    """REQ-16 (memory_briefing) and REQ-1 ([memory] provider): global-only, refused in the repository's
    project file when the run loads it; nothing is spawned."""
    repo = make_repo(tmp_path / "api")
    (repo / "harness.toml").write_text(project, encoding="utf-8")
    async with service(make_holder, command_harness("fixer", workdir=repo, mode="write", out=tmp_path / "o")) as memory:
        with pytest.raises(ConfigError) as refused:
            await memory.start_run(harness="fixer")
    assert refused.value.context["key"] == named
    assert "global-only" in str(refused.value) and str(repo / "harness.toml") in str(refused.value)
    assert not (tmp_path / "o").exists()  # nothing was spawned


async def test_a_project_file_sets_run_keys_and_may_add_its_own_upstream(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    (repo / "harness.toml").write_text(
        '[mcp.local-docs]\ncommand = "docs-server"\n[harness.fixer]\nprompt = "from the project file"\n',
        encoding="utf-8")
    out = tmp_path / "o"
    async with service(make_holder, command_harness("fixer", workdir=repo, mode="write", out=out)) as memory:
        state = await run_to_end(memory, "fixer")
    assert state["outcome"] == "succeeded"
    assert (out / "prompt-0.txt").read_text(encoding="utf-8") == "from the project file"


@pytest.mark.req16
@pytest.mark.req17
async def test_a_second_run_gets_the_first_runs_episode_in_its_fenced_briefing(tmp_path: Path,
                                                                               make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    extra = command_harness("fixer", workdir=repo, mode="write", out=out, extra="memory_briefing = true")
    async with service(make_holder, extra) as memory:
        first = await run_to_end(memory, "fixer")
        await run_to_end(memory, "fixer")
    second_prompt = (out / "prompt-1.txt").read_text(encoding="utf-8")
    assert second_prompt.startswith('<untrusted-data source="harness-memory" field="briefing" nonce="')
    assert f"run {first['run_id']}" in second_prompt
    assert second_prompt.endswith("\n\nfix the ledger")


async def test_the_run_token_resolves_while_running_and_expires_after_the_grace(tmp_path: Path,
                                                                                make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    async with service(make_holder, command_harness("t", workdir=repo, mode="sleep", out=out)) as memory:
        memory.runs.token_grace = 0.0
        started = await memory.start_run(harness="t")
        await wait_for_file(out / "pid")
        rows = await memory.store.read(lambda db: db.execute(
            "SELECT expires_at FROM run_callers WHERE run_id = ?", [started["run_id"]]).fetchall())
        assert len(rows) == 1 and rows[0][0] is not None  # bounded even if the daemon dies
        state = memory.runs._active[("t", started["run_id"])]
        state.stop("operator_cancel")
        ended = await memory.wait_run(harness="t", run_id=started["run_id"], wait_seconds=60)
        assert (ended["outcome"], ended["reason"]) == ("cancelled", "operator_cancel")
        now = memory.wall_clock()
        expired = await memory.store.read(lambda db: db.execute(
            "SELECT expires_at FROM run_callers WHERE run_id = ?", [started["run_id"]]).fetchone()[0])
        assert expired <= iso(now)


async def test_unknown_harness_and_unknown_run_are_errors_naming_them(tmp_path: Path, make_holder: Any) -> None:
    async with service(make_holder, "") as memory:
        with pytest.raises(InvalidArgument, match="unknown harness nope"):
            await memory.start_run(harness="nope")
        with pytest.raises(UnknownRun):
            await memory.wait_run(harness="nope", run_id="r1", wait_seconds=0)


async def test_a_missing_agent_binary_is_recorded_as_a_spawn_error(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    extra = (f'\n[harness.ghost]\nharness = "command"\nworkdir = "{repo}"\n'
             "command = '/nonexistent/agent {prompt}'\nprompt = \"hello\"\n")
    async with service(make_holder, extra) as memory:
        state = await run_to_end(memory, "ghost")
    assert (state["outcome"], state["reason"], state["ingest"]) == ("crashed", "spawn_error", "skipped")
    assert state["error"] == "FileNotFoundError: /nonexistent/agent"


@pytest.mark.req15
@pytest.mark.req16
async def test_a_respawn_of_the_same_run_reuses_its_briefing(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    extra = command_harness("fixer", workdir=repo, mode="fail", out=out, extra="memory_briefing = true")
    async with service(make_holder, extra) as memory:
        await memory.add_fact(scope=f"project:{REPO_KEY}", text="Ledger rounds half-even.", confidence=0.9,
                              fact_id="f_one")
        first = await run_to_end(memory, "fixer", run_id="r-respawn")
        await memory.add_fact(scope=f"project:{REPO_KEY}", text="A newer fact about invoices.", confidence=0.9,
                              fact_id="f_two")
        again = await run_to_end(memory, "fixer", run_id="r-respawn")
        # REQ-17: the prepended briefing showed f_one to the run, so its vote is stored but not counted.
        vote = await memory.cast_vote(fact_id="f_one", run_id="r-respawn", harness="fixer", stance="support")
        exposures = await memory.store.read(lambda db: db.execute(
            "SELECT surface, call_id FROM exposures WHERE run_id = 'r-respawn' AND fact_id = 'f_one'").fetchall())
    assert vote["counted"] is False
    assert ("briefing_prompt", None) in exposures
    assert first["run_id"] == again["run_id"] == "r-respawn"
    prompts = [(out / f"prompt-{i}.txt").read_text(encoding="utf-8") for i in (0, 1)]
    assert all("Ledger rounds half-even." in p for p in prompts)
    assert "A newer fact" not in prompts[1]  # the run's briefing was computed once, at its first spawn
    # Only the fence's nonce differs (fresh per spawn, REQ-16).
    bodies = [p.split("\n", 1)[1] for p in prompts]
    nonces = [re.search(r'nonce="([^"]+)"', p).group(1) for p in prompts]  # type: ignore[union-attr]
    assert nonces[0] != nonces[1]
    assert bodies[0].replace(nonces[0], "N") == bodies[1].replace(nonces[1], "N")
    assert again["ingest"] == "duplicate"  # a closed run is recorded once; the first record wins


@pytest.mark.req16
async def test_an_oversized_prompt_still_runs_with_the_prompt_alone(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    extra = command_harness("big", workdir=repo, mode="write", out=out, extra="memory_briefing = true")
    prompt = "p" * (128 * 1024 - 100)  # fits one argv element alone; with the fenced briefing it would not
    async with service(make_holder, extra) as memory:
        await memory.add_fact(scope=f"project:{REPO_KEY}", text="Ledger rounds half-even.", confidence=0.9)
        state = await run_to_end(memory, "big", prompt=prompt)
        skipped = memory.metrics.registry.get_sample_value(
            "harness_memory_briefings_total", {"harness": "big", "delivery": "prompt", "outcome": "skipped"})
    assert state["outcome"] == "succeeded"
    assert (out / "prompt-0.txt").read_text(encoding="utf-8") == prompt
    assert skipped == 1


async def test_an_expired_run_token_resolves_to_nobody(memory: MemoryService) -> None:
    now = memory.wall_clock()
    live, ended = [await memory.store.write(lambda db, ttl=ttl: run_tokens.mint_run_token(
        db, harness="h", run_id=f"r{ttl}", workdir="", now=now, expires_at=now + timedelta(seconds=ttl)))
        for ttl in (60, -1)]
    assert (await memory.caller_view(live)).run_id == "r60"
    assert (await memory.caller_view(ended)).run_id is None  # unattributed, like an unknown token


async def test_a_run_without_output_is_launch_failed_and_keeps_its_stderr_tail_redacted(
        tmp_path: Path, make_holder: Any) -> None:
    """The agent's stderr is not discarded. Its last 4 KiB are kept with the run, redacted
    (a token in it), without a line of the composed prompt (a usage line echoing it: REQ-16) and never
    in the episode (REQ-5); a run that wrote no output is failed / launch_failed."""
    repo = make_repo(tmp_path / "api")
    extra = command_harness("refuser", workdir=repo, mode="refuse", out=tmp_path / "o", extra="memory_briefing = true")
    async with service(make_holder, extra) as memory:
        await memory.add_fact(scope=f"project:{REPO_KEY}", text="Ledger rounds half-even.", confidence=0.9)
        state = await run_to_end(memory, "refuser")
        stored = await memory.store.read(lambda db: db.execute(
            "SELECT stderr_tail FROM agent_runs WHERE run_id = ?", [state["run_id"]]).fetchone()[0])
        episode = await memory.get_episode(state["episode_id"])
    prompt = (tmp_path / "o" / "prompt-0.txt").read_text(encoding="utf-8")
    nonces = set(re.findall(r'nonce="([^"]+)"', prompt))
    assert len(nonces) == 2  # the prompt fence's and the briefing document's
    tail = state["stderr_tail"]
    assert (state["outcome"], state["reason"], state["exit_code"]) == ("failed", "launch_failed", 2)
    assert stored == tail and len(tail.encode()) <= 4096
    assert tail.endswith("error: unknown option '--no-such-flag' (token [REDACTED])\n")
    assert "ghp_" not in tail and "noise line 0000" not in tail  # redacted; only the end is kept
    # the usage line echoes the whole composed prompt: it goes whole, with the briefing in it
    assert "[prompt]" in tail and not [n for n in nonces if n in tail] and "Ledger rounds" not in tail
    assert all(line.startswith(("noise line", "usage:", "[prompt]", "error:")) for line in tail.splitlines())
    assert episode["episode"]["reason"] == "launch_failed" and "no-such-flag" not in json.dumps(episode)


async def test_forgetting_a_runs_episode_removes_its_stderr_tail_and_log(tmp_path: Path, make_holder: Any) -> None:
    """REQ-10: forget removes every copy of what the agent wrote: the run's stderr tail and event log go
    with its run record; the run stays listed (ids, times, outcome)."""
    repo = make_repo(tmp_path / "api")
    extra = command_harness("fixer", workdir=repo, mode="write", out=tmp_path / "o") + command_harness(
        "refuser", workdir=repo, mode="refuse", out=tmp_path / "o2")
    async with service(make_holder, extra) as memory:
        wrote = await run_to_end(memory, "fixer")
        refused = await run_to_end(memory, "refuser")
        assert (await memory.run_logs(run_id=wrote["run_id"]))["events"]
        assert (await memory.get_run(run_id=refused["run_id"]))["stderr_tail"]
        for run in (wrote, refused):
            await memory.forget(run["episode_id"])
        logs = await memory.run_logs(run_id=wrote["run_id"])
        shown = await memory.get_run(run_id=refused["run_id"])
        listed = await memory.list_runs()
    assert (logs["kept"], logs["events"]) == (False, [])
    assert shown["stderr_tail"] is None and shown["outcome"] == "failed"
    assert {r["run_id"] for r in listed["runs"]} == {wrote["run_id"], refused["run_id"]}


async def test_a_run_id_two_harnesses_used_must_be_named_with_its_harness(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    extra = command_harness("a", workdir=repo, mode="write", out=tmp_path / "o") + command_harness(
        "b", workdir=repo, mode="fail", out=tmp_path / "o")
    async with service(make_holder, extra) as memory:
        await run_to_end(memory, "a", run_id="r-shared")
        await run_to_end(memory, "b", run_id="r-shared")
        with pytest.raises(InvalidArgument, match="run r-shared exists for harnesses a, b: name one with --harness"):
            await memory.get_run(run_id="r-shared")
        assert (await memory.get_run(run_id="r-shared", harness="b"))["outcome"] == "failed"
        page = await memory.list_runs(harness="a")
        with pytest.raises(InvalidArgument, match="params.state must be running or ended"):
            await memory.list_runs(state="done")
    assert [(r["harness"], r["outcome"]) for r in page["runs"]] == [("a", "succeeded")]


@pytest.mark.parametrize(("project", "passed"), [("max_turns = 50\nmax_cost_usd = 9.0", ("5", "1.5")),
                                                 ("max_turns = 2\nmax_cost_usd = 0.5", ("2", "0.5"))])
async def test_a_project_file_may_lower_a_cap_but_never_lift_it(tmp_path: Path, make_holder: Any, project: str,
                                                                passed: tuple[str, str]) -> None:
    repo = make_repo(tmp_path / "api")
    (repo / "harness.toml").write_text(f"[harness.capped]\n{project}\n", encoding="utf-8")
    out = tmp_path / "o"
    claude = fake_claude(tmp_path / "bin", "once", out)
    extra = (f'[harness.capped]\nharness = "claude-code"\nworkdir = "{repo}"\ncommand = "{claude}"\n'
             'prompt = "go"\nmax_turns = 5\nmax_cost_usd = 1.5\n')
    async with service(make_holder, extra) as memory:
        state = await run_to_end(memory, "capped")
    argv = json.loads((out / "argv-0.json").read_text(encoding="utf-8"))
    assert (argv[argv.index("--max-turns") + 1], argv[argv.index("--max-budget-usd") + 1]) == passed
    assert (state["max_turns"], state["max_cost_usd"]) == (int(passed[0]), float(passed[1]))
    assert state["outcome"] == "succeeded" and state["turns"] == 1 and state["cost_usd"] == 0.001


async def test_list_runs_pages_newest_first_without_stderr_tails(tmp_path: Path, make_holder: Any) -> None:
    repo = make_repo(tmp_path / "api")
    extra = command_harness("refuser", workdir=repo, mode="refuse", out=tmp_path / "o")
    async with service(make_holder, extra) as memory:
        ids = [(await run_to_end(memory, "refuser", run_id=f"r-{n}"))["run_id"] for n in range(3)]
        first = await memory.list_runs(limit=2)
        second = await memory.list_runs(limit=2, after=first["next_cursor"])
        shown = await memory.get_run(run_id="r-0")
    assert [r["run_id"] for r in first["runs"]] == ids[::-1][:2] and first["total"] == 3
    assert [r["run_id"] for r in second["runs"]] == ids[:1] and second["next_cursor"] is None
    assert all(r["stderr_tail"] is None for r in first["runs"] + second["runs"])
    assert shown["stderr_tail"]  # GetRun shows it


@pytest.mark.req16
async def test_an_agent_echoing_its_prompt_stores_no_line_of_the_composed_prompt(tmp_path: Path,
                                                                                  make_holder: Any) -> None:
    """REQ-5, REQ-16: the prompt is never persisted. An agent that prints its prompt puts it in its
    stdout, which becomes the run's events and its result text: both are scrubbed of the operator's
    prompt and every nonce before anything is stored. The briefing's lines are stored facts and
    episodes, not the prompt: an event may repeat them; the result text echoing the whole
    composed prompt loses it whole."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "o"
    extra = command_harness("parrot", workdir=repo, mode="echo", out=out, extra="memory_briefing = true")
    async with service(make_holder, extra) as memory:
        await memory.add_fact(scope=f"project:{REPO_KEY}", text="Ledger rounds half-even in every report.",
                              confidence=0.9)
        state = await run_to_end(memory, "parrot")
        logs = await memory.run_logs(run_id=state["run_id"])
        episode = await memory.get_episode(state["episode_id"])
        stored = await memory.store.read(lambda db: " ".join(str(v) for row in db.execute(
            "SELECT rr.record, a.view, a.log FROM runs r JOIN run_records rr ON rr.id = r.record_id"
            " JOIN agent_runs a USING (harness, run_id)").fetchall() for v in row))
    prompt = (out / "prompt-0.txt").read_text(encoding="utf-8")
    nonces = set(re.findall(r'nonce="([^"]+)"', prompt))
    assert len(nonces) == 2  # the prompt fence's and the briefing document's
    assert "Ledger rounds half-even" in prompt  # the briefing was prepended
    texts = " ".join(e.get("text", "") for e in logs["events"])
    assert "my prompt was:" in texts and "[prompt]" in texts
    for kept in (texts, json.dumps(episode), stored):
        assert not [nonce for nonce in nonces if nonce in kept] and "fix the ledger" not in kept
    assert "Ledger rounds half-even" in texts  # an event line of the briefing: a stored fact
    assert "Ledger rounds half-even" not in episode["episode"]["result_excerpt"]  # the whole prompt went


