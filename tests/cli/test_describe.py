"""REQ-20 (SPEC-0006 "Prompt Source"): `memactors describe <harness>` shows the prompt as configured,
never the briefing a `memory_briefing = true` one-shot had prepended at spawn.

The daemon runs as a process; the runs and `describe` go through the CLI as subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fix_daemon import daemon_process
from support_runs import AGENT, make_repo

PROMPT = "triage"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          timeout=180, check=False)


def triage_harness(repo: Path, out: Path) -> str:
    command = f"{sys.executable} {AGENT} write {out} {{prompt}}"
    return (f'\n[harness.nightly-triage]\nharness = "command"\nworkdir = "{repo}"\n'
            f"command = '{command}'\nprompt = \"{PROMPT}\"\nmemory_briefing = true\n")


@pytest.mark.req20
@pytest.mark.slow
def test_req20_the_stored_prompt_is_unchanged(tmp_path: Path) -> None:
    """WHEN a memory_briefing = true harness with prompt = "triage" runs and `describe --json` is read
    THEN its prompt is "triage", with no briefing text."""
    repo = make_repo(tmp_path / "api")
    out = tmp_path / "agent"
    with daemon_process(tmp_path, extra_config=triage_harness(repo, out)) as daemon:
        for _ in range(2):  # the second run's briefing holds the first run's episode
            done = cli(daemon.env, "run", "nightly-triage", "--wait", "--json")
            assert done.returncode == 0, done.stderr
        described = cli(daemon.env, "describe", "nightly-triage", "--json")
        text = cli(daemon.env, "describe", "nightly-triage")
    assert described.returncode == 0, described.stderr
    doc = json.loads(described.stdout)
    assert doc["prompt"] == PROMPT and doc["prompt_source"] == "prompt"
    assert doc["memory_briefing"] is True and doc["adapter"] == "command"
    assert {doc["prompt_file"], doc["prompt_template"], doc["prompt_template_file"]} == {None}
    # The run really had a briefing prepended: the agent's argv held the fence, then the prompt unchanged.
    given = (out / "prompt-1.txt").read_text(encoding="utf-8")
    assert given.startswith('<untrusted-data source="harness-memory" field="briefing" nonce="')
    assert given.endswith(f"\n\n{PROMPT}")
    briefing = given[: -len(PROMPT) - 2]
    for shown in (described.stdout, text.stdout):
        assert "untrusted-data" not in shown and "harness-memory" not in shown
        assert not any(line in shown for line in briefing.splitlines() if len(line) > 20)
    assert text.returncode == 0 and text.stdout.rstrip().endswith(f"prompt:\n{PROMPT}")


@pytest.mark.slow
def test_describe_names_an_unconfigured_harness_and_shows_a_prompt_file_as_configured(tmp_path: Path) -> None:
    extra = ('\n[harness.reader]\nharness = "claude-code"\nprompt_file = "~/prompts/triage.md"\n'
             '\n[harness.resident]\nharness = "claude-code"\n')
    with daemon_process(tmp_path, extra_config=extra) as daemon:
        shown = cli(daemon.env, "describe", "reader", "--json")
        resident = cli(daemon.env, "describe", "resident")
        missing = cli(daemon.env, "describe", "nobody")
    doc = json.loads(shown.stdout)
    assert (doc["prompt_source"], doc["prompt_file"], doc["prompt"]) == ("prompt_file", "~/prompts/triage.md", None)
    assert "prompt source    none (not a prompt one-shot)" in resident.stdout
    assert missing.returncode == 5 and "[harness.nobody]" in missing.stderr and "Traceback" not in missing.stderr
