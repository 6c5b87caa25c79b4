"""`memactors run` with the real Codex CLI against the loopback fake of the OpenAI Responses API: the daemon
as a process spawns `codex exec --json`, the codex adapter reads its stream, and the episode says what the
agent really did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fix_agents import (
    CODEX_VERSIONS,
    FAKE_MODEL,
    assert_the_failed_test_episode,
    codex_bin,
    codex_env,
    codex_version,
    gateway_calls,
    run_to_its_episode,
    seed,
)
from fix_daemon import daemon_process
from memactors.testing.fake_openai import (
    FunctionCall,
    McpToolCall,
    Message,
    PatchCall,
    ShellCall,
    ToolSearch,
    Turn,
    run_fake_openai,
)
from support_runs import PYTEST, REPO_KEY, make_repo

pytestmark = pytest.mark.slow


def codex_harness(name: str, *, codex: Path, workdir: Path, base_url: str, extra_keys: str = "") -> str:
    provider = f'{{name="fake",base_url="{base_url}",wire_api="responses",env_key="FAKE_KEY"}}'
    extra = ["-c", "model_provider=fake", "-c", f"model_providers.fake={provider}"]
    return (f'\n[harness.{name}]\nharness = "codex"\nworkdir = "{workdir}"\ncommand = "{codex}"\n'
            f'model = "{FAKE_MODEL}"\npermission_mode = "workspace-write"\nprompt = "Fix the ledger rounding test."\n'
            f"extra_args = {json.dumps(extra)}\n{extra_keys}")


async def test_memactors_run_with_real_codex_records_the_changed_file_and_the_failed_test(tmp_path: Path) -> None:
    codex = codex_bin()
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = [
        # Codex lists MCP resources as functions; reading the briefing goes through the gateway as this run
        Turn([FunctionCall("read_mcp_resource", {"server": "memactors", "uri": "harness://memory/briefing"})]),
        Turn([ShellCall(["bash", "-lc", f"{PYTEST} test_ledger.py"], timeout_ms=300_000)]),  # loaded machine
        Turn([PatchCall("*** Begin Patch\n*** Add File: NOTES.md\n+rounding is binary floating point\n"
                        "*** End Patch\n")]),
        Turn([Message("Left NOTES.md; test_rounding still fails (2.675 is not representable).")]),
    ]
    async with run_fake_openai(script) as fake:
        env = codex_env(tmp_path / "codex-home")
        with daemon_process(tmp_path, codex_harness("codex-fixer", codex=codex, workdir=repo, base_url=fake.base_url),
                            env=env) as daemon:
            fact = await daemon.acli("facts", "add", "ledger amounts round with Decimal, never float",
                              "--scope", f"project:{REPO_KEY}", "--confidence", "0.9")
            assert fact.returncode == 0, fact.stderr
            done = await run_to_its_episode(daemon, "codex-fixer")
    run, log = done.run, done.log
    assert done.returncode == 1, (run, log[-3000:])
    assert (run["harness"], run["outcome"]) == ("codex-fixer", "failed")
    assert_the_failed_test_episode(done.episode, adapter="codex", run_id=run["run_id"])
    assert "2.675 is not representable" in done.episode["result_excerpt"]
    # Codex really ran against the fake: four model calls, the prompt as the first user message
    assert len(fake.model_calls) == 4
    # it reached the gateway with its run token, attributed to its run: the briefing for its repository
    # came back (an unattributed caller is refused not_attributed)
    [resource] = [i["output"] for i in fake.model_calls[1].body["input"] if i.get("type") == "function_call_output"]
    assert "ledger amounts round with Decimal" in resource and "not_attributed" not in resource
    assert "Fix the ledger rounding test." in fake.first_user_text()
    assert (repo / "NOTES.md").read_text(encoding="utf-8") == "rounding is binary floating point\n"
    # the prompt is never logged by the daemon
    assert "Fix the ledger rounding test." not in log


@pytest.mark.req16
async def test_the_next_codex_run_gets_the_briefing_naming_the_first_run_prepended_to_its_prompt(
        tmp_path: Path) -> None:
    codex = codex_bin()
    repo = make_repo(tmp_path / "api", failing_test=True)
    script = [
        Turn([ShellCall(["bash", "-lc", f"{PYTEST} test_ledger.py"], timeout_ms=300_000)]),  # loaded machine
        Turn([Message("test_rounding fails: 2.675 is not representable.")]),
        Turn([Message("Nothing to add.")]),
    ]
    async with run_fake_openai(script) as fake:
        harness = codex_harness("codex-fixer", codex=codex, workdir=repo, base_url=fake.base_url,
                                extra_keys="memory_briefing = true\n")
        with daemon_process(tmp_path, harness, env=codex_env(tmp_path / "codex-home")) as daemon:
            runs = []
            for _ in range(2):
                done = await daemon.acli("run", "codex-fixer", "--wait", "--json")
                assert done.stdout, done.stderr
                runs.append(json.loads(done.stdout))
            log = daemon.log.read_text(encoding="utf-8")
            stored = b"".join(p.read_bytes() for p in daemon.state.rglob("*") if p.is_file())
    first, second = runs
    assert (first["outcome"], second["outcome"]) == ("failed", "succeeded")
    assert len(fake.model_calls) == 3
    prompt = fake.first_user_text(2)  # the second run's first model call
    assert prompt.index('<memory-data kind="briefing"') < prompt.index("Fix the ledger rounding test.")
    assert first["run_id"] in prompt
    # REQ-16: the composed prompt (briefing fence + the configured prompt) is never logged or stored
    end = prompt.index("Fix the ledger rounding test.") + len("Fix the ledger rounding test.")
    composed = prompt[prompt.index('<memory-data kind="briefing"'):end]
    assert composed not in log and composed.encode() not in stored


def test_the_second_codex_make_installs_is_newer_than_the_pinned_one() -> None:
    """The "next" runs below are worth something only if they really run another, newer Codex."""
    assert codex_version(codex_bin("next")) > codex_version(codex_bin("pinned"))


@pytest.mark.req12
@pytest.mark.parametrize("which", CODEX_VERSIONS)
async def test_a_codex_run_calls_recall_as_a_tool_and_gets_its_memory_document_back(
        tmp_path: Path, which: str) -> None:
    """`codex exec` runs with approval policy never, which refused every memory tool call
    ("MCP tool call requires approval"). The agent searches its deferred tools, calls
    ``mcp__memactors.recall`` as a model would, and the answer is the wrapped memory document."""
    codex = codex_bin(which)
    repo = make_repo(tmp_path / "api")
    script = [
        Turn([ToolSearch("memactors recall memory")]),
        Turn([McpToolCall("memactors", "recall", {"query": "ledger rounding"})]),
        Turn([Message("Recalled: the ledger was fixed with Decimal before.")]),
    ]
    async with run_fake_openai(script) as fake:
        with daemon_process(tmp_path, codex_harness("codex-fixer", codex=codex, workdir=repo, base_url=fake.base_url),
                            env=codex_env(tmp_path / "codex-home")) as daemon:
            seeded = await seed(daemon, tmp_path)
            done = await daemon.acli("run", "codex-fixer", "--wait", "--json")
            assert done.returncode == 0, (done.stdout, done.stderr, daemon.log.read_text(encoding="utf-8")[-3000:])
            run = json.loads(done.stdout)
    # the call log is written in batches: read it once the daemon has stopped (a clean stop writes it all)
    calls = gateway_calls(daemon.state)
    [recalled] = fake.tool_outputs(2)
    assert "requires approval" not in recalled
    assert recalled.count('<memory-data kind="recall"') == 1
    assert seeded in recalled and "Decimal quantize" in recalled
    # it went through the gateway as this run, and was served
    assert calls == [(f"codex-fixer/{run['run_id']}", "recall", "ok")]
