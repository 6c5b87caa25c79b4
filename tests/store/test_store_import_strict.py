"""`memactors store import` reads a row as strictly as the store will read it, redacts what it stores and
derives scope from the episode's repository; a bad row is refused by its line number and reason while
the good rows go in; and a pending record whose stored episode cannot be read (a damaged row, or one an
older import let in) is quarantined and reported, never retried into a daemon that cannot start.

Through the surfaces a user touches: the CLI as a subprocess, the daemon as a process, the gateway."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fix_daemon import Daemon, daemon_process, start_daemon
from support import run_record, write_config

REPO = "forge.example/acme/api"
OTHER = "forge.example/acme/other"


def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          input=stdin, check=False, timeout=300)


def ok_json(env: dict[str, str], *args: str) -> Any:
    done = cli(env, *args, "--json")
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def wait_for(daemon: Daemon, what: str, check: Any) -> Any:
    """Poll `memory status --json` until `check(status)` holds (a hang guard bounds it, not a timing)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = ok_json(daemon.env, "memory", "status")
        if check(status):
            return status
        assert daemon.proc.poll() is None, f"daemon exited {daemon.proc.returncode}:\n{daemon.log_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"{what}: {status}")


def exported(tmp_path: Path, *records: dict[str, Any]) -> tuple[list[dict[str, Any]], Path, dict[str, str]]:
    """A real daemon's `store export` after `runs ingest` of `records`: (its lines parsed, config, env)."""
    state = tmp_path / "source"
    state.mkdir()
    config = write_config(state)
    with daemon_process(state, config=config) as daemon:
        for n, record in enumerate(records):
            path = state / f"run{n}.json"
            path.write_text(json.dumps(record), encoding="utf-8")
            ok_json(daemon.env, "runs", "ingest", str(path))
        done = cli(daemon.env, "store", "export")
        assert done.returncode == 0, done.stderr
        env = daemon.env
    return [json.loads(line) for line in done.stdout.splitlines()], config, env


