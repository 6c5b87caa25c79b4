"""Contracts the daemon keeps as a whole: facts status, exported series, state directory."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from fix_daemon import daemon_in_process
from memactors.daemon import read_daemon_file
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.rpc.tokens import read_token
from support import example, write_config

SERVICE = "harness.v1.MemoryService"


@pytest.mark.req14
async def test_add_fact_honours_status_and_rejects_an_unknown_one_by_name(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening):
        control = read_token(tmp_path / "state", "control")
        async with connect_rpc(listening.operator, control) as rpc:
            base = {"scope": "project:forge.example/acme/api", "confidence": 0.9}
            retired = await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "ledger uses floats", "status": "retired"})
            suspect = await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "ledger flake is DNS", "status": "suspect"})
            live = await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "ledger uses decimals"})
            assert (retired["status"], suspect["status"], live["status"]) == ("retired", "suspect", "live")
            with pytest.raises(RpcError) as bad:
                await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "x", "status": "promoted"})
            assert bad.value.code == "INVALID_ARGUMENT" and "status" in str(bad.value)
            hit = await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "repo": "forge.example/acme/api"})
            served = {f["text"]: f for f in hit["facts"]}
            assert "ledger uses floats" not in served  # a retired fact is never served as live
            assert "ledger uses decimals" in served


@pytest.mark.req21
async def test_metrics_export_no_created_series(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening):
        control = read_token(tmp_path / "state", "control")
        async with connect_rpc(listening.operator, control) as rpc:
            await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})
            await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "repo": "forge.example/acme/api"})
        async with httpx2.AsyncClient() as http:
            text = (await http.get(listening.metrics)).text
        assert "harness_memory_episodes_recorded_total{" in text  # counters were touched
        assert "harness_memory_provider_duration_seconds_count{" in text
        assert "_created" not in text


def _env(tmp_path: Path, config: Path) -> dict[str, str]:
    return {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def _start(env: dict[str, str], state: Path) -> subprocess.Popen[str]:
    """`memactors serve` as a process under umask 022; returns once daemon.json names it."""
    proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.umask(0o022))
    deadline = time.monotonic() + 300  # a hang guard: a loaded machine takes a minute to start a daemon
    while time.monotonic() < deadline:
        found = read_daemon_file(state)
        if found and found.get("pid") == proc.pid:
            return proc
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "daemon exited")
        subprocess.run(["sleep", "0.05"], check=True)
    proc.kill()
    raise AssertionError("daemon did not start")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def _rpc(state: Path, method: str, params: dict[str, Any], tier: str = "control") -> Any:
    async def go() -> Any:
        url = read_daemon_file(state)["operator"]  # type: ignore[index]
        async with connect_rpc(url, read_token(state, tier)) as rpc:  # type: ignore[arg-type]
            return await rpc.call(f"{SERVICE}/{method}", params)

    return trio.run(go)


@pytest.mark.req10
@pytest.mark.slow
def test_the_state_directory_is_0700_and_every_file_in_it_0600_under_umask_022(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env, state = _env(tmp_path, config), tmp_path / "state"
    proc = _start(env, state)
    try:
        _rpc(state, "IngestRun", {"record": example("run-42-api-fixer.json")})
        files = sorted(p for p in state.iterdir())
        names = {p.name for p in files}
        assert {"memactors.db", "memactors.db-wal", "memactors.db-shm", "daemon.json", "daemon.lock"} <= names
        assert {"operator-read.token", "operator-control.token"} <= names
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
        assert set(modes.values()) == {"0o600"}, modes
    finally:
        _stop(proc)


@pytest.mark.req10
@pytest.mark.slow
def test_forget_leaves_no_recoverable_copy_of_the_run_text_in_the_state_directory(tmp_path: Path) -> None:
    """After a forget through the real daemon, the forgotten run's unique string is nowhere in the raw
    bytes of the state directory: not in the database (secure_delete zeroes freed cells and pages, FTS5
    secure-delete drops its terms), not in the WAL (checkpointed and truncated), not in the run record."""
    marker = "zebracornquux7f3a91"
    config = write_config(tmp_path)
    env, state = _env(tmp_path, config), tmp_path / "state"
    proc = _start(env, state)

    def found() -> list[str]:
        return [p.name for p in state.iterdir() if p.is_file() and marker.encode() in p.read_bytes()]

    try:
        record = example("run-42-api-fixer.json")
        record["result_text"] = f"fixed the {marker} ledger rounding; see {marker}"
        kept = example("run-7-billing-bot.json")
        eid = _rpc(state, "IngestRun", {"record": record})["episode_id"]
        _rpc(state, "IngestRun", {"record": kept})
        hit = _rpc(state, "Recall", {"query": marker, "repo": "forge.example/acme/api"}, tier="read")
        assert [e["episode_id"] for e in hit["episodes"]] == [eid]
        assert found()  # the text is on disk before the forget
        out = _rpc(state, "Forget", {"episode_id": eid})
        assert out["body_deleted"]
        assert found() == []
        assert _rpc(state, "GetEpisode", {"episode_id": eid}, tier="read")["forgotten_at"]
    finally:
        _stop(proc)
    assert found() == []


@pytest.mark.slow
def test_a_second_daemon_on_the_same_state_directory_fails_at_once_naming_it_and_the_holder(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env, state = _env(tmp_path, config), tmp_path / "state"
    first = _start(env, state)
    try:
        second = subprocess.run([sys.executable, "-m", "memactors.cli", "serve"], env=env, capture_output=True,
                                text=True, timeout=60, check=False)
        assert second.returncode != 0
        assert str(state) in second.stderr and f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        # The first keeps its daemon.json, so the CLI still reaches it.
        assert read_daemon_file(state)["pid"] == first.pid  # type: ignore[index]
        status = _cli(env, "memory", "status", "--json")
        assert status.returncode == 0, status.stderr
    finally:
        _stop(first)


@pytest.mark.req1
@pytest.mark.slow
def test_read_commands_reach_the_daemon_with_an_invalid_config_file_and_warn(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env, state = _env(tmp_path, config), tmp_path / "state"
    proc = _start(env, state)
    try:
        with config.open("a", encoding="utf-8") as f:
            f.write('[memory.episodes]\nretention = "forever"\n')
        status = _cli(env, "memory", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["provider"] == "builtin"
        assert "warning" in status.stderr and "retention" in status.stderr
        doctor = _cli(env, "doctor")
        assert "memory provider" in doctor.stdout and "retention" in doctor.stderr
        forget = _cli(env, "memory", "forget", "ep_00000000000000000000", "--yes")  # control: still refused
        assert forget.returncode == 5 and "retention" in forget.stderr
    finally:
        _stop(proc)


async def test_no_repository_is_raised_with_its_rpc_code_for_a_harness_without_one(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path, '[harness.loose]\nharness = "claude-code"\n') as (_, listening):
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "read")) as rpc:
            with pytest.raises(RpcError) as refused:
                await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "as": "loose"})
        assert refused.value.code == "FAILED_PRECONDITION"
        assert "harness loose has no repository" in refused.value.message


@pytest.mark.req6
async def test_control_characters_follow_the_per_field_rule_in_a_stored_episode(tmp_path: Path) -> None:
    """No field keeps a TAB, LF or CR: each run of them is one space (the result text too);
    the rendered text keeps every field on its own line. A line break in an identity field (repo,
    branch, harness, paths) is refused at the boundary instead (it could escape a fence)."""
    from memactors.episode import FIELD_ORDER

    record = example("run-42-api-fixer.json")
    record["result_text"] = "line one\r\n\tindented\x07 bell\x1b[31m\nline three"
    record["trace_id"] = "t\t1\n2"
    broken = json.loads(json.dumps(record))
    broken["sessions"][0]["git_branch"] = "fix/\tflaky\r\nbranch"
    async with daemon_in_process(tmp_path) as (_, listening):
        control = read_token(tmp_path / "state", "control")
        async with connect_rpc(listening.operator, control) as rpc:
            with pytest.raises(RpcError) as refused:
                await rpc.call(f"{SERVICE}/IngestRun", {"record": broken})
            assert refused.value.code == "INVALID_ARGUMENT" and "sessions[0].git_branch" in refused.value.message
            eid = (await rpc.call(f"{SERVICE}/IngestRun", {"record": record}))["episode_id"]
            view = await rpc.call(f"{SERVICE}/GetEpisode", {"episode_id": eid})
    episode = view["episode"]
    # Every run of line breaks and tabs is one space, in every field (words never fuse).
    assert episode["branch"] == "fix/flaky" and episode["trace_id"] == "t 1 2"
    assert episode["result_excerpt"] == "line one indented bell line three"  # the escape sequence whole
    for name, value in episode.items():
        if isinstance(value, str):
            assert not set(value) & set("\t\n\r\x07\x1b"), name
    assert [line.split(": ", 1)[0] for line in view["text"].splitlines()] == list(FIELD_ORDER)
