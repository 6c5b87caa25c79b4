"""A resident pi after `memactors install pi --project`: the real CLI (pinned, from npm) headless (`pi -p`) in
the project it was installed for, against a loopback fake of the OpenAI-compatible Chat Completions API. pi
has no MCP client: memactors' extension gives it `recall` and `briefing` as tools, which reach the gateway as
the resident; nothing is prepended to its session (REQ-15); when the session shuts down the extension hands
its session file to `memactors hook pi session-end`, and it becomes an episode with its edit, its failed test
and its real duration. `uninstall` leaves `cmp`-identical files. The daemon as a process, memactors' CLI as a
subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from fix_agents import (
    FACT,
    PI_BIN,
    add_fact,
    agent_bin,
    assert_the_failed_test_episode,
    gateway_calls,
    pi_user,
)
from fix_daemon import daemon_process
from memactors.cli.install import run_id_for
from memactors.testing.fake_chat import Call, Reply, Step, run_fake_chat
from support_runs import PYTEST, make_repo

pytestmark = pytest.mark.slow

PI_VERSION = "0.73.1"


def test_make_installs_the_pinned_pi() -> None:
    shown = subprocess.run([str(agent_bin(PI_BIN)), "--version"], capture_output=True, text=True, timeout=120,
                           check=True)
    assert (shown.stdout + shown.stderr).split()[-1] == PI_VERSION  # pi prints it on stderr
#: The user's own project settings, in a layout json.dumps would not write: uninstall gives these bytes back.
OWN_SETTINGS = '{"theme": "dark", "extensions": ["./tools/mine.ts"]}'


@pytest.mark.req15
async def test_an_installed_pi_session_recalls_through_the_extension_and_is_recorded_when_it_shuts_down(
        tmp_path: Path) -> None:
    pi = agent_bin(PI_BIN)
    repo = make_repo(tmp_path / "api", failing_test=True)
    (repo / "tools").mkdir()
    (repo / "tools" / "mine.ts").write_text("export default function () {}\n", encoding="utf-8")
    settings = repo / ".pi" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(OWN_SETTINGS, encoding="utf-8")
    before = tmp_path / "before"
    shutil.copytree(repo, before)
    script = [Step([Call("recall", {"query": "ledger rounding"})]),
              Step([Call("write", {"path": str(repo / "NOTES.md"), "content": "round with Decimal\n"})]),
              Step([Call("bash", {"command": f"{PYTEST} test_ledger.py"})]),
              Step([Reply("Left NOTES.md; test_rounding still fails.")])]
    async with run_fake_chat(script) as fake:
        pi_user(tmp_path, fake.base_url)
        with daemon_process(tmp_path, f'[harness.coder]\nharness = "claude-code"\nworkdir = "{repo}"\n') as daemon:
            await add_fact(daemon)
            done = daemon.cli("install", "pi", "--harness", "coder", "--project", str(repo))
            assert done.returncode == 0, done.stderr
            installed = json.loads(settings.read_text(encoding="utf-8"))
            assert installed["theme"] == "dark" and installed["extensions"][0] == "./tools/mine.ts"
            [extension] = [Path(e) for e in installed["extensions"][1:]]
            assert "Bearer" not in extension.read_text(encoding="utf-8")  # the token is not in the extension
            ran = await trio.run_process([str(pi), "--provider", "fake", "--model", "fake-chat", "-p",
                                          "Fix the ledger rounding test."], cwd=repo, env={**os.environ, **daemon.env},
                                         capture_stdout=True, capture_stderr=True, check=False)
            assert ran.returncode == 0, ran.stderr.decode(errors="replace")[-3000:]
            listed = json.loads(daemon.cli("memory", "episodes", "--harness", "coder", "--json").stdout)
            assert listed["episodes"], ran.stderr.decode(errors="replace")[-3000:]
            [row] = listed["episodes"]
            episode = json.loads(daemon.cli("memory", "episodes", row["episode_id"], "--json").stdout)[
                "episode"]
            removed = daemon.cli("uninstall", "pi", "--harness", "coder", "--project", str(repo))
            assert removed.returncode == 0, removed.stderr
    first = json.dumps(fake.agent_requests()[0].body)
    # REQ-15: nothing prepended; the briefing tool is offered, with what it is for
    assert FACT not in first and "memory-data" not in first
    assert {"recall", "briefing"} <= set(fake.agent_requests()[0].tool_names())
    # the recall went through the gateway as this resident's run, and its answer reached the model
    assert FACT in " ".join(fake.agent_requests()[1].tool_results())
    assert gateway_calls(daemon.state) == [(f"coder/{run_id_for('pi', repo)}", "recall", "ok")]
    # the extension's session_shutdown recorded what the session did
    assert_the_failed_test_episode(episode, adapter="pi", run_id=None)
    assert "still fails" in episode["result_excerpt"]
    assert episode["duration_ms"] > 0
    # uninstall gave the user's settings back byte for byte, and took its extension and token away
    assert settings.read_bytes() == (before / ".pi" / "settings.json").read_bytes()
    assert not extension.exists() and not list(extension.parent.glob("*.pi-gateway.json"))
