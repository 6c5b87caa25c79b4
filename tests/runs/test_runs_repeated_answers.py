"""What the agent said is what is remembered.

A run's prompt scrub keeps the *operator's* prompt and the fence nonce out of the episode (REQ-5,
REQ-16), never the briefing's items: an agent whose answer repeats a line of its briefing (a recurring
job's stable "No new issues.") keeps that answer in its episode, its log and the next briefing. Driven
as a user does: the daemon as a process, `memactors run --wait` and the CLI as subprocesses, the real
`claude` against the loopback Anthropic fake, and the `command` adapter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fix_daemon import serving_env as daemon
from memactors.testing.fake_anthropic import Script, Text, run_fake_anthropic
from support import write_config
from support_runs import base_env, claude_binary, claude_env, cli, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.req5, pytest.mark.req16]

FENCE = re.compile(r'<untrusted-data source="harness-memory" field="briefing" nonce="([^"]+)">')


async def episode_of(env: dict[str, str], episode_id: str) -> dict[str, object]:
    shown = await cli(env, "memory", "episodes", episode_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["episode"]


async def run_twice(env: dict[str, str], harness: str) -> list[dict[str, object]]:
    runs = []
    for _ in range(2):
        done = await cli(env, "run", harness, "--wait", "--json")
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout))
    return runs


def claude_config(tmp_path: Path, repo: Path, prompt: str) -> Path:
    return write_config(tmp_path, f"""
[harness.nightly]
harness = "claude-code"
workdir = "{repo}"
command = "{claude_binary()}"
prompt = {json.dumps(prompt)}
memory_briefing = true
timeout = "5m"
""")


async def test_a_claude_answer_that_repeats_its_briefing_is_kept(tmp_path: Path) -> None:
    """The second run's briefing holds the first run's answer; the second run answers the same: its
    episode, its log and the next briefing keep the answer, never `[prompt]`."""
    repo = make_repo(tmp_path / "api")
    # A briefing shows an episode by its subject, the answer's first sentence (short items):
    # that is the line the second run's answer repeats.
    subject = "No new issues in the ledger since the last run"
    answer = f"{subject}. The reconcile job and the invoice export both finished cleanly overnight."
    config = claude_config(tmp_path, repo, "Check the ledger for new issues and report in one line.")
    async with run_fake_anthropic(Script((Text(answer),))) as fake:
        env = claude_env(tmp_path, config, fake.base_url)
        with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
            first, second = await run_twice(env, "nightly")
            prompts = [r.first_user_text() for r in fake.agent_requests()]
            assert subject in prompts[-1] and FENCE.search(prompts[-1])  # the briefing the second run got
            for run in (first, second):
                assert (await episode_of(env, str(run["episode_id"])))["result_excerpt"] == answer
            logs = await cli(env, "runs", "logs", str(second["run_id"]))
            assert logs.returncode == 0, logs.stderr
            assert answer.encode() in logs.stdout and b"[prompt]" not in logs.stdout
            briefing = await cli(env, "memory", "briefing", "nightly")
            assert briefing.returncode == 0, briefing.stderr
            assert subject.encode() in briefing.stdout and b"[prompt]" not in briefing.stdout


async def test_a_claude_answer_that_repeats_the_operator_prompt_is_scrubbed(tmp_path: Path) -> None:
    """REQ-5: the operator's prompt stays out of the episode; a line of it that the answer repeats is
    `[prompt]` in the episode and the log, and the fence's nonce never appears."""
    repo = make_repo(tmp_path / "api")
    line = "Check the ledger for new issues and report in one line."
    config = claude_config(tmp_path, repo, f"{line}\nBe brief.")
    async with run_fake_anthropic(Script((Text(f"You asked: {line}\nDone, nothing found: the ledger has no new issues since "
                                            "yesterday's reconcile run."),))) as fake:
        env = claude_env(tmp_path, config, fake.base_url)
        with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
            _, second = await run_twice(env, "nightly")
            nonce = FENCE.search(fake.agent_requests()[-1].first_user_text())
            assert nonce is not None
            excerpt = str((await episode_of(env, str(second["episode_id"])))["result_excerpt"])
            assert line not in excerpt and "You asked: [prompt]" in excerpt and "nothing found" in excerpt
            logs = await cli(env, "runs", "logs", str(second["run_id"]))
            assert logs.returncode == 0, logs.stderr
            assert line.encode() not in logs.stdout and nonce.group(1).encode() not in logs.stdout
            assert b"nothing found" in logs.stdout


async def test_a_command_harness_printing_one_stable_line_keeps_it(tmp_path: Path) -> None:
    """The `command` case: memory_briefing = true, a program that prints one stable line and
    edits nothing, `memactors run nightly --wait` twice; the second episode keeps the line, and
    `memory briefing nightly` shows its subject."""
    repo = make_repo(tmp_path / "api")
    subject = "All checks passed, nothing to report"  # what a briefing shows of it: its first sentence
    said = f"{subject}. Lint, unit tests and the nightly ledger reconcile are green."
    config = write_config(tmp_path, f"""
[harness.nightly]
harness = "command"
workdir = "{repo}"
command = "sh -c 'printf %s \\"$1\\" > {tmp_path}/prompt; echo {said}' agent"
prompt = "Run the nightly checks."
memory_briefing = true
""")
    env = base_env(tmp_path, config)
    with daemon(env, tmp_path / "state", tmp_path / "daemon.log"):
        _, second = await run_twice(env, "nightly")
        received = (tmp_path / "prompt").read_text(encoding="utf-8")
        assert subject in received and FENCE.search(received)  # the second run's briefing holds the line
        assert (await episode_of(env, str(second["episode_id"])))["result_excerpt"] == said
        briefing = await cli(env, "memory", "briefing", "nightly")
        assert briefing.returncode == 0, briefing.stderr
        assert subject.encode() in briefing.stdout and b"[prompt]" not in briefing.stdout
