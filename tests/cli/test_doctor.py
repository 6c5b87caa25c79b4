"""Doctor rows (REQ-19) and the privacy note (REQ-18), computed from config and status data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memactors.config import load_config
from memactors.doctor import doctor_rows, format_rows


def _status(**overrides: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "provider": "builtin", "transport": "in-process", "state": "ready", "contract": 1, "breaker": "closed",
        "last_error": None, "state_for_seconds": 10.0,
        "pending": {"records": 0, "forgets": 0, "record_failed": 0, "forget_failed": 0},
    }
    status.update(overrides)
    return status


def _rows(config: Any, status: dict[str, Any], **kw: Any) -> dict[str, Any]:
    args = {"oldest_pending_seconds": {}, "degraded_recalls_24h": 0, "episodes_missing_vectors": 0} | kw
    return {r.name: r for r in doctor_rows(config, status, **args)}


def _config(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "harness.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={"HOME": str(tmp_path)})


def test_builtin_provider_is_healthy_and_stays_on_host(tmp_path: Path) -> None:
    rows = _rows(_config(tmp_path, ""), _status())
    assert rows["memory provider"].status == "pass"
    assert "contract 1" in rows["memory provider"].message
    assert "stay on this host" in rows["memory privacy"].message
    assert all(r.status not in ("warn", "fail") for r in rows.values())


def test_an_actor_out_of_a_resource_warns_then_fails_at_the_alarm(tmp_path: Path) -> None:
    """Resource exhaustion, surfaced: a spell under the alarm warns, one past it fails, and
    the row says what ran out and when the daemon gives up."""
    config = _config(tmp_path, "")
    spells = {"index": {"seconds": 42.0, "attempts": 3, "error": "OSError EMFILE"},
              "retention": {"seconds": 400.0, "attempts": 9, "error": "OSError ENOSPC"}}
    rows = _rows(config, _status(), exhausted=spells, exhaustion_alarm=300.0, exhaustion_limit=1800.0)
    assert rows["memory actor index"].status == "warn"
    assert "EMFILE" in rows["memory actor index"].message and "3 restarts in 42 s" in rows["memory actor index"].message
    assert rows["memory actor retention"].status == "fail"
    assert "gives up (exit 75) after 30 minutes" in rows["memory actor retention"].message
    assert not any(name.startswith("memory actor") for name in _rows(config, _status()))


@pytest.mark.req18
def test_req18_a_network_provider_is_visible(tmp_path: Path) -> None:
    config = _config(tmp_path, '[memory]\nprovider = "zep"\n[mcp.zep]\nurl = "https://zep.example.net/mcp"\n')
    note = _rows(config, _status(provider="zep", transport="http"))["memory privacy"]
    assert note.status == "note"
    assert "zep.example.net" in note.message and "episodes leave this host" in note.message


@pytest.mark.req18
def test_req18_a_stdio_provider_is_described_as_opaque(tmp_path: Path) -> None:
    config = _config(tmp_path, '[memory]\nprovider = "mem"\n[mcp.mem]\ncommand = "mem-server"\n')
    note = _rows(config, _status(provider="mem", transport="stdio"))["memory privacy"]
    assert "cannot see whether that process calls a network service" in note.message


@pytest.mark.req19
def test_req19_a_down_provider_fails_doctor_not_harnesses(tmp_path: Path) -> None:
    config = _config(tmp_path, "")
    rows = _rows(config, _status(state="down", state_for_seconds=600.0, last_error="connection refused"))
    assert rows["memory provider reachability"].status == "fail"
    assert "builtin" in rows["memory provider reachability"].message
    assert "10 minutes" in rows["memory provider reachability"].message
    brief = _rows(config, _status(state="down", state_for_seconds=60.0))
    assert "memory provider reachability" not in brief  # not yet five minutes


def test_incompatible_provider_fails(tmp_path: Path) -> None:
    rows = _rows(_config(tmp_path, ""), _status(state="incompatible", last_error="contract 2"))
    assert rows["memory provider compatibility"].status == "fail"


def test_warnings_for_failed_and_old_pending_work_and_degraded_recalls(tmp_path: Path) -> None:
    config = _config(tmp_path, '[model_api]\nbase_url = "http://127.0.0.1:9"\nembedding_model = "e"\n'
                               '[harness.nightly]\nharness = "claude-code"\nprompt = "triage"\nmemory_briefing = true\n')
    status = _status(pending={"records": 2, "forgets": 1, "record_failed": 1, "forget_failed": 0})
    rows = _rows(config, status, oldest_pending_seconds={"record": 7200.0, "forget": 60.0},
                 degraded_recalls_24h=3, episodes_missing_vectors=4)
    assert rows["memory records failed"].status == "warn"
    assert rows["memory records pending"].status == "warn"
    assert "memory forgets pending" not in rows
    assert "3 recalls" in rows["memory recall degraded"].message
    assert "4 built-in episodes" in rows["memory embeddings"].message
    assert rows["memory briefing prepend"].message.endswith("nightly")
    text = format_rows(list(rows.values()))
    assert "WARN" in text and "NOTE" in text


async def test_doctor_over_the_daemon_and_without_it(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    import trio

    from memactors.daemon import run_daemon
    from memactors.rpc.tokens import ensure_tokens
    from support import write_config

    path = write_config(tmp_path)
    env = {"HARNESS_CONFIG": str(path), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def doctor() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memactors.cli", "doctor", "--json"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(lambda: load_config(path), task_status=task_status))
        done = await trio.to_thread.run_sync(doctor)
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr
    names = {r["name"] for r in json.loads(done.stdout)["rows"]}
    assert {"memory provider", "memory privacy", "memory briefing prepend"} <= names
    ensure_tokens(tmp_path / "state")
    assert not (tmp_path / "state" / "daemon.json").exists()  # removed at shutdown
    down = await trio.to_thread.run_sync(doctor)
    assert down.returncode == 1
    assert json.loads(down.stdout)["rows"][0]["name"] == "daemon"


@pytest.mark.req19
async def test_doctor_warns_for_builtin_episodes_missing_vectors(make_holder) -> None:  # type: ignore[no-untyped-def]
    """An embedding model is set but /v1/embeddings fails: the episode is recorded without a vector
    and doctor warns (REQ-19), while recall still works from FTS5."""
    from memactors.service import open_memory_service
    from memactors.testing.fake_model_api import FakeBehaviour, run_fake_model_api
    from support import example, wait_ready

    async with run_fake_model_api(behaviour=FakeBehaviour(embed_status=503)) as api:
        extra = f'[model_api]\nbase_url = "{api.base_url}"\nembedding_model = "e"\n[memory.episodes]\nsummary = false\n'
        async with open_memory_service(make_holder(extra)) as memory:
            await wait_ready(memory)
            await memory.ingest_run(example("run-42-api-fixer.json"))
            rows = {r["name"]: r for r in (await memory.doctor())["rows"]}
    assert rows["memory embeddings"]["status"] == "warn"
    assert rows["memory embeddings"]["message"].startswith("1 built-in episodes")
