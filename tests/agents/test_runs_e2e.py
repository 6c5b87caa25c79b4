"""`memactors run` as a user types it: the daemon as a process, the CLI as a subprocess, real agents.

The real Claude Code CLI (installed by `make agents` into .cache/agents, pinned) runs headless against
a loopback fake of the Anthropic Messages API (memactors.testing.fake_anthropic) that plays a scripted
session: recall through the gateway, Write a file, Bash the project's failing test, a final answer.
A missing binary fails these tests: they never skip.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from fix_daemon import serving_env as daemon
from memactors.testing.fake_anthropic import Script, Text, ToolUse, run_fake_anthropic
from support import write_config
from support_runs import (
    REPO_KEY,
    base_env,
    claude_binary,
    claude_env,
    cli,
    command_harness,
    fake_claude,
    make_repo,
    rows,
    wait_for_file,
)

pytestmark = pytest.mark.slow

FENCE = re.compile(r'<untrusted-data source="harness-memory" field="briefing" nonce="([^"]+)">')


def files_under(path: Path) -> Iterator[Path]:
    return (p for p in path.rglob("*") if p.is_file())


@pytest.mark.req16
async def test_memactors_run_wait_json_with_the_command_adapter(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    project = make_repo(tmp_path / "project")
    (project / "harness.toml").write_text("[harness.proj]\nmemory_briefing = true\n", encoding="utf-8")
    config = write_config(tmp_path, command_harness("fixer", workdir=repo, mode="write", out=out)
                          + command_harness("failing", workdir=repo, mode="fail", out=out)
                          + command_harness("proj", workdir=project, mode="write", out=tmp_path / "proj-out"))
    env = base_env(tmp_path, config)
    with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
        done = await cli(env, "run", "fixer", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert set(result) == {"run_id", "harness", "outcome", "reason", "cap", "episode_id", "stderr_tail"}
        assert (result["harness"], result["outcome"]) == ("fixer", "succeeded")
        shown = await cli(env, "memory", "episodes", result["episode_id"], "--json")
        episode = json.loads(shown.stdout)["episode"]
        assert (episode["run_id"], episode["files_touched"], episode["repo"]) == (
            result["run_id"], ["notes.txt"], REPO_KEY)
        failed = await cli(env, "run", "failing", "--wait")
        assert failed.returncode == 1
        assert b": failed (exit_nonzero)" in failed.stdout
        started = await cli(env, "run", "fixer", "--prompt", "just start")
        assert started.returncode == 0 and started.stdout.startswith(b"run r")
        unknown = await cli(env, "run", "nope")
        assert unknown.returncode == 5 and b"unknown harness nope" in unknown.stderr
        refused = await cli(env, "run", "proj", "--wait")  # REQ-16: a project file cannot turn it on
        assert refused.returncode == 5
        assert b"memory_briefing" in refused.stderr and b"global-only" in refused.stderr
        assert str(project / "harness.toml").encode() in refused.stderr
        assert not (tmp_path / "proj-out").exists()


TRIAGE_FENCE = re.compile(
    r'\A<untrusted-data source="harness-memory" field="briefing" nonce="(?P<nonce>[^"]+)">\n'
    r"(?P<briefing>.*)\n</untrusted-data nonce=\"(?P=nonce)\">\n\n(?P<prompt>.*)\Z",
    re.DOTALL,
)


@pytest.mark.req16
async def test_req16_a_one_shot_receives_the_fenced_briefing(tmp_path: Path) -> None:
    """The scenario as written, on the argv the agent process really received: [harness.nightly-triage]
    with harness = "claude-code", prompt_file = "~/prompts/triage.md", memory_briefing = true; the last
    argv element is the fenced briefing, a blank line, then the file's contents unchanged."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    claude = fake_claude(tmp_path / "bin", "once", out)
    config = write_config(tmp_path, f"""
[harness.nightly-triage]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt_file = "~/prompts/triage.md"
memory_briefing = true
""")
    env = base_env(tmp_path, config)
    triage = "Triage the open issues.\n\n  Keep   spacing.\n--not-a-flag\n"
    (tmp_path / "home" / "prompts").mkdir(parents=True)
    (tmp_path / "home" / "prompts" / "triage.md").write_text(triage, encoding="utf-8")
    with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
        added = await cli(env, "facts", "add", "Ledger amounts are rounded half-even.", "--scope",
                          f"project:{REPO_KEY}", "--confidence", "0.9", "--id", "f_ledger")
        assert added.returncode == 0, added.stderr
        done = await cli(env, "run", "nightly-triage", "--wait", "--json")
        assert done.returncode == 0, done.stderr
    argv = json.loads((out / "argv-0.json").read_text(encoding="utf-8"))
    assert argv[0] == str(claude) and argv[1] == "-p"
    assert argv[-2] == "--"  # the options end before the prompt, so no option can take it as a value
    match = TRIAGE_FENCE.match(argv[-1])
    assert match is not None, argv[-1][:200]
    assert match["prompt"] == triage  # the file's contents, byte for byte
    assert match["nonce"] not in match["briefing"]
    assert "Ledger amounts are rounded half-even." in match["briefing"]


