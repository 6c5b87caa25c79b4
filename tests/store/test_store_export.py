"""`memactors store export` / `store import`: a store's memory (a real repository's history
imported into a real daemon, a fact, a forgotten episode) exported as versioned JSON lines while that
daemon serves, imported into an empty store of each engine, and a daemon on it answers the same
recalls; the forgotten episode never comes back; importing twice adds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fix_daemon import Daemon, daemon_process
from support import write_config
from support_runs import HISTORY, KEY, make_history

pytestmark = [pytest.mark.slow, pytest.mark.both_engines]

QUERIES = ("ledger rounding quantize", "invoice exports CSV", "webhook retry clock", "notifier")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False, timeout=300)


def ok_json(env: dict[str, str], *args: str) -> dict:
    done = cli(env, *args, "--json")
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def recalls(daemon: Daemon) -> dict[str, list[tuple[str, str]]]:
    return {q: [(e["episode_id"], e["text"]) for e in ok_json(daemon.env, "memory", "recall", q, "--repo", KEY)["episodes"]]
            for q in QUERIES}


def recorded(daemon: Daemon, live: int) -> None:
    """Poll until the daemon has recorded every imported episode to its provider (a hang guard bounds it)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = ok_json(daemon.env, "memory", "status")
        if status["pending"]["records"] == 0 and status["counts"]["indexed_ids"] >= live:
            return
        time.sleep(0.2)
    raise AssertionError(f"episodes not recorded: {status}")


@pytest.mark.req9
@pytest.mark.req10
def test_export_import_into_an_empty_store_answers_the_same_recalls(tmp_path: Path, engine: str,
                                                                           store_url: str | None) -> None:
    repo = make_history(tmp_path / "api")
    source_dir, target_dir = tmp_path / "source", tmp_path / "target"
    source_dir.mkdir()
    target_dir.mkdir()
    export = tmp_path / "memory.jsonl"
    with daemon_process(source_dir, config=write_config(source_dir)) as daemon:
        imported = ok_json(daemon.env, "import", "git", "--repo", str(repo))
        assert imported["episodes"] == len(HISTORY) + 1
        ok_json(daemon.env, "facts", "add", "Ledger amounts round half up with Decimal.", "--scope", f"project:{KEY}",
                "--confidence", "0.9")
        before = recalls(daemon)
        [(forgotten, _)] = [hit for hit in before["notifier"] if "notifier" in hit[1]]
        ok_json(daemon.env, "memory", "forget", forgotten, "--yes")
        before = recalls(daemon)
        facts_before = ok_json(daemon.env, "memory", "recall", "Decimal half up", "--repo", KEY)["facts"]
        done = cli(daemon.env, "store", "export")  # while the daemon serves, to stdout
        assert done.returncode == 0, done.stderr
        export.write_text(done.stdout, encoding="utf-8")
    lines = [json.loads(line) for line in export.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["format"] == "memactors-export" and lines[0]["version"] == 1
    assert lines[-1]["type"] == "end" and lines[-1]["counts"]["tombstone"] == 1 and lines[-1]["counts"]["fact"] == 1
    [tomb] = [x for x in lines if x["type"] == "episode" and x["row"]["forgotten_at"]]
    assert tomb["row"]["episode_id"] == forgotten and tomb["text"] is None  # a tombstone carries no text

    config = write_config(target_dir, store_url=store_url)
    env = {**daemon.env, "HARNESS_CONFIG": str(config), "HOME": str(target_dir)}
    first = ok_json(env, "store", "import", str(export))
    assert first["added"]["episode"] == len(HISTORY) and first["added"]["tombstone"] == 1
    assert first["queued_for_provider"] == len(HISTORY) and first["added"]["fact"] == 1
    again = ok_json(env, "store", "import", str(export))
    assert again["added"] == {} and again["present"]["episode"] == len(HISTORY)  # twice adds nothing
    with daemon_process(target_dir, config=config) as target:
        recorded(target, len(HISTORY))
        after = recalls(target)
        facts_after = ok_json(target.env, "memory", "recall", "Decimal half up", "--repo", KEY)["facts"]
        assert after == before
        assert all(forgotten not in [i for i, _ in hits] for hits in after.values())
        assert [f["text"] for f in facts_after] == [f["text"] for f in facts_before]
        # the forgotten commit's run is known: importing the history again brings nothing back
        reimport = ok_json(target.env, "import", "git", "--repo", str(repo))
        assert reimport["outcomes"]["duplicate"] == len(HISTORY) + 1 and reimport["outcomes"]["recorded"] == 0
        assert ok_json(target.env, "memory", "episodes", "--repo", KEY)["total"] == len(HISTORY)
        assert recalls(target) == before


def test_import_refuses_another_version_and_a_cut_file(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env = {"HARNESS_CONFIG": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    future = tmp_path / "future.jsonl"
    future.write_text('{"format": "memactors-export", "version": 99}\n', encoding="utf-8")
    done = cli(env, "store", "import", str(future))
    assert done.returncode == 5 and "version 99" in done.stderr and "Traceback" not in done.stderr
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"format": "memactors-export", "version": 1}\n{"type": "fact", "row": {"id": "f1", "scope": '
                   '"project:forge.example/acme/api", "text": "x", "confidence": 0.5, "status": "live", '
                   '"created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z"}}\n',
                   encoding="utf-8")
    done = cli(env, "store", "import", str(cut))
    assert done.returncode == 5 and "cut short" in done.stderr
