"""A resident OpenCode after `memactors install opencode`: the real CLI (pinned) headless, `opencode run`,
against a loopback fake of the Responses API. The plugin install writes gives the session its briefing in the
system prompt and, when OpenCode exits, hands the session to `memactors hook opencode session-end`: an episode
with its edit and its failed test. With the daemon down the session starts at once with nothing and is
spooled, then sent. `uninstall` removes the plugin and leaves `cmp`-identical files. The daemon as a process,
memactors' CLI as a subprocess."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from fix_agents import (
    FACT,
    OPENCODE_BIN,
    OPENCODE_MODEL,
    add_fact,
    agent_bin,
    assert_the_failed_test_episode,
    gateway_calls,
    left_while_down,
    opencode_user,
    seed,
    the_only_episode,
)
from fix_daemon import daemon_process
from memactors.cli.install import run_id_for
from memactors.gateway import INSTRUCTIONS
from memactors.testing.fake_openai import FunctionCall, Message, Turn, run_fake_openai
from support_runs import PYTEST, make_repo

pytestmark = pytest.mark.slow



def harness(repo: Path) -> str:
    return f'[harness.coder]\nharness = "opencode"\nworkdir = "{repo}"\nmemory_briefing = true\n'


async def opencode_run(prompt: str, *, cwd: Path, env: dict[str, str]) -> list[dict]:
    done = await trio.run_process([str(agent_bin(OPENCODE_BIN)), "run", "--format", "json", "--title", "resident",
                                   "--model", OPENCODE_MODEL, prompt], cwd=cwd, env={**env, "PWD": str(cwd)},
                                  stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]


def script(repo: Path) -> list[Turn]:
    return [Turn([FunctionCall("memactors_recall", {"query": "ledger rounding"})]),
            Turn([FunctionCall("bash", {"command": f"{PYTEST} test_ledger.py", "description": "run the ledger test"})]),
            Turn([FunctionCall("write", {"filePath": str(repo / "NOTES.md"), "content": "round with Decimal\n"})]),
            Turn([Message("Left NOTES.md; test_rounding still fails (2.675 is not representable).")])]


#: What the session itself leaves in the project (git's objects, OpenCode's project id, the test run's caches).
SESSION_LEAVES = (".git/objects", ".git/opencode", ".pytest_cache", "__pycache__")


def installed_plugin(config: Path) -> tuple[Path, str | None]:
    """The plugin file an ``opencode.json`` names (install writes one entry), and its text (None: gone)."""
    [named] = json.loads(config.read_text(encoding="utf-8"))["plugin"]
    path = Path(named.removeprefix("file://"))
    return path, path.read_text(encoding="utf-8") if path.exists() else None


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under root, but what the session itself leaves there."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))
            if not p.relative_to(root).as_posix().startswith(SESSION_LEAVES)}


async def test_opencode_installed_in_a_project_starts_briefed_recalls_and_its_session_becomes_an_episode(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    async with run_fake_openai(script(repo)) as fake:
        env = {**os.environ, **opencode_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, harness(repo), env=env) as daemon:
            await add_fact(daemon)
            seeded = await seed(daemon, tmp_path)
            before = snapshot(repo)
            done = daemon.cli("install", "opencode", "--briefing-at-start", "--harness", "coder", "--project", str(repo))
            assert done.returncode == 0, done.stderr
            plugin, source = installed_plugin(repo / "opencode.json")
            assert plugin.parent == daemon.state / "installs"  # not in the project: nothing of OpenCode's there
            assert source is not None
            assert "hook opencode session-start" not in source  # argv arrays, never a shell line
            assert '"opencode", "session-start"' in source and "Bearer" not in source
            events = await opencode_run("What do we know about the ledger rounding?", cwd=repo, env=daemon.env)
            full = await the_only_episode(daemon)
            (repo / "NOTES.md").unlink()
            gone = daemon.cli("uninstall", "opencode", "--harness", "coder", "--project", str(repo))
            assert gone.returncode == 0, gone.stderr
        calls = gateway_calls(daemon.state)
    # the session started with its briefing in the system prompt, before the model was first asked anything
    first = json.dumps(fake.model_calls[0].body)
    # the gateway's MCP instructions (read your briefing first) reach the model too (REQ-15's pull)
    assert INSTRUCTIONS[:60] in json.dumps(fake.model_calls[0].body) and "Before you start work, read your briefing once" in json.dumps(fake.model_calls[0].body)
    assert FACT in first and 'source=\\"harness-memory\\" field=\\"briefing\\"' in first
    # the model called recall and got the earlier episode back
    [recalled] = fake.tool_outputs(1)
    assert seeded in recalled and "Decimal quantize" in recalled
    run = f"coder/{run_id_for('opencode', repo)}"
    assert calls == [(run, "briefing", "ok"), (run, "recall", "ok")]
    # the session became an episode: its edit, its failed test, its answer
    assert_the_failed_test_episode(full, adapter="opencode", run_id=events[0]["sessionID"])
    assert "2.675 is not representable" in full["result_excerpt"]
    # uninstall: the plugin and opencode.json gone, every file as it was (.git/info/exclude included)
    assert not (daemon.state / "installs" / plugin.name).exists()
    assert snapshot(repo) == before


async def test_opencode_with_the_daemon_down_starts_at_once_unbriefed_and_its_session_is_spooled_then_sent(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api", failing_test=True)
    async with run_fake_openai([Turn([FunctionCall("bash", {"command": f"{PYTEST} test_ledger.py",
                                                            "description": "run the ledger test"})]),
                                Turn([Message("Offline, and the test fails.")])]) as fake:
        env = {**os.environ, **opencode_user(tmp_path, fake.base_url)}
        with daemon_process(tmp_path, harness(repo), env=env) as daemon:
            done = daemon.cli("install", "opencode", "--briefing-at-start", "--harness", "coder", "--user")
            assert done.returncode == 0, done.stderr
        assert installed_plugin(tmp_path / ".config" / "opencode" / "opencode.json")[1] is not None
        events = await opencode_run("Run the ledger test.", cwd=repo, env=daemon.env)
    assert "harness-memory" not in json.dumps(fake.model_calls[0].body)
    failed_to_start, spooled = left_while_down(tmp_path / "state")
    assert failed_to_start == ["coder"]
    assert spooled["run_id"] == events[0]["sessionID"]
    assert (spooled["outcome"], spooled["reason"]) == ("failed", "verify_failed")
    with daemon_process(tmp_path, harness(repo)) as restarted:
        listed = await restarted.acli("memory", "episodes", "--harness", "coder", "--json")
    [episode] = json.loads(listed.stdout)["episodes"]
    assert episode["run_id"] == events[0]["sessionID"]
