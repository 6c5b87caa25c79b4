"""What docs/ and examples/ promise an outsider: the commented example configuration loads, and the
minimal provider in examples/ passes `memactors memory provider check` over stdio."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fix_daemon import daemon_in_process
from memactors.config import load_config
from support import EXAMPLES


def test_the_example_configuration_loads_with_its_harnesses_and_ports(tmp_path: Path) -> None:
    config = load_config(EXAMPLES / "harness.toml", env={"HOME": str(tmp_path)})
    assert sorted(config.harness) == ["api-fixer", "billing-bot"]
    assert config.harness["api-fixer"].memory_briefing
    assert not config.harness["billing-bot"].records_episodes
    assert (config.operator.port, config.gateway.port, config.metrics.port) == (7377, 7378, 9477)
    assert config.store.path == tmp_path / ".local/share/harness"
    assert "mini" in config.mcp and config.memory.provider == "builtin"


@pytest.mark.slow
@pytest.mark.req4
async def test_req4_the_minimal_example_provider_passes_the_check_over_stdio(tmp_path: Path) -> None:
    provider = EXAMPLES / "minimal_provider.py"
    assert len(provider.read_text().splitlines()) <= 60  # "a provider in about fifty lines"
    mini = f'[mcp.mini]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(provider))}]\n'
    async with daemon_in_process(tmp_path, mini) as (config, _):
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "memactors.cli", "memory", "provider", "check", "--provider", "mini", "--json",
             "--config", str(config)], capture_output=True, text=True, timeout=120, check=False))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["provider_name"] == "minimal"
    assert [c["status"] for c in report["checks"]] == ["pass"] * 7, report["checks"]


@pytest.mark.slow
def test_demo_ingests_the_packaged_examples_into_the_running_daemon_and_its_next_steps_work(tmp_path: Path) -> None:
    from fix_daemon import daemon_process
    from memactors.cli.demo import examples_dir

    # the examples the wheel ships are the repository's (src/memactors/examples is a link to them)
    assert sorted(p.name for p in examples_dir().glob("run-*.json")) == sorted(p.name for p in EXAMPLES.glob("run-*.json"))
    with daemon_process(tmp_path) as daemon:
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=daemon.env, capture_output=True,
                                  text=True, timeout=300, check=False)

        first = cli("demo")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("3 record(s): 3 recorded"), first.stdout
        step = next(line for line in first.stdout.splitlines() if "finds run 42" in line)
        found = cli(*shlex.split(step.split("#")[0])[1:], "--json")
        assert found.returncode == 0, found.stderr
        assert [e["run_id"] for e in json.loads(found.stdout)["episodes"]][0] == "42"
        again = cli("demo", "--json")
        assert [r["outcome"] for r in json.loads(again.stdout)] == ["duplicate"] * 3


def test_the_container_configuration_loads_and_its_ports_are_the_ones_the_image_and_compose_publish(
        tmp_path: Path) -> None:
    docker = EXAMPLES.parent / "docker"
    config = load_config(docker / "harness.toml", env={"HOME": str(tmp_path)})
    ports = {config.operator.port, config.gateway.port, config.metrics.port}
    assert str(config.store.path) == "/var/lib/memactors"
    expose = next(line for line in (docker / "Dockerfile").read_text().splitlines() if line.startswith("EXPOSE"))
    assert {int(p) for p in expose.split()[1:]} == ports
    published = re.findall(r'"127\.0\.0\.1:(\d+):(\d+)"', (docker / "compose.yaml").read_text())
    assert {(int(a), int(b)) for a, b in published} == {(p, p) for p in ports}


def test_every_memactors_command_in_the_readme_parses() -> None:
    """The README's commands are what a new user types first: each `memactors …` line of its shell blocks
    is a command and flags the CLI accepts (a renamed command or flag fails here, not in their terminal)."""
    from memactors.cli import build_parser

    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    commands = [shlex.split(line.split(" #")[0].split(" > ")[0].split(" | ")[0]) for line in lines
                if line.startswith("memactors ")]
    assert len(commands) >= 15, commands
    from memactors.cli.demo import OTHER_WORDS

    assert ["memactors", "memory", "recall", OTHER_WORDS, "--repo", "forge.example/acme/api"] in commands
    parser = build_parser()
    for argv in commands:
        try:
            parser.parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code != 0:  # --version exits 0
                raise AssertionError(f"README: `{shlex.join(argv)}` does not parse") from exc
