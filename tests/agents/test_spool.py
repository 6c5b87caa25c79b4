"""The session spool: a resident's SessionEnd hook that finds no daemon keeps the session in a
0600 file in the state directory, and it is sent when the daemon is next reached — by the daemon at start,
by the next hook, or by `memactors spool send`. The spool itself under concurrent appends and claims."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fix_agents import git_repo, transcript_in
from fix_daemon import daemon_process
from memactors.agents import spool
from support import write_config

HARNESS = '[harness.coder]\nharness = "claude-code"\n'
SESSION = "5a0ddcd0-5487-4794-99ac-143f6bb9e248"


def entry(n: int) -> dict[str, object]:
    return {"record": {"run_id": str(n)}, "source": f"test {n}", "spooled_at": "2026-12-01T00:00:00Z"}


def test_a_claim_takes_everything_and_done_requeues_what_was_not_delivered(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = spool.append(state, entry(1))
    spool.append(state, entry(2))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(state.stat().st_mode) == 0o700
    assert spool.pending(state) == 2
    taken = spool.claim(state)
    assert taken is not None and [e["source"] for e in taken.entries] == ["test 1", "test 2"]
    spool.append(state, entry(3))  # a hook appending while the sender sends: a fresh spool file
    assert spool.claim(state) is not None  # only the new file: the claimed one is locked by its sender
    taken.done(undelivered=[taken.entries[1]], refused=[{**taken.entries[0], "error": {"code": "INVALID_ARGUMENT"}}])
    assert spool.count_lines(spool.rejected_path(state)) == 1
    again = spool.claim(state)
    assert again is not None and {e["source"] for e in again.entries} >= {"test 2"}


def test_a_claimed_file_whose_sender_died_is_adopted_and_torn_lines_are_kept_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    spool.append(state, entry(1))
    taken = spool.claim(state)
    assert taken is not None
    taken.release(delete=False)  # the sender died: its claimed file stays, unlocked
    with spool.spool_path(state).open("a", encoding="utf-8") as f:
        f.write('{"record": {"run_id": "2"}, "source": "test 2"}\n{"record": {"run_i')  # a torn write
    adopted = spool.claim(state)
    assert adopted is not None
    assert sorted(e["source"] for e in adopted.entries) == ["test 1", "test 2"] and adopted.unreadable == 1
    adopted.done(undelivered=[], refused=[])
    assert spool.pending(state) == 0 and spool.claim(state) is None
    assert "run_i" in spool.rejected_path(state).read_text(encoding="utf-8")


@pytest.mark.slow
def test_nothing_is_lost_when_hooks_append_while_senders_claim(tmp_path: Path) -> None:
    """Four processes append 100 entries each while this one claims and completes over and over."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    writer = ("import sys; from pathlib import Path; from memactors.agents import spool\n"
              "for n in range(100):\n"
              "    spool.append(Path(sys.argv[1]), {'record': {'run_id': sys.argv[2] + '-' + str(n)}})\n")
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(state), f"w{i}"]) for i in range(4)]
    seen: list[str] = []

    def drain() -> None:
        taken = spool.claim(state)
        if taken is not None:
            seen.extend(e["record"]["run_id"] for e in taken.entries)
            taken.done(undelivered=[], refused=[])

    while any(p.poll() is None for p in procs):
        drain()
    drain()
    assert all(p.returncode == 0 for p in procs)
    assert sorted(seen) == sorted(f"w{i}-{n}" for i in range(4) for n in range(100))


def hook(env: dict[str, str], transcript: Path, repo: Path, session: str = SESSION) -> subprocess.CompletedProcess[str]:
    payload = {"session_id": session, "transcript_path": str(transcript), "cwd": str(repo),
               "hook_event_name": "SessionEnd", "reason": "prompt_input_exit"}
    return subprocess.run([sys.executable, "-m", "memactors.cli", "hook", "claude-code", "session-end", "--harness",
                           "coder"], env=env, input=json.dumps(payload), capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.slow
@pytest.mark.req15
def test_a_session_ending_while_the_daemon_is_down_is_spooled_and_sent_when_it_starts(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "ledger")
    transcript = transcript_in(repo, tmp_path)
    config = write_config(tmp_path, HARNESS)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    down = hook(env, transcript, repo)
    assert down.returncode == 0, down.stderr
    assert "spooled to" in down.stderr and "memactors spool send" in down.stderr
    state = tmp_path / "state"
    assert stat.S_IMODE((state / "session-spool.jsonl").stat().st_mode) == 0o600
    stored = (state / "session-spool.jsonl").read_text(encoding="utf-8")
    assert "SECRET-PROMPT" not in stored and json.loads(stored)["record"]["run_id"] == SESSION
    listed = subprocess.run([sys.executable, "-m", "memactors.cli", "spool", "--json"], env=env, capture_output=True,
                            text=True, timeout=60, check=True)
    assert json.loads(listed.stdout)["pending"] == 1
    nobody = subprocess.run([sys.executable, "-m", "memactors.cli", "spool", "send"], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert nobody.returncode == 3 and spool.pending(state) == 1  # no daemon: kept
    with daemon_process(tmp_path, HARNESS) as daemon:
        episodes = _wait_for_episodes(daemon, 1)
        assert episodes[0]["run_id"] == SESSION
        assert spool.pending(state) == 0
        # the next session's hook sends what was spooled meanwhile (here: put there by hand)
        spool.append(state, {"record": json.loads(stored)["record"] | {"run_id": "spooled-later"},
                             "source": "test", "spooled_at": "2026-12-01T00:00:00Z"})
        later = tmp_path / "second.jsonl"
        later.write_text(transcript.read_text(encoding="utf-8").replace(SESSION, "second-session"), encoding="utf-8")
        second = hook(daemon.env, later, repo, session="second-session")
        assert second.returncode == 0, second.stderr
        assert "sent spooled session(s): 1 recorded" in second.stderr
        assert {e["run_id"] for e in _wait_for_episodes(daemon, 3)} == {SESSION, "second-session", "spooled-later"}
        log = daemon.log.read_text(encoding="utf-8")
    assert "spooled sessions sent" in log


def _wait_for_episodes(daemon: object, count: int) -> list[dict[str, object]]:
    """The daemon sends the spool in a task of its own once it serves: wait (bounded) for its episodes."""
    import time

    deadline = time.monotonic() + 60
    while True:
        listed = daemon.cli("memory", "episodes", "--harness", "coder", "--json")  # type: ignore[attr-defined]
        episodes = json.loads(listed.stdout)["episodes"] if listed.returncode == 0 else []
        if len(episodes) >= count or time.monotonic() > deadline:
            return episodes  # type: ignore[no-any-return]
        time.sleep(0.1)
