"""A duration past the longest one (`999999999d`), or a time a date cannot reach, in every input that takes
one — `memory episodes --since`, the console's `since` filter, `store export --since`, `import git
--since`, `token mint --ttl` and a configured duration — is a clear "invalid argument" naming the flag or key and the limit
(exit 5, HTTP 400), never INTERNAL, a 500 or a traceback. The CLI as a subprocess, the daemon as a
process, the console over HTTP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from support import write_config
from support_console import console_daemon, csrf_of
from support_runs import make_repo

pytestmark = pytest.mark.slow

LONG = "999999999d"
LIMIT = "36500d"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False, timeout=300)


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 5, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "INTERNAL" not in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def test_a_duration_past_the_longest_is_refused_naming_the_flag_and_the_limit(tmp_path: Path) -> None:
    daemon = console_daemon(tmp_path)
    try:
        env = daemon.env
        refused(cli(env, "memory", "episodes", "--since", LONG), "--since", LIMIT)
        refused(cli(env, "memory", "episodes", "--since", LONG, "--json"), "--since", LIMIT)
        refused(cli(env, "memory", "episodes", "--since", "0001-01-01T00:00:00+01:00"), "--since")
        refused(cli(env, "store", "export", "--since", LONG), "--since", LIMIT)
        refused(cli(env, "store", "export", "--since", "0001-01-01T00:00:00+01:00"), "--since")
        repo = make_repo(tmp_path / "repo")
        refused(cli(env, "import", "git", "--repo", str(repo), "--since", LONG), "--since", LIMIT)
        refused(cli(env, "token", "mint", "api-fixer", "--ttl", LONG), "--ttl", LIMIT)
        assert cli(env, "memory", "episodes", "--since", "36500d").returncode == 0  # the limit itself is taken
        base = daemon.info["console"].rstrip("/")
        with httpx2.Client(base_url=base, timeout=60, follow_redirects=False) as client:
            page = client.get("/login")
            client.post("/login", data={"csrf": csrf_of(page.text), "token": daemon.token("read")},
                        headers={"origin": base})
            for since in (LONG, "0001-01-01T00:00:00+01:00"):
                answer = client.get("/episodes", params={"since": since})
                assert answer.status_code == 400, (answer.status_code, answer.text[:500])
            assert LIMIT in client.get("/episodes", params={"since": LONG}).text
        assert "Traceback" not in daemon.log_text()
    finally:
        daemon.stop()


def test_a_configured_duration_past_the_longest_names_its_key_and_the_limit(tmp_path: Path) -> None:
    config = write_config(tmp_path, f'[memory.episodes]\nretention = "{LONG}"\n')
    env = {"HARNESS_CONFIG": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    refused(cli(env, "store", "export"), "retention", LIMIT)
