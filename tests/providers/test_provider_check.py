"""SPEC-0030 REQ-4 through the CLI and MemoryService.CheckProvider, REQ-10 forget and status through the
CLI, REQ-3's schema command, and REQ-1's "keeps its last good configuration" on a failed SIGHUP reload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from fix_daemon import daemon_in_process, serving_env
from fix_providers import FaultFiles, fault_toml, sample
from memactors import cli
from memactors.config import ConfigHolder
from memactors.contract import schema_document
from memactors.metrics import Metrics
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from memactors.service import MemoryService, open_memory_service
from support import LogRecords, run_record, wait_ready, write_config

pytestmark = pytest.mark.slow

SERVICE = "harness.v1.MemoryService"


async def run_cli(config: Path, *argv: str) -> int:
    """The real CLI entry point (it runs its own trio loop), in a worker thread."""
    return await trio.to_thread.run_sync(cli.main, ["--config", str(config), *argv])


def _builtin_tables_empty(memory: MemoryService) -> Any:
    return memory.store.read(lambda db: db.execute(
        "SELECT (SELECT count(*) FROM builtin_docs), (SELECT count(*) FROM episodes),"
        " (SELECT count(*) FROM memory_index)").fetchone())


@pytest.mark.req11
@pytest.mark.req4
async def test_req11_the_builtin_provider_passes_its_own_check(memory: MemoryService) -> None:
    report = await memory.check_provider()
    assert report["provider"] == "builtin" and report["ok"]
    assert [c["status"] for c in report["checks"]] == ["pass"] * 7, report["checks"]
    assert not report["unforgotten_ids"]
    # Synthetic episodes went only to the built-in provider's own tables, and were forgotten there.
    assert await _builtin_tables_empty(memory) == (0, 0, 0)


@pytest.mark.req4
async def test_req4_the_builtin_check_through_the_cli_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with daemon_in_process(tmp_path) as (config, _):
        assert await run_cli(config, "memory", "provider", "check") == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 7 and out.strip().endswith("ok")


@pytest.mark.req4
async def test_req4_a_provider_without_memory_contract_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = FaultFiles(tmp_path / "fault")
    async with daemon_in_process(tmp_path, fault_toml(files, "omit_contract", provider=False)) as (config, _):
        code = await run_cli(config, "memory", "provider", "check", "--provider", "fault")
        assert code != 0
        assert await run_cli(config, "memory", "provider", "check", "--provider", "fault", "--json") == 1
    out = capsys.readouterr().out
    assert "1  FAIL" in out
    report = json.loads(out[out.index("{"):])
    assert report["checks"][0]["status"] == "fail" and not report["ok"]
    assert "memory_record_episode" not in files.tools(), "no episode was recorded"
    assert files.stored() == {}


@pytest.mark.req4
async def test_req4_a_provider_that_ignores_scope_passes_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make_holder: Callable[[str], ConfigHolder]) -> None:
    files = FaultFiles(tmp_path / "fault")
    async with daemon_in_process(tmp_path, fault_toml(files, "other_scope", provider=False)) as (config, _):
        assert await run_cli(config, "memory", "provider", "check", "--provider", "fault") == 0
    out = capsys.readouterr().out
    assert "5  WARN" in out and out.count("FAIL") == 0
    assert files.stored() == {}, "every synthetic id was forgotten"
    # REQ-9 still drops those ids for every real caller: the same provider selected, recall from another repo.
    live = FaultFiles(tmp_path / "live")
    metrics = Metrics()
    async with open_memory_service(make_holder(fault_toml(live, "other_scope")), metrics=metrics) as memory:
        await wait_ready(memory)
        eid = (await memory.ingest_run(run_record()))["episode_id"]
        mine = await memory.recall(query="ledger", repo="forge.example/acme/api")
        assert [e["episode_id"] for e in mine["episodes"]] == [eid]
        other = await memory.recall(query="ledger", repo="forge.example/acme/web")
        assert other["episodes"] == [] and other["degraded"] is None
        assert sample(metrics, "harness_memory_results_dropped_total", provider="fault", reason="scope") == 1


@pytest.mark.req4
async def test_an_unknown_or_project_only_provider_cannot_be_checked(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening):
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "control")) as rpc:
            from memactors.rpc.frames import RpcError

            with pytest.raises(RpcError) as err:
                await rpc.call(f"{SERVICE}/CheckProvider", {"provider": "zep"})
            assert err.value.code == "INVALID_ARGUMENT"
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "read")) as rpc:
            with pytest.raises(RpcError) as denied:
                await rpc.call(f"{SERVICE}/CheckProvider", {})
            assert denied.value.code == "PERMISSION_DENIED"


@pytest.mark.req4
async def test_an_unreachable_upstream_fails_check_1_with_a_reason(make_holder: Callable[[str], ConfigHolder]) -> None:
    holder = make_holder('[mcp.gone]\ncommand = "/nonexistent/memory-provider"\n')
    async with open_memory_service(holder) as memory:
        report = await memory.check_provider("gone")
    reason = report["checks"][0]["reason"]
    assert report["checks"][0]["status"] == "fail" and "cannot start /nonexistent/memory-provider" in reason
    assert [c["status"] for c in report["checks"][1:]] == ["skip"] * 6 and not report["ok"]


@pytest.mark.req3
def test_req3_provider_schema_prints_the_shipped_schemas(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["memory", "provider", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == schema_document()


@pytest.mark.req10
async def test_req10_memory_forget_and_status_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with daemon_in_process(tmp_path) as (config, listening):
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "control")) as rpc:
            eid = (await rpc.call(f"{SERVICE}/IngestRun", {"record": run_record()}))["episode_id"]
        capsys.readouterr()
        assert await run_cli(config, "memory", "forget", eid, "--yes") == 0
        assert f"forgotten {eid}" in capsys.readouterr().out
        assert await run_cli(config, "memory", "status") == 0
        status = capsys.readouterr().out
        assert "0 live, 1 forgotten" in status and "pending    0 records, 0 forgets" in status
        assert await run_cli(config, "memory", "forget", "ep_00000000000000000000", "--yes") == 4  # not found
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "read")) as rpc:
            hit = await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "repo": "forge.example/acme/api"})
            assert hit["episodes"] == []


@pytest.mark.req3
async def test_req3_memory_status_shows_an_incompatible_provider(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = FaultFiles(tmp_path / "fault")
    async with daemon_in_process(tmp_path, fault_toml(files, "contract_v2")) as (config, listening):
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "read")) as rpc:
            with trio.fail_after(60):
                while (await rpc.call(f"{SERVICE}/Status", {}))["state"] != "incompatible":  # noqa: ASYNC110
                    await trio.sleep(0.02)
        capsys.readouterr()
        assert await run_cli(config, "memory", "status") == 11  # documented: the provider is incompatible
    out, err = capsys.readouterr()
    assert "state      incompatible" in out and "is incompatible" in err
    assert "contract 2" in out  # the version it announced (it said `contract None`)


@pytest.mark.req1
async def test_req1_a_running_daemon_keeps_its_last_good_configuration(tmp_path: Path) -> None:
    """A SIGHUP reload that fails (a project-only provider, REQ-1) keeps the configuration in force."""
    with LogRecords() as logs:
        await _keeps_last_good(tmp_path, logs)


async def _keeps_last_good(tmp_path: Path, logs: LogRecords) -> None:
    async with daemon_in_process(tmp_path, '[memory.episodes]\nretention = "30d"\n') as (config, listening):
        token = read_token(tmp_path / "state", "read")

        async def retention() -> str:
            async with connect_rpc(listening.operator, token) as rpc:
                return (await rpc.call(f"{SERVICE}/Status", {}))["episodes_config"]["retention"]

        reloads = 0

        async def reload_to(extra: str) -> None:
            nonlocal reloads
            write_config(tmp_path, extra)
            os.kill(os.getpid(), signal.SIGHUP)
            reloads += 1
            # The daemon's signal task reloads in a worker thread: wait until it has logged the outcome.
            with trio.fail_after(30):
                while len(logs.matching("configuration reloaded")) + len(  # noqa: ASYNC110
                        logs.matching("configuration reload failed; keeping the last good one")) < reloads:
                    await trio.sleep(0.01)

        assert await retention() == "30d"
        await reload_to('[memory]\nprovider = "mem0"\n[memory.episodes]\nretention = "45d"\n')
        assert await retention() == "30d", "the bad file was not taken"
        await reload_to('[memory.episodes]\nretention = "45d"\n')
        assert await retention() == "45d", "a good reload is taken"
        assert config.exists()


# -- a failing check says why ---------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
SERVER_MEMORY = REPO / ".cache" / "agents" / "node_modules" / ".bin" / "mcp-server-memory"
GITHUB_TOKEN = "ghp_" + "Zq8" * 12


@pytest.mark.req4
async def test_a_provider_that_dies_at_start_fails_check_1_showing_its_last_stderr_lines_redacted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon's interpreter without its site-packages (`-S`) is a python3 that lacks the MCP SDK: the
    example provider dies with ModuleNotFoundError, and the check shows that instead of "Connection closed"."""
    provider = REPO / "examples" / "minimal_provider.py"
    leaky = ("import sys; sys.stderr.write('Traceback (most recent call last):\\n  File \"provider.py\", line 3\\n"
             f"RuntimeError: login refused for {GITHUB_TOKEN}\\n'); sys.exit(2)")
    extra = (f"[mcp.nomcp]\ncommand = {json.dumps(sys.executable)}\nargs = [\"-S\", {json.dumps(str(provider))}]\n"
             f"[mcp.leaky]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps('-c')}, {json.dumps(leaky)}]\n")
    with LogRecords() as logs:
        async with daemon_in_process(tmp_path, extra) as (config, _):
            assert await run_cli(config, "memory", "provider", "check", "--provider", "nomcp") == 1
            out = capsys.readouterr().out
            assert await run_cli(config, "memory", "provider", "check", "--provider", "leaky", "--json") == 1
            report = json.loads(capsys.readouterr().out)
    assert logs.matching("provider stderr") and GITHUB_TOKEN not in repr(logs.records)
    assert out.splitlines()[1].startswith("  1  FAIL")
    stderr_at, help_at = out.index("the provider's stderr"), out.index("docs/write-a-provider.md")
    assert out.index("1  FAIL") < stderr_at < out.index("ModuleNotFoundError: No module named 'mcp'") < help_at
    assert help_at < out.index("2  SKIP")  # under the failing check, before the rest
    tail = report["stderr_tail"]
    assert tail[0] == "Traceback (most recent call last):" and tail[-1] == "RuntimeError: login refused for [REDACTED]"
    assert GITHUB_TOKEN not in json.dumps(report) and "docs/write-a-provider.md" in report["help"]


