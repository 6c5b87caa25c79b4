"""The daemon end to end: operator RPC with tokens and tiers, /metrics, the CLI, signals, restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
import trio

from fix_daemon import daemon_in_process
from memactors.config import load_config
from memactors.daemon import run_daemon
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.rpc.tokens import read_token
from support import EXAMPLES, acknowledged, example, run_record, write_config

SERVICE = "harness.v1.MemoryService"
REQ21_FAMILIES = [
    "harness_memory_episodes_recorded_total",
    "harness_memory_episode_summaries_total",
    "harness_memory_provider_up",
    "harness_memory_provider_duration_seconds",
    "harness_memory_recalls_total",
    "harness_memory_results_dropped_total",
    "harness_memory_briefings_total",
    "harness_memory_briefing_bytes",
    "harness_memory_pending",
]


async def test_daemon_serves_the_thin_path_over_rpc_with_tiers(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening):
        state = tmp_path / "state"
        control, read = read_token(state, "control"), read_token(state, "read")
        async with connect_rpc(listening.operator, control) as rpc:
            result = await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})
            assert acknowledged(result["outcome"]) == "recorded"
            with trio.fail_after(60):  # a queued record (a loaded machine) is retried soon: wait for it
                while (await rpc.call(f"{SERVICE}/Status", {}))["pending"]["records"]:  # noqa: ASYNC110 -- polls the daemon's own state
                    await trio.sleep(0.05)
        async with connect_rpc(listening.operator, read) as rpc:
            hit = await rpc.call(f"{SERVICE}/Recall", {"query": "flaky ledger", "repo": "forge.example/acme/api"})
            assert [i["episode_id"] for i in hit["episodes"]] == [result["episode_id"]]
            miss = await rpc.call(f"{SERVICE}/Recall", {"query": "flaky ledger", "repo": "forge.example/acme/billing"})
            assert miss["episodes"] == []
            with pytest.raises(RpcError) as denied:
                await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-7-billing-bot.json")})
            assert denied.value.code == "PERMISSION_DENIED"
        with pytest.raises(RpcError) as refused:
            async with connect_rpc(listening.operator, "not-a-token") as rpc:
                await rpc.call(f"{SERVICE}/Status", {})
        assert refused.value.code == "UNAUTHENTICATED"
        async with connect_rpc(listening.operator, control) as rpc:
            assert (await rpc.call(f"{SERVICE}/ListEpisodes", {}))["episodes"][0]["run_id"] == "42"


@pytest.mark.req21
async def test_metrics_endpoint_shows_every_req21_family(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening):
        async with httpx2.AsyncClient() as http:
            text = (await http.get(listening.metrics)).text
        for family in REQ21_FAMILIES:
            assert f"# TYPE {family.removesuffix('_total')}" in text, family


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def _wait_no_pending_records(env: dict[str, str]) -> None:
    """A record queued because the provider was slower than provider_timeout (a loaded machine) is
    retried within seconds; wait for that state before recalling it."""
    for _ in range(600):  # a hang guard of 60 s
        status = json.loads(_cli(env, "memory", "status", "--json").stdout)
        if status["pending"]["records"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError("records still pending after 60 s")


def _start(env: dict[str, str], state: Path) -> subprocess.Popen[str]:
    (state / "daemon.json").unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a hang guard: a loaded machine takes a minute to start a daemon
    while time.monotonic() < deadline:
        if (state / "daemon.json").exists():
            return proc
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(err or "daemon exited")
        subprocess.run(["sleep", "0.05"], check=True)
    proc.kill()
    proc.communicate()  # closes the pipes, so a failed start does not leak them into the next test
    raise AssertionError("daemon did not start")


def _stop(proc: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)  # a hang guard: what is tested is a clean exit, not how soon
    return proc.returncode, err


@pytest.mark.slow
def test_cli_walkthrough_signals_and_restart(tmp_path: Path) -> None:
    """The README walk-through as a user types it; the daemon stops cleanly on SIGTERM (first run) and
    SIGINT (second run) and keeps its episodes. One test for both signals: each daemon start is seconds
    of the suite. The default configuration, the embedded model's hybrid ranking included, as the README
    runs it: step 4's "nothing" holds with cosine similarity in the ranking (the relevance floor)."""
    config = write_config(tmp_path, embeddings=True)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    state = tmp_path / "state"
    proc = _start(env, state)
    try:
        files = sorted(str(p) for p in EXAMPLES.glob("*.json"))
        ingest = _cli(env, "runs", "ingest", "--wait-vectors", *files)
        assert ingest.returncode == 0, ingest.stderr
        assert acknowledged(ingest.stdout.strip()) == (
            f"{len(files)} record(s): {len(files)} recorded, 0 duplicate, 0 skipped, 0 rejected")
        _wait_no_pending_records(env)
        embeddings = json.loads(_cli(env, "memory", "status", "--json").stdout)["embeddings"]
        assert embeddings["source"] == "embedded" and embeddings["pending"] == 0, embeddings
        hit = _cli(env, "memory", "recall", "flaky ledger", "--repo", "forge.example/acme/api", "--json")
        assert hit.returncode == 0, hit.stderr
        assert "api-fixer" in {i["harness"] for i in json.loads(hit.stdout)["episodes"]}
        miss = _cli(env, "memory", "recall", "flaky ledger", "--repo", "forge.example/acme/billing", "--json")
        assert json.loads(miss.stdout)["episodes"] == []  # billing's one episode is not about it: nothing
    finally:
        code, err = _stop(proc, signal.SIGTERM)
    assert code == 0, err
    assert "Traceback" not in err
    proc = _start(env, state)
    try:
        listed = _cli(env, "memory", "episodes", "--json")
        assert len(json.loads(listed.stdout)["episodes"]) == 3
        status = _cli(env, "memory", "status", "--json")
        assert json.loads(status.stdout)["counts"]["live_episodes"] == 3
    finally:
        code, err = _stop(proc, signal.SIGINT)
    assert code == 0 and "Traceback" not in err