def target(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """An empty state directory to import into: (its directory, config, env)."""
    where = tmp_path / "target"
    where.mkdir()
    config = write_config(where)
    import os

    return where, config, {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(where)}


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["not an episode", "past the size bound"])
def test_an_unreadable_pending_record_is_quarantined_and_the_daemon_serves(tmp_path: Path, damage: str) -> None:
    """A stored body that is not an episode, or one of 5 MB (more than an RPC frame holds; written before
    import checked bodies, or damaged), with a pending record: the daemon starts and serves, the record
    is set aside and counted, doctor warns, the log names the episode, `memory episodes` (the list and
    the one episode) still answers, and `memory forget` clears it."""
    import sqlean

    config = write_config(tmp_path)
    with daemon_process(tmp_path, config=config) as daemon:
        path = tmp_path / "run.json"
        path.write_text(json.dumps(run_record()), encoding="utf-8")
        [done] = ok_json(daemon.env, "runs", "ingest", str(path))
    episode_id = done["episode_id"]
    db = sqlean.connect(str(tmp_path / "state" / "memactors.db"), isolation_level=None)
    body = json.loads(db.execute("SELECT body FROM episode_bodies").fetchone()[0])
    body["result_excerpt"] = "ledger " * (5 * 1024 * 1024 // 7)
    db.execute("UPDATE episode_bodies SET body = ?", ["hello" if damage == "not an episode" else json.dumps(body)])
    db.execute("INSERT INTO pending (kind, provider, episode_id, provider_id, first_at, next_at) VALUES"
               " ('record', 'builtin', ?, '', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')",
               [episode_id])
    db.close()
    with daemon_process(tmp_path, config=config) as daemon:
        status = wait_for(daemon, "the record quarantined", lambda s: s["pending"]["record_quarantined"] == 1)
        assert status["pending"]["records"] == 0 and status["pending"]["record_failed"] == 0
        text = cli(daemon.env, "memory", "status")
        assert text.returncode == 0 and "quarantined: 1 records" in text.stdout
        doctor = cli(daemon.env, "doctor")
        assert "memory records quarantined" in doctor.stdout and "Traceback" not in doctor.stderr
        assert "pending record quarantined" in daemon.log_text() and episode_id in daemon.log_text()
        listed = ok_json(daemon.env, "memory", "episodes", "--repo", REPO)
        assert [e["episode_id"] for e in listed["episodes"]] == [episode_id]
        one = cli(daemon.env, "memory", "episodes", episode_id, "--json")
        assert one.returncode == 0 and len(one.stdout) < 100_000, one.stderr
        ok_json(daemon.env, "memory", "forget", episode_id, "--yes")
        wait_for(daemon, "the quarantined record gone with its episode",
                 lambda s: s["pending"]["record_quarantined"] == 0)
        assert daemon.proc.poll() is None


@pytest.mark.slow
def test_a_bad_episode_body_in_an_import_is_refused_by_line_and_the_daemon_starts(tmp_path: Path) -> None:
    """The audit's reproduction: an export line's episode text set to "hello" (new ids) is refused with
    its line number; the good rows beside it are imported; the daemon on the result starts and serves."""
    lines, _, _ = exported(tmp_path, run_record(), run_record(run_id="2", started_at="2026-11-28T10:00:00Z",
                                                              ended_at="2026-11-28T10:05:00Z"))
    where, config, env = target(tmp_path)
    episodes = [n for n, x in enumerate(lines) if x["type"] == "episode"]
    bad_line = episodes[0] + 1  # the file's line number (1-based)
    bad = json.loads(json.dumps(lines[episodes[0]]))
    bad["text"] = "hello"
    lines[episodes[0]] = bad
    path = write_lines(tmp_path / "bad.jsonl", lines)
    done = cli(env, "store", "import", str(path), "--json")
    assert done.returncode == 1, done.stderr  # it ran and reports a failure: a line was refused
    summary = json.loads(done.stdout)
    assert summary["refused"] == [{"line": bad_line, "type": "episode",
                                   "reason": summary["refused"][0]["reason"]}]
    assert "episode" in summary["refused"][0]["reason"]
    assert summary["added"]["episode"] == 1 and summary["queued_for_provider"] == 1
    assert f"line {bad_line}" in done.stderr and "Traceback" not in done.stderr
    with daemon_process(where, config=config) as daemon:
        wait_for(daemon, "the good episode recorded", lambda s: s["pending"]["records"] == 0
                 and s["counts"]["indexed_ids"] >= 1)
        assert daemon.proc.poll() is None
        assert ok_json(daemon.env, "memory", "episodes", "--repo", REPO)["total"] == 1


def _episode_line(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return json.loads(json.dumps(next(x for x in lines if x["type"] == "episode" and x["text"])))


def _crafted(template: dict[str, Any], n: int, **body: Any) -> dict[str, Any]:
    """The template's episode line with a new id (ep_ + n) and these body fields replaced."""
    line = json.loads(json.dumps(template))
    episode_id = f"ep_{n:020x}"
    episode = {**json.loads(line["text"]), "episode_id": episode_id, "run_id": f"crafted-{n}", **body}
    line["row"].update(episode_id=episode_id, run_id=f"crafted-{n}")
    line["text"] = json.dumps(episode)
    return line


@pytest.mark.slow
def test_malformed_rows_are_refused_by_line_and_reason_and_the_good_rows_kept(tmp_path: Path) -> None:
    """The audit's malformed rows — an episode text "hello", {}, [] or with wrong types, a non-string id,
    an object text, a fact confidence "x", 10^400 and NaN, a 100,000-deep line, an oversized episode and
    an oversized line — each refused by its line number without a traceback; every good row is in, and
    the daemon on the result starts, lists and records what went in."""
    from memactors._limits import MAX_EPISODE_BODY_BYTES, MAX_IMPORT_LINE_BYTES

    lines, _, _ = exported(tmp_path, run_record())
    template = _episode_line(lines)
    fact = {"type": "fact", "row": {"id": "f_good", "scope": f"project:{REPO}", "text": "Ledger rounds half up.",
                                    "confidence": 0.5, "status": "live", "created_at": "2026-01-01T00:00:00Z",
                                    "updated_at": "2026-01-01T00:00:00Z"}}
    bad: list[Any] = [
        {**_crafted(template, 1), "text": "hello"},
        {**_crafted(template, 2), "text": "{}"},
        {**_crafted(template, 3), "text": "[]"},
        _crafted(template, 4, duration_ms="long", files_touched="x"),
        {**_crafted(template, 5), "row": {**template["row"], "episode_id": 12345}},
        {**_crafted(template, 6), "text": {"an": "object"}},
        {"type": "fact", "row": {**fact["row"], "id": "f_x", "confidence": "x"}},
        json.dumps({"type": "fact", "row": {**fact["row"], "id": "f_big"}}).replace('"confidence": 0.5',
                                                                                     '"confidence": 1' + "0" * 400),
        json.dumps({"type": "fact", "row": {**fact["row"], "id": "f_nan", "confidence": float("nan")}}),
        "[" * 100_000 + "]" * 100_000,
        _crafted(template, 7, result_excerpt="x" * (MAX_EPISODE_BODY_BYTES + 1)),
        json.dumps({**_crafted(template, 8), "pad": "y" * (MAX_IMPORT_LINE_BYTES + 10)}),
    ]
    good = [_crafted(template, 100), fact]
    file_lines = [lines[0], good[0], *bad, good[1], lines[-1]]
    path = write_lines(tmp_path / "mixed.jsonl", file_lines)
    where, config, env = target(tmp_path)
    done = cli(env, "store", "import", str(path), "--json")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    refused = {r["line"]: r for r in summary["refused"]}
    assert sorted(refused) == list(range(3, 3 + len(bad))), summary["refused"]
    reasons = [refused[n]["reason"] for n in sorted(refused)]
    assert "not JSON" in reasons[0] and "not a JSON object" in reasons[2]
    assert "confidence" in reasons[6] and "confidence" in reasons[7] and "confidence" in reasons[8]
    assert "nested too deeply" in reasons[9]
    assert f"limit is {MAX_EPISODE_BODY_BYTES}" in reasons[10] and f"limit is {MAX_IMPORT_LINE_BYTES}" in reasons[11]
    assert "episode_id" in reasons[4]
    assert summary["added"] == {"episode": 1, "fact": 1} and summary["queued_for_provider"] == 1
    text = cli(env, "store", "import", str(path))
    assert text.returncode == 1 and "line 3 refused (episode)" in text.stderr and "1 already there" not in text.stdout
    with daemon_process(where, config=config) as daemon:
        wait_for(daemon, "the good episode recorded", lambda s: s["pending"]["records"] == 0
                 and s["counts"]["indexed_ids"] >= 1)
        listed = ok_json(daemon.env, "memory", "episodes", "--repo", REPO)
        assert [e["episode_id"] for e in listed["episodes"]] == [f"ep_{100:020x}"]
        assert daemon.proc.poll() is None


TOKEN = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"


@pytest.mark.slow
async def test_an_imported_episode_is_redacted_and_scoped_by_its_repository_over_the_gateway(tmp_path: Path) -> None:
    """A crafted line: an episode of acme/other given acme/api's scope, a `ghp_` token in its excerpt. It is
    never served to an acme/api run token, and acme/other's run gets it without the token; a run record
    and a fact holding the token (what an older store's redactor missed) are stored without it."""
    import trio

    from memactors.rpc.client import connect_rpc
    from support_readside import gateway_client

    lines, _, _ = await trio.to_thread.run_sync(exported, tmp_path, run_record())
    template = _episode_line(lines)
    crafted = _crafted(template, 9, repo=OTHER, scope=f"project:{REPO}",
                       result_excerpt=f"zanzibar ledger fix, pushed with {TOKEN} to the remote")
    crafted["row"].update(repo=REPO, scope=f"project:{REPO}")  # the row lies too
    # An older store's run record and fact, with what its redactor missed.
    run = json.loads(json.dumps(next(x for x in lines if x["type"] == "run")))
    record = {**json.loads(run["text"]), "run_id": "crafted-run", "result_text": f"pushed with {TOKEN}"}
    run["row"]["run_id"], run["text"] = "crafted-run", json.dumps(record)
    fact = {"type": "fact", "row": {"id": "f_crafted", "scope": f"project:{OTHER}", "text": f"use {TOKEN} to push",
                                    "confidence": 0.5, "status": "live", "created_at": "2026-01-01T00:00:00Z",
                                    "updated_at": "2026-01-01T00:00:00Z"}}
    path = write_lines(tmp_path / "crafted.jsonl", [lines[0], run, crafted, fact, lines[-1]])
    where, config, env = target(tmp_path)
    done = await trio.to_thread.run_sync(lambda: cli(env, "store", "import", str(path), "--json"))
    assert done.returncode == 0, done.stderr
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(where, config=config))
    try:
        await trio.to_thread.run_sync(lambda: wait_for(daemon, "recorded", lambda s: s["pending"]["records"] == 0
                                                       and s["counts"]["indexed_ids"] >= 1))
        tokens = {}
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            for repo in (REPO, OTHER):
                run_id = f"r-{repo.rsplit('/', 1)[1]}"
                await rpc.call("harness.v1.MemoryService/ReportPresence", {
                    "harness": "api-fixer", "run_id": run_id, "session_id": f"s-{run_id}", "repo": repo,
                    "branch": "main"})
                minted = await rpc.call("harness.v1.MemoryService/MintRunToken",
                                        {"harness": "api-fixer", "run_id": run_id})
                tokens[repo] = str(minted["token"])
        answers = {}
        for repo, token in tokens.items():
            async with gateway_client(daemon.info["gateway"], token) as client:
                result = await client.call_tool("recall", {"query": "zanzibar ledger"})
            assert result.is_error is False
            answers[repo] = "".join(getattr(c, "text", "") for c in result.content)
        assert "zanzibar" not in answers[REPO]
        assert "zanzibar" in answers[OTHER] and TOKEN not in answers[OTHER] and TOKEN[4:20] not in answers[OTHER]
        listed = await trio.to_thread.run_sync(lambda: ok_json(daemon.env, "memory", "episodes", "--repo", OTHER))
        assert [e["episode_id"] for e in listed["episodes"]] == [f"ep_{9:020x}"]
        assert TOKEN[4:20] not in json.dumps(listed)
        again = await trio.to_thread.run_sync(lambda: cli(daemon.env, "store", "export"))
        assert again.returncode == 0 and '"f_crafted"' in again.stdout and "crafted-run" in again.stdout
        assert TOKEN[4:20] not in again.stdout  # not in the episode, the run record or the fact
    finally:
        await trio.to_thread.run_sync(daemon.stop)