@pytest.mark.req4
async def test_the_official_server_memory_fails_check_1_pointing_at_the_provider_docs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A third-party memory server (@modelcontextprotocol/server-memory, installed by `make agents`) is an
    MCP server but not a memactors provider: check 1 says so, names what it offers, and where to read on."""
    assert os.access(SERVER_MEMORY, os.X_OK), f"{SERVER_MEMORY} is missing: run `make agents`"
    memory_file = tmp_path / "memory.jsonl"
    extra = (f"[mcp.graph]\ncommand = {json.dumps(str(SERVER_MEMORY))}\n"
             f"env = {{ MEMORY_FILE_PATH = {json.dumps(str(memory_file))} }}\n")
    async with daemon_in_process(tmp_path, extra) as (config, _):
        assert await run_cli(config, "memory", "provider", "check", "--provider", "graph") == 1
    out = capsys.readouterr().out
    assert "1  FAIL" in out and "no memory_contract tool" in out and "create_entities" in out
    assert "not a memactors memory provider" in out and "see docs/write-a-provider.md" in out
    assert out.count("SKIP") == 6
    assert not memory_file.exists() or memory_file.read_text(encoding="utf-8").strip() == ""  # nothing recorded


@pytest.mark.req4
def test_the_example_configurations_own_provider_passes_whatever_python3_the_path_finds(tmp_path: Path) -> None:
    """examples/harness.toml as a user runs it (`memactors serve --config examples/harness.toml` from the
    repository root), with a `python3` first on PATH that lacks the MCP SDK: [mcp.mini] still passes."""
    text = (REPO / "examples" / "harness.toml").read_text(encoding="utf-8")
    text = text.replace('path = "~/.local/share/harness"', f"path = {json.dumps(str(tmp_path / 'state'))}")
    for port in ("7377", "7378", "9477"):
        text = text.replace(f'"127.0.0.1:{port}"', '"127.0.0.1:0"')
    config = tmp_path / "harness.toml"
    config.write_text(text, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'mcp'\" >&2\nexit 1\n",
                                     encoding="utf-8")
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "HOME": str(tmp_path),
           "HARNESS_CONFIG": str(config)}
    with serving_env(env, tmp_path / "state", tmp_path / "daemon.log", cwd=REPO):
        done = subprocess.run([sys.executable, "-m", "memactors.cli", "memory", "provider", "check", "--provider",
                               "mini"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASS") == 7 and "minimal 0.1, contract 1" in done.stdout
