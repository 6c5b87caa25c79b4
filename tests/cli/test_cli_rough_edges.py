"""The CLI's rough edges, as a user meets them (the CLI as a subprocess): "did you mean" for a
mistyped command or flag, fish completion beside bash and zsh, and `--help` texts written for users
(no internal docstrings, RPC method names or reST markup)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memactors import cli


def memactors(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize(("argv", "hint"), [
    (["rn"], "did you mean 'run'?"),
    (["memroy", "status"], "did you mean 'memory'?"),
    (["runs", "lsit"], "did you mean 'list'?"),
    (["memory", "provider", "chek"], "did you mean 'check'?"),
    (["completion", "fsh"], "did you mean 'fish'?"),
    (["run", "nightly", "--wiat"], "did you mean '--wait' for '--wiat'?"),
    (["memory", "status", "--jsn"], "did you mean '--json' for '--jsn'?"),
    (["runs", "logs", "r1", "--folow"], "did you mean '--follow' for '--folow'?"),
])
def test_a_mistyped_command_or_flag_gets_did_you_mean(argv: list[str], hint: str) -> None:
    done = memactors(*argv)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ") and done.stderr.rstrip().endswith(hint), done.stderr


def test_a_word_nothing_resembles_gets_no_guess() -> None:
    done = memactors("zzzzqqq")
    assert done.returncode == 2 and "invalid choice" in done.stderr and "did you mean" not in done.stderr


def _command_paths() -> list[list[str]]:
    paths: list[list[str]] = []

    def walk(parser: object, path: list[str]) -> None:
        paths.append(path)
        for action in parser._actions:  # type: ignore[attr-defined]
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for name, child in action.choices.items():
                    walk(child, [*path, name])

    walk(cli.build_parser(), [])
    return paths


#: What a user's help must not show: reST markup, Sphinx roles, the RPC's method names, private modules.
INTERNAL = re.compile(r"``|:(?:func|class|meth|mod):|\b(?:Mint|Revoke|Ingest|Get|List)[A-Z][A-Za-z]+\b|\b_[a-z]\w+\b")


@pytest.mark.slow
def test_every_commands_help_is_written_for_users() -> None:
    paths = _command_paths()
    assert ["install"] in paths and ["memory", "provider", "check"] in paths and len(paths) > 30
    leaks = {}
    for path in paths:
        done = memactors(*path, "--help")
        assert done.returncode == 0, (path, done.stderr)
        found = INTERNAL.findall(done.stdout.replace("_memactors", ""))  # zsh's completion file name
        if found:
            leaks[" ".join(path)] = found
    assert leaks == {}
    install = memactors("install", "--help").stdout
    assert "Connect a resident agent" in install and "--dry-run prints the changes" in " ".join(install.split())


def fish() -> str:
    path = shutil.which("fish")
    if path is None:
        pytest.fail("fish is missing: `make test` installs it (test-tools)")
    return path


def test_fish_completion_completes_commands_subcommands_flags_and_choices(tmp_path: Path) -> None:
    done = memactors("completion", "fish")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "memactors.fish"
    script.write_text(done.stdout, encoding="utf-8")
    assert subprocess.run([fish(), "-n", str(script)], capture_output=True, check=False).returncode == 0

    def complete(line: str) -> list[str]:
        out = subprocess.run([fish(), "--no-config", "-c", f"source {script}; complete -C {line!r}"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return [row.split("\t", 1)[0] for row in out.splitlines()]

    assert {"run", "runs"} == set(complete("memactors ru"))
    assert {"list", "logs"} == set(complete("memactors runs l"))
    assert "list" in complete("memactors --config x.toml runs ")  # an option's value is skipped
    assert complete("memactors run nightly --wa") == ["--wait"]
    assert set(complete("memactors completion ")) == {"bash", "zsh", "fish"}
    assert set(complete("memactors memory provider ")) == {"check", "schema"}
    assert "--json" in complete("memactors memory status --")