async def test_each_run_reaches_the_gateway_as_itself_without_the_daemons_secret(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    prompt_file = tmp_path / "prompt.md"
    prompt_file.write_text("from a file\n", encoding="utf-8")
    config = write_config(tmp_path, '[model_api]\nbase_url = "http://127.0.0.1:9"\napi_key_env = "UTILITY_KEY"\n'
                          + command_harness("probe", workdir=repo, mode="env", out=out))
    env = {**base_env(tmp_path, config), "UTILITY_KEY": "daemon-only-secret", "AGENT_API_KEY": "for-the-agent"}
    state = tmp_path / "state"
    with daemon(env, state, tmp_path / "daemon.log"):
        done = await cli(env, "run", "probe", "--prompt-file", str(prompt_file), "--wait", "--json")
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        gateway = json.loads((state / "daemon.json").read_text(encoding="utf-8"))["gateway"]
    facts = json.loads((out / "env.json").read_text(encoding="utf-8"))
    assert "AGENT_API_KEY" in facts["names"] and "UTILITY_KEY" not in facts["names"]
    assert {k: facts["memactors"].get(k) for k in ("MEMACTORS_HARNESS", "MEMACTORS_RUN_ID", "MEMACTORS_GATEWAY_URL")} \
        == {"MEMACTORS_HARNESS": "probe", "MEMACTORS_RUN_ID": run_id, "MEMACTORS_GATEWAY_URL": gateway}
    assert "MEMACTORS_RUN_TOKEN" in facts["names"]
    assert facts["mcp"] == {"mode": "0o600", "type": "http", "url": gateway, "bearer_is_token": True}
    assert Path(facts["memactors"]["MEMACTORS_MCP_CONFIG"]).parent == state / "runs"
    assert not await trio.Path(facts["memactors"]["MEMACTORS_MCP_CONFIG"]).exists()  # removed when the run ended
    assert (out / "prompt-0.txt").read_text(encoding="utf-8") == "from a file\n"


@pytest.mark.req15
@pytest.mark.req17
async def test_a_runs_briefing_tool_serves_the_briefing_prepended_at_spawn(tmp_path: Path) -> None:
    """REQ-15: computed once at spawn, then served unchanged to the run through the gateway as itself."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    config = write_config(tmp_path, command_harness("reader", workdir=repo, mode="briefing", out=out,
                                                    extra="memory_briefing = true"))
    env = base_env(tmp_path, config)
    state = tmp_path / "state"
    with daemon(env, state, tmp_path / "daemon.log"):
        added = await cli(env, "facts", "add", "Ledger amounts are rounded half-even.", "--scope",
                          f"project:{REPO_KEY}", "--confidence", "0.9", "--id", "f_ledger")
        assert added.returncode == 0, added.stderr
        done = await cli(env, "run", "reader", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
    served = (out / "briefing.txt").read_text(encoding="utf-8")
    prompt = (out / "prompt-0.txt").read_text(encoding="utf-8")
    assert "Ledger amounts are rounded half-even." in served
    assert f"\n{served}\n</untrusted-data nonce=" in prompt  # the same document, fenced, in the prompt
    surfaces = rows(state / "memactors.db", "SELECT surface, call_id IS NULL FROM exposures WHERE run_id = ?"
                    " ORDER BY id", run_id)
    assert surfaces == [("briefing_prompt", 1), ("briefing_tool", 0)]


async def test_daemon_shutdown_mid_run_stops_the_agent_and_records_the_run(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "out"
    config = write_config(tmp_path, command_harness("long", workdir=repo, mode="sleep", out=out))
    env = base_env(tmp_path, config)
    state = tmp_path / "state"
    with daemon(env, state, tmp_path / "daemon.log") as proc:
        started = await cli(env, "run", "long", "--json")
        run_id = json.loads(started.stdout)["run_id"]
        pid = int(await wait_for_file(out / "pid"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    recorded = rows(state / "memactors.db", "SELECT run_id, outcome, reason FROM runs WHERE harness = 'long'")
    assert recorded == [(run_id, "cancelled", "operator_cancel")]
    episodes = rows(state / "memactors.db", "SELECT outcome FROM episodes WHERE run_id = ?", run_id)
    assert episodes == [("cancelled",)]
    assert not list((state / "runs").glob("*.json"))  # the per-run MCP config is gone


@pytest.mark.req15
@pytest.mark.req16
@pytest.mark.req17
async def test_real_claude_code_run_is_recorded_and_the_next_run_gets_its_briefing(tmp_path: Path) -> None:
    claude = claude_binary()
    repo = make_repo(tmp_path / "api", failing_test=True)
    pytest_cmd = f"{sys.executable} -m pytest -q"
    script = Script((
        # Claude Code defers MCP tools: a model loads the schema with ToolSearch before the first call.
        ToolUse("ToolSearch", {"query": "select:mcp__memactors__recall"}),
        ToolUse("mcp__memactors__recall", {"query": "ledger rounding"}),
        ToolUse("Write", {"file_path": str(repo / "ledger.py"), "content": "def cents(x):\n    return round(x, 2)\n"}),
        ToolUse("Bash", {"command": pytest_cmd, "description": "Run the tests"}),
        Text("Added ledger.py; test_rounding still fails on 2.675 (binary floating point)."),
    ))
    config = write_config(tmp_path, f"""
[harness.claude-fixer]
harness = "claude-code"
workdir = "{repo}"
command = "{claude}"
prompt = "Fix the ledger rounding test."
allowed_tools = ["Edit", "Write", "Bash"]
memory_briefing = true
timeout = "5m"
""")
    state = tmp_path / "state"
    log = tmp_path / "daemon.log"
    async with run_fake_anthropic(script) as fake:
        env = claude_env(tmp_path, config, fake.base_url)
        with daemon(env, state, log):
            added = await cli(env, "facts", "add", "Ledger amounts are rounded half-even.", "--scope",
                              f"project:{REPO_KEY}", "--confidence", "0.9", "--id", "f_ledger")
            assert added.returncode == 0, added.stderr
            first = await cli(env, "run", "claude-fixer", "--wait", "--json")
            assert first.returncode == 1, first.stderr  # the last test run failed: verify_failed
            run1 = json.loads(first.stdout)
            assert run1["outcome"] == "failed" and run1["episode_id"]
            shown = await cli(env, "memory", "episodes", run1["episode_id"], "--json")
            episode = json.loads(shown.stdout)["episode"]
            assert episode["files_touched"] == ["ledger.py"]
            assert episode["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
            assert (episode["outcome"], episode["reason"], episode["adapter"]) == ("failed", "verify_failed",
                                                                                  "claude-code")
            assert episode["model"] == "claude-fake-1"  # the model the API served, as the stream reported it
            assert "test_rounding still fails" in episode["result_excerpt"]

            turns1 = fake.agent_requests()
            assert "mcp__memactors__recall" in json.dumps(turns1[0].body)  # offered: the gateway is connected
            recall_result = turns1[2].tool_results()[1]
            assert recall_result["tool_use_id"] == "toolu_fake_01"
            assert recall_result.get("is_error") is not True, recall_result  # the gateway answered the recall

            second = await cli(env, "run", "claude-fixer", "--wait", "--json")
            run2 = json.loads(second.stdout)
            assert run2["run_id"] != run1["run_id"]
        turns2 = [r for r in fake.agent_requests() if r not in turns1]
        prompt2 = turns2[0].first_user_text()
        fence = FENCE.search(prompt2)
        assert fence is not None, "the second run's prompt carries REQ-16's fenced briefing"
        assert f"run {run1['run_id']}" in prompt2
        assert prompt2.rstrip().endswith("Fix the ledger rounding test.")
        assert FENCE.search(turns1[0].first_user_text()) is not None  # first run: the fact, fenced too

    db = state / "memactors.db"
    callers = {c for (c,) in rows(db, "SELECT caller FROM call_log WHERE server = 'gateway' AND tool = 'recall'")}
    assert f"claude-fixer/{run1['run_id']}" in callers  # the recall reached the gateway as that run
    # ... and the provider call made to serve it is the daemon's own row (REQ-18)
    assert {c for (c,) in rows(db, "SELECT caller FROM call_log WHERE tool = 'memory_recall'")} == {"daemon"}
    exposures = rows(db, "SELECT run_id, surface, call_id IS NULL FROM exposures WHERE fact_id = 'f_ledger'")
    assert (run1["run_id"], "briefing_prompt", 1) in exposures
    assert (run1["run_id"], "recall", 0) in exposures
    assert (run2["run_id"], "briefing_prompt", 1) in exposures

    # REQ-16: a composed prompt is never persisted or logged — not its fence's nonce, not its whole text.
    prompt1 = turns1[0].first_user_text()
    secrets = [p.encode() for p in (prompt1, prompt2)]
    secrets += [m.group(1).encode() for m in (FENCE.search(prompt1), fence) if m is not None]
    assert len(secrets) == 4
    for path in [*files_under(state), log]:
        data = path.read_bytes()
        for secret in secrets:
            assert secret not in data, path


@pytest.mark.req8
async def test_req8_a_project_file_may_turn_recording_off_but_never_back_on(tmp_path: Path) -> None:
    """REQ-8: `memory_record` is accepted in a project file "because turning it off only narrows". The
    global file opts `off` out; the repository's harness.toml saying `memory_record = true` (and
    `record_trace = true`, the other half of eligibility) is accepted, does not switch recording back on,
    and the daemon's log names the file and the refused key. The same project file may turn `on` off."""
    repo = make_repo(tmp_path / "api")
    project = repo / "harness.toml"
    project.write_text("[harness.off]\nmemory_record = true\nrecord_trace = true\n"
                       "[harness.on]\nmemory_record = false\n", encoding="utf-8")
    config = write_config(tmp_path, command_harness("off", workdir=repo, mode="write", out=tmp_path / "o1",
                                                    extra="memory_record = false")
                          + command_harness("on", workdir=repo, mode="write", out=tmp_path / "o2"))
    env = base_env(tmp_path, config)
    log = tmp_path / "daemon.log"
    with daemon(env, tmp_path / "state", log):
        off = await cli(env, "run", "off", "--wait", "--json")
        assert off.returncode == 0, off.stderr
        on = await cli(env, "run", "on", "--wait", "--json")
        assert on.returncode == 0, on.stderr
    assert json.loads(off.stdout)["outcome"] == "succeeded"
    assert json.loads(off.stdout)["episode_id"] is None
    assert json.loads(on.stdout)["episode_id"] is None
    assert (tmp_path / "o1" / "prompt-0.txt").exists()  # the run itself went ahead
    warned = [line for line in log.read_text(encoding="utf-8").splitlines()
              if "WARNING" in line and "memory_record" in line]
    assert len(warned) == 1, warned
    assert str(project) in warned[0] and "[harness.off] memory_record" in warned[0]
    assert "harness=off" in warned[0]
    assert not [line for line in log.read_text(encoding="utf-8").splitlines()
                if "WARNING" in line and "record_trace" in line]  # the global file left it on: no widening
