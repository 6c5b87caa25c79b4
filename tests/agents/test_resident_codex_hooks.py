"""A resident Codex is recorded and briefed. `memactors install codex --project` adds to the project's
`.codex/config.toml` a SessionStart hook (the resident's briefing, pulled from the gateway with its token, as the
session's additional context) and a SessionEnd hook (the session's rollout file → its run record → the daemon,
spooled when the daemon is down). The real `codex exec` — the pinned one and a newer one — runs headless against
the loopback Responses fake; the daemon is a process and every memactors command a subprocess.

Codex runs a hook only once its user trusted it (`/hooks`); these headless sessions pass
`--dangerously-bypass-hook-trust`, the flag Codex gives automation that vets its own hooks."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trio

from fix_agents import CODEX_VERSIONS, FACT, add_fact, codex_bin, codex_env, fake_provider_args, git_repo
from fix_daemon import Daemon, daemon_process
from memactors.gateway import INSTRUCTIONS
from memactors.testing.fake_openai import Message, PatchCall, ShellCall, Turn, run_fake_openai
from support_runs import PYTEST, REPO_KEY, make_repo

pytestmark = pytest.mark.slow

HARNESS = '[harness.coder]\nharness = "codex"\n'
SCRIPT = [
    Turn([PatchCall("*** Begin Patch\n*** Add File: NOTES.md\n+rounding is binary floating point\n*** End Patch\n")]),
    Turn([ShellCall(["bash", "-lc", f"{PYTEST} test_ledger.py"], timeout_ms=300_000)]),  # a loaded machine
    Turn([Message("Left NOTES.md; test_rounding still fails (2.675 is not representable).")]),
]


async def install(daemon: Daemon, repo: Path, codex_home: Path) -> subprocess.CompletedProcess[bytes]:
    done = await trio.run_process(
        [sys.executable, "-m", "memactors.cli", "install", "codex", "--briefing-at-start", "--harness", "coder", "--project", str(repo)],
        env={**daemon.env, "CODEX_HOME": str(codex_home)}, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done


async def codex_exec(codex: Path, repo: Path, env: dict[str, str], base_url: str, prompt: str, *,
                     bypass_hook_trust: bool = True) -> list[dict]:
    """A headless resident session in the (trusted) project: its JSON events."""
    bypass = ["--dangerously-bypass-hook-trust"] if bypass_hook_trust else []
    done = await trio.run_process(
        [str(codex), "exec", "--json", "--trust", *bypass,
         "--dangerously-bypass-approvals-and-sandbox", *fake_provider_args(base_url), "--", prompt],
        cwd=repo, env=env, stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, (out[-2000:], done.stderr.decode(errors="replace")[-2000:])
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def trust_hooks_as_slash_hooks_does(codex: Path, repo: Path, env: dict[str, str]) -> list[str]:
    """Trust every hook Codex lists for ``repo`` through its app-server, the API its TUI's ``/hooks`` uses:
    ``hooks/list`` gives each hook's key and current hash, ``config/batchWrite`` records them as trusted
    (``[hooks.state."<key>"] trusted_hash`` in the user's config.toml). Returns the hooks' commands."""
    with subprocess.Popen([str(codex), "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, env=env, cwd=repo) as server:
        assert server.stdin is not None and server.stdout is not None

        def call(n: int, method: str, params: dict) -> dict:
            server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\n")
            server.stdin.flush()
            for line in server.stdout:  # blocks until the server's next message: no polling
                answer = json.loads(line)
                if answer.get("id") == n:
                    assert "result" in answer, answer
                    return answer["result"]
            raise AssertionError(f"codex app-server exited before answering {method}")

        call(1, "initialize", {"clientInfo": {"name": "memactors-tests", "version": "1"}})
        server.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "initialized"}) + "\n")
        [listed] = call(2, "hooks/list", {"cwds": [str(repo)]})["data"]
        hooks = listed["hooks"]
        call(3, "config/batchWrite", {"edits": [
            {"keyPath": f'hooks.state."{h["key"]}"', "value": {"trusted_hash": h["currentHash"]},
             "mergeStrategy": "upsert"} for h in hooks]})
        server.stdin.close()
    return [h["command"] for h in hooks if h["trustStatus"] != "trusted"]


def thread_id(events: list[dict]) -> str:
    [started] = [e for e in events if e.get("type") == "thread.started"]
    return str(started["thread_id"])


async def recall(daemon: Daemon, query: str) -> dict:
    done = await daemon.acli("memory", "recall", query, "--repo", REPO_KEY, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("which", CODEX_VERSIONS)
async def test_an_installed_codex_session_starts_with_its_briefing_and_is_recorded_as_an_episode(
        tmp_path: Path, which: str) -> None:
    codex = codex_bin(which)
    repo = make_repo(tmp_path / "api", failing_test=True)
    async with run_fake_openai(SCRIPT) as fake:
        env = codex_env(tmp_path / "codex-home")
        with daemon_process(tmp_path, HARNESS, env=env) as daemon:
            await add_fact(daemon)
            installed = await install(daemon, repo, tmp_path / "codex-home")
            events = await codex_exec(codex, repo, env, fake.base_url, "Fix the ledger rounding test.")
            # Codex has returned: its SessionEnd hook ran before it exited, so the episode is there now
            recalled = await recall(daemon, "test_rounding still fails, 2.675 not representable")
            listed = await daemon.acli("memory", "episodes", "--harness", "coder", "--json")
            [shown_id] = [e["episode_id"] for e in recalled["episodes"] if e["run_id"] == thread_id(events)]
            shown = await daemon.acli("memory", "episodes", shown_id, "--json")
    assert "/hooks" in installed.stderr.decode()  # install says Codex asks the user to trust the hooks
    config = tomllib.loads((repo / ".codex" / "config.toml").read_text(encoding="utf-8"))
    [start] = config["hooks"]["SessionStart"]
    assert "hook codex session-start" in start["hooks"][0]["command"]
    assert "Bearer" not in start["hooks"][0]["command"]  # the token is read from config.toml, never argv
    # the briefing reached the model's context before its first answer: fenced, with the repository's fact
    first = json.dumps(fake.model_calls[0].body)
    # the gateway's MCP instructions (read your briefing first) reach the model too (REQ-15's pull)
    assert INSTRUCTIONS[:60] in json.dumps(fake.model_calls[0].body) and "Before you start work, read your briefing once" in json.dumps(fake.model_calls[0].body)
    assert FACT in first and 'source=\\"harness-memory\\" field=\\"briefing\\"' in first
    assert "Fix the ledger rounding test." in fake.first_user_text()  # the user's prompt, as typed
    # the session became an episode, recalled by the CLI: its edited file, its failed test, its answer
    session = thread_id(events)
    [episode] = [e for e in recalled["episodes"] if e["run_id"] == session]
    assert (episode["harness"], episode["adapter"], episode["outcome"]) == ("coder", "codex", "failed")
    assert "touched NOTES.md" in episode["text"] and "verify failures: test_failure" in episode["text"]
    assert "2.675 is not representable" in episode["text"]
    detail = json.loads(shown.stdout)["episode"]
    assert detail["episode_id"] == episode["episode_id"] and detail["files_touched"] == ["NOTES.md"]
    assert detail["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
    assert [e["run_id"] for e in json.loads(listed.stdout)["episodes"]] == [session]


async def test_codex_skips_the_hooks_until_they_are_trusted_then_briefs_and_records_the_session(
        tmp_path: Path) -> None:
    codex = codex_bin()
    repo = make_repo(tmp_path / "api", failing_test=True)
    env = codex_env(tmp_path / "codex-home")
    with daemon_process(tmp_path, HARNESS, env=env) as daemon:
        await add_fact(daemon)
        await install(daemon, repo, tmp_path / "codex-home")
        # not trusted yet: a headless session runs without the hooks, and says nothing about them
        async with run_fake_openai([Turn([Message("Nothing to do.")])]) as untrusted:
            before = await codex_exec(codex, repo, env, untrusted.base_url, "Say hello.", bypass_hook_trust=False)
        assert FACT not in json.dumps(untrusted.model_calls[0].body)
        assert not [e for e in before if "hook" in json.dumps(e).lower()]
        # the user trusts them (what /hooks does); from then on every session is briefed and recorded
        trusted = trust_hooks_as_slash_hooks_does(codex, repo, env)
        async with run_fake_openai(SCRIPT) as fake:
            after = await codex_exec(codex, repo, env, fake.base_url, "Fix the ledger rounding test.",
                                     bypass_hook_trust=False)
        listed = await daemon.acli("memory", "episodes", "--harness", "coder", "--json")
    assert sorted(" hook codex session-start " in c or " hook codex session-end " in c for c in trusted) == [
        True, True]
    assert FACT in json.dumps(fake.model_calls[0].body)
    assert [e["run_id"] for e in json.loads(listed.stdout)["episodes"]] == [thread_id(after)]


async def test_a_codex_session_with_the_daemon_down_is_spooled_and_delivered_when_it_is_back(
        tmp_path: Path) -> None:
    codex = codex_bin()
    repo = make_repo(tmp_path / "api", failing_test=True)
    env = codex_env(tmp_path / "codex-home")
    with daemon_process(tmp_path, HARNESS, env=env) as daemon:
        await install(daemon, repo, tmp_path / "codex-home")
    # the daemon is down: the session starts at once without a briefing, and its end is spooled
    async with run_fake_openai(SCRIPT) as offline:
        events = await codex_exec(codex, repo, env, offline.base_url, "Fix the ledger rounding test.")
    assert "harness-memory" not in json.dumps(offline.model_calls[0].body)
    session = thread_id(events)
    spooled = daemon.state / "session-spool.jsonl"
    [entry] = [json.loads(line) for line in spooled.read_text(encoding="utf-8").splitlines()]
    assert entry["record"]["run_id"] == session and entry["record"]["adapter"] == "codex"
    assert entry["source"] == f"codex session-end {session}"
    waiting = daemon.cli("spool", "--json")
    assert json.loads(waiting.stdout)["pending"] == 1
    # the briefing it could not give is counted for doctor
    [failed] = (daemon.state / "session-start-failures.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(failed)["harness"] == "coder"
    # the daemon starts again and sends the spool: the session is an episode the CLI recalls
    with daemon_process(tmp_path, HARNESS, env=env) as restarted:
        with trio.fail_after(60):
            while True:
                recalled = await recall(restarted, "test_rounding still fails, 2.675 not representable")
                found = [e for e in recalled["episodes"] if e["run_id"] == session]
                if found:
                    break
                await trio.sleep(0.1)
    assert "touched NOTES.md" in found[0]["text"] and found[0]["adapter"] == "codex"
    assert not spooled.exists()


def test_install_codex_adds_its_hooks_beside_the_users_own_and_uninstall_gives_the_file_back(
        tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    (repo / ".codex").mkdir()
    config = repo / ".codex" / "config.toml"
    mine = ('# my Codex settings\nmodel = "gpt-5.5"\n\n[[hooks.Stop]]\n'
            'hooks = [{ type = "command", command = "notify-send done" }]\n')
    config.write_text(mine, encoding="utf-8")
    with daemon_process(tmp_path, HARNESS) as daemon:
        env = {**daemon.env, "HOME": str(tmp_path / "home")}
        argv = [sys.executable, "-m", "memactors.cli", "--config", daemon.env["HARNESS_CONFIG"]]
        done = subprocess.run([*argv, "install", "codex", "--briefing-at-start", "--harness", "coder", "--project", str(repo)], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        data = tomllib.loads(config.read_text(encoding="utf-8"))
        again = subprocess.run([*argv, "install", "codex", "--briefing-at-start", "--harness", "coder", "--project", str(repo)], env=env,
                               capture_output=True, text=True, timeout=120, check=False)
        assert again.returncode == 0, again.stderr
        reinstalled = tomllib.loads(config.read_text(encoding="utf-8"))
        removed = subprocess.run([*argv, "uninstall", "codex", "--harness", "coder", "--project", str(repo)],
                                 env=env, capture_output=True, text=True, timeout=120, check=False)
        assert removed.returncode == 0, removed.stderr
    # the user's Stop hook kept; one SessionStart and one SessionEnd group of memactors' added
    assert data["hooks"]["Stop"] == [{"hooks": [{"type": "command", "command": "notify-send done"}]}]
    [start], [end] = data["hooks"]["SessionStart"], data["hooks"]["SessionEnd"]
    assert start["hooks"][0]["command"].endswith("hook codex session-start --harness coder --project "
                                                 f"{repo.resolve()}")
    assert " hook codex session-end --harness coder" in end["hooks"][0]["command"]
    # SessionEnd at Codex's most (it clamps a longer one to 3 s, with a warning in every session)
    assert (start["hooks"][0]["timeout"], end["hooks"][0]["timeout"]) == (10, 3)
    # installing again rotates the token and adds no second hook
    assert reinstalled["hooks"] == data["hooks"]
    assert reinstalled["mcp_servers"]["memactors"]["http_headers"] != data["mcp_servers"]["memactors"]["http_headers"]
    # uninstall: the file install found, byte for byte
    assert config.read_bytes() == mine.encode()