async def test_a_port_in_use_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    from memactors.errors import ConfigError

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = write_config(tmp_path / "one")
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(lambda task_status: run_daemon(lambda: load_config(first), task_status=task_status))
        port = listening.operator.rsplit(":", 1)[1].split("/")[0]
        second = write_config(tmp_path / "two")
        second.write_text(second.read_text().replace('[operator]\nlisten = "127.0.0.1:0"',
                                                     f'[operator]\nlisten = "127.0.0.1:{port}"'))
        with pytest.raises(ConfigError, match=rf"\[operator\] listen = \"127.0.0.1:{port}\": cannot listen"):
            await run_daemon(lambda: load_config(second))
        nursery.cancel_scope.cancel()


async def test_ingest_runs_batch_answers_each_record_in_order_and_rejects_bad_ones_by_name(tmp_path: Path) -> None:
    """IngestRuns: one call, a result per record in order; a bad record is rejected and the rest go on."""
    bad = run_record(run_id="2", started_at="yesterday")
    async with daemon_in_process(tmp_path) as (_, listening):
        control = read_token(tmp_path / "state", "control")
        async with connect_rpc(listening.operator, control) as rpc:
            out = await rpc.call(f"{SERVICE}/IngestRuns", {"records": [
                {"record": run_record(run_id="1"), "source": "one.json"},
                {"record": bad, "source": "two.json"},
                {"record": run_record(run_id="3", result_text="flaky ledger retry"), "source": "three.json"},
                {"record": run_record(run_id="1"), "source": "again.json"},
                {"source": "four.json"},
            ]})
            results = out["results"]
            assert acknowledged([r["outcome"] for r in results]) == [
                "recorded", "rejected", "recorded", "duplicate", "rejected"]
            assert results[1]["source"] == "two.json"
            assert results[1]["error"]["code"] == "INVALID_ARGUMENT"
            assert "started_at" in results[1]["error"]["message"]
            assert results[4]["error"]["code"] == "INVALID_ARGUMENT"
            assert results[3]["episode_id"] == results[0]["episode_id"]
            listed = await rpc.call(f"{SERVICE}/ListEpisodes", {})
            assert sorted(e["run_id"] for e in listed["episodes"]) == ["1", "3"]
            with pytest.raises(RpcError) as too_many:
                await rpc.call(f"{SERVICE}/IngestRuns", {"records": [{"record": run_record()}] * 501})
            assert too_many.value.code == "INVALID_ARGUMENT"
            assert "500" in str(too_many.value)


@pytest.mark.slow
async def test_a_maximum_size_record_is_accepted_and_a_bigger_one_refused_while_other_callers_get_answers(
        tmp_path: Path) -> None:
    """A record at the 1 MiB bound is ingested, one over it is refused naming its size and the
    limit; meanwhile another caller's requests keep being answered (timings belong to bench/)."""
    from memactors._limits import MAX_RECORD_BYTES, record_size

    path = write_config(tmp_path)
    words = " ".join(f"ledger{n % 97} rounding fix" for n in range(60000))
    big = run_record(run_id="big", result_text=words[: MAX_RECORD_BYTES - 2000])
    assert MAX_RECORD_BYTES - 4000 < record_size(big) <= MAX_RECORD_BYTES
    over = run_record(run_id="over", result_text=words[: MAX_RECORD_BYTES + 10])
    answered = 0  # Status answers received while the big record was in flight
    in_flight = False
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(lambda task_status: run_daemon(lambda: load_config(path), task_status=task_status))
        control = read_token(tmp_path / "state", "control")

        async def canary() -> None:
            nonlocal answered
            async with connect_rpc(listening.operator, control) as rpc:
                while not done.is_set():
                    await rpc.call(f"{SERVICE}/Status", {})
                    answered += in_flight

        nursery.start_soon(canary)
        async with connect_rpc(listening.operator, control) as rpc:
            in_flight = True
            accepted = await rpc.call(f"{SERVICE}/IngestRun", {"record": big, "source": "big.json"})
            in_flight = False
            with pytest.raises(RpcError) as refused:
                await rpc.call(f"{SERVICE}/IngestRun", {"record": over, "source": "over.json"})
            batch = await rpc.call(f"{SERVICE}/IngestRuns", {"records": [
                {"record": over, "source": "over.json"}, {"record": run_record(run_id="small"), "source": "s.json"}]})
        done.set()
        assert acknowledged(accepted["outcome"]) == "recorded"
        assert refused.value.code == "INVALID_ARGUMENT"
        size = record_size(over)
        assert f"{size} bytes" in str(refused.value) and f"{MAX_RECORD_BYTES} bytes" in str(refused.value)
        assert "over.json" in str(refused.value)
        assert acknowledged([r["outcome"] for r in batch["results"]]) == ["rejected", "recorded"]
        assert f"{size} bytes" in batch["results"][0]["error"]["message"]
        assert answered >= 1
        nursery.cancel_scope.cancel()
