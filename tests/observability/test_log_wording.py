"""Log wording: peers as host:port, one INFO line per CLI call, expected client errors at
INFO with their code (never a warning), and `configuration reloaded` once per SIGHUP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fix_daemon import daemon_in_process
from memactors.rpc.server import peer_text
from support import LogRecords

pytestmark = pytest.mark.slow


def test_a_peer_is_written_as_host_port() -> None:
    from trio_websocket._impl import Endpoint

    assert peer_text(Endpoint("127.0.0.1", 52044, False)) == "127.0.0.1:52044"
    assert peer_text(Endpoint("::1", 7377, False)) == "[::1]:7377"


async def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "memactors.cli", *args, "--config", str(config)], capture_output=True, text=True,
        timeout=120, check=False))


async def test_a_cli_call_is_one_info_line_and_a_client_error_is_logged_once_with_its_code(tmp_path: Path) -> None:
    with LogRecords() as logs:
        async with daemon_in_process(tmp_path) as (config, _):
            mark = logs.mark()
            assert (await _cli(config, "memory", "status")).returncode == 0
            await logs.wait_for("rpc connection closed")
            during = [r for r in logs.since(mark) if r["level"] in ("INFO", "WARNING", "ERROR")]
            assert [r["message"] for r in during] == ["rpc connection closed"]
            assert re.fullmatch(r"127\.0\.0\.1:\d+", during[0]["extra"]["peer"])
            assert during[0]["extra"]["calls"] == 1 and "errors" not in during[0]["extra"]

            mark = logs.mark()
            missing = await _cli(config, "memory", "episodes", "ep_00000000000000000000")
            assert missing.returncode == 4
            await logs.wait_for("rpc connection closed", 2)
            during = [r for r in logs.since(mark) if r["level"] in ("INFO", "WARNING", "ERROR")]
            assert [(r["level"], r["message"]) for r in during] == [("INFO", "rpc connection closed")]
            assert during[0]["extra"]["errors"] == "NOT_FOUND:1"


async def test_sighup_logs_configuration_reloaded_once(tmp_path: Path) -> None:
    with LogRecords() as logs:
        async with daemon_in_process(tmp_path) as (config, _):
            os.kill(os.getpid(), signal.SIGHUP)
            await logs.wait_for("configuration reloaded")
            # A second, failing reload: the signal task handles signals in order, so once this one is
            # logged, everything the first SIGHUP logged is in.
            config.write_text(config.read_text() + "[memory]\nprovider = \"nowhere\"\n")
            os.kill(os.getpid(), signal.SIGHUP)
            await logs.wait_for("configuration reload failed; keeping the last good one")
            assert len(logs.matching("configuration reloaded")) == 1
