"""`memactors uninstall` with the daemon down queues the revocation of the resident's token in
the state directory; the daemon applies it when it next starts, before its gateway serves, so the
365-day token is refused from then on (it used to stay valid until uninstall was run again)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fix_agents import HARNESS, gateway_status, git_repo, read_json
from fix_daemon import Daemon, daemon_process

pytestmark = pytest.mark.slow


def _memactors(env: dict[str, str], *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**env, "HOME": str(home)}
    env.pop("CODEX_HOME", None)
    env.pop("CLAUDE_CONFIG_DIR", None)
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)


async def test_uninstall_with_the_daemon_down_queues_the_revocation_and_the_next_start_applies_it(
        tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    home = tmp_path / "user"
    home.mkdir()
    (tmp_path / "d").mkdir()
    daemon: Daemon
    with daemon_process(tmp_path / "d", HARNESS) as daemon:
        done = _memactors(daemon.env, "install", "claude-code", "--harness", "coder", "--project", str(repo),
                          home=home)
        assert done.returncode == 0, done.stderr
        token = read_json(repo / ".claude" / "settings.local.json")["env"]["MEMACTORS_RESIDENT_TOKEN"]  # type: ignore[index]
        assert await gateway_status(daemon.gateway, token) == 200
        env = daemon.env
    # the daemon is down now
    gone = _memactors(env, "uninstall", "claude-code", "--harness", "coder", "--project", str(repo), "--json",
                      home=home)
    assert gone.returncode == 0, gone.stderr
    report = json.loads(gone.stdout)
    assert report["revoked"] is None and report["revocation_queued"] is True
    assert (tmp_path / "d" / "state" / "revocations-spool.jsonl").exists()
    with daemon_process(tmp_path / "d", HARNESS) as again:
        assert await gateway_status(again.gateway, token) == 401
        assert not (tmp_path / "d" / "state" / "revocations-spool.jsonl").exists()  # applied, not kept
        log = again.log.read_text(encoding="utf-8")
        assert "queued token revocation applied" in log
