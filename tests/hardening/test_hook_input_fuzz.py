"""Every agent hook (`memactors hook <agent> session-start|session-end`), run as its agent runs it — a
subprocess with the hook input on stdin — given hostile input: deeply nested JSON, lone surrogates, invalid
UTF-8, NULs, endless stdin, and a FIFO, /dev/zero, a directory or a huge file as the transcript path. Each
ends on its own, soon, with exit 0 (nothing to do, or spooled) or 5 (the input named), one line on stderr and
never a traceback: a hook runs inside the user's agent, which waits for it (cli/_hook_io.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from memactors.cli._hook_io import STDIN_SECONDS, TRANSCRIPT_BYTES
from support import write_config

HARNESS = ('[harness.coder]\nharness = "claude-code"\n[harness.cx]\nharness = "codex"\n'
           '[harness.gm]\nharness = "gemini-cli"\n[harness.oc]\nharness = "opencode"\n'
           '[harness.qw]\nharness = "qwen-code"\n[harness.pi]\nharness = "pi"\n')
END_HOOKS = {"claude-code": "coder", "codex": "cx", "gemini-cli": "gm", "opencode": "oc", "qwen-code": "qw", "pi": "pi"}
#: Far above anything a hook may take (its stdin and transcript deadlines are 5 s and 20 s): a hang fails.
BOUND = 60


def _env(tmp_path: Path) -> dict[str, str]:
    config = write_config(tmp_path, HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMACTORS_", "CLAUDE", "CODEX"))}
    return {**env, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path), "CODEX_HOME": str(tmp_path / "codex")}


def _hook(env: dict[str, str], argv: list[str], stdin: bytes | int) -> subprocess.CompletedProcess[bytes]:
    kwargs: dict[str, object] = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
    done = subprocess.run([sys.executable, "-m", "memactors.cli", "hook", *argv], env=env, capture_output=True,
                          timeout=BOUND, check=False, **kwargs)  # type: ignore[call-overload]
    stderr = done.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    assert done.returncode in (0, 5), (done.returncode, stderr)
    assert len(stderr.strip().splitlines()) <= 2, stderr
    return done


def _end(agent: str) -> list[str]:
    return [agent, "session-end", "--harness", END_HOOKS[agent]]


def _start(agent: str) -> list[str]:
    """The agent's session-start hook; pi has none (its extension gives it tools instead): its session end."""
    if agent == "pi":
        return _end(agent)
    return [agent, "session-start", "--harness", END_HOOKS[agent], "--user"]


HOSTILE_STDIN: dict[str, bytes] = {
    "nested arrays": b"[" * 200_000 + b"]" * 200_000,
    "nested objects": b'{"session_id":"s","transcript_path":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001,
    "nested just past the bound": json.dumps({"session_id": "s", "x": json.loads("[" * 150 + "]" * 150)}).encode(),
    "a lone surrogate": b'{"session_id":"\\ud800","transcript_path":"\\udfff","cwd":"\\ud83d","parts":["\\ud800"]}',
    "invalid UTF-8": b'{"session_id":"\xff\xfe","cwd":"\xc3(","transcript_path":"/tmp/\xa0\xa1"}',
    "NULs": b'{"session_id":"a\\u0000b","transcript_path":"/tmp/x\\u0000y","cwd":"/\\u0000","directory":"\\u0000"}',
    "not an object": b'"just a string"',
    "garbage": bytes(range(256)) * 64,
    "huge numbers": b'{"session_id":"s","started_at":1e400,"ended_at":' + b"9" * 5000 + b',"parts":[]}',
}


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(END_HOOKS))
def test_every_hook_refuses_hostile_stdin_quietly(agent: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    for name, payload in HOSTILE_STDIN.items():
        for argv in (_end(agent), _start(agent)):
            done = _hook(env, argv, payload)
            if argv[1] == "session-start":
                assert done.returncode == 0 and done.stdout == b"", (name, done.stderr)


@pytest.mark.slow
def test_a_hook_stops_reading_endless_stdin(tmp_path: Path) -> None:
    """/dev/zero on stdin (endless, and no JSON): the hook stops at its byte limit and names stdin."""
    env = _env(tmp_path)
    with open("/dev/zero", "rb") as zero:
        done = _hook(env, _end("claude-code"), zero.fileno())
    assert done.returncode == 5 and b"stdin" in done.stderr
    with open("/dev/zero", "rb") as zero:
        assert _hook(env, _start("codex"), zero.fileno()).returncode == 0


@pytest.mark.slow
def test_a_hook_whose_agent_never_closes_stdin_gives_up(tmp_path: Path) -> None:
    """stdin a pipe whose writer stays open and silent: the hook gives up after its deadline, naming stdin."""
    env = _env(tmp_path)
    read, write = os.pipe()
    try:
        done = _hook(env, _end("codex"), read)
    finally:
        os.close(read)
        os.close(write)
    assert done.returncode == 5 and f"did not end within {STDIN_SECONDS:g} s".encode() in done.stderr


def _transcripts(tmp_path: Path) -> dict[str, str]:
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(TRANSCRIPT_BYTES + 1)  # sparse: costs no disk
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n" + b'{"type":"user","message":' * 3000 + b"\n")
    odd = tmp_path / "odd.jsonl"
    odd.write_bytes(b'{"type":"assistant","message":{"content":[{"type":"text","text":"\\ud800 \xff\xfe"}]},'
                    b'"cwd":"\\udfff","sessionId":"\\ud800"}\n\x00\x00\n')
    directory = tmp_path / "adir"
    directory.mkdir()
    return {"a FIFO": str(fifo), "/dev/zero": "/dev/zero", "a directory": str(directory),
            "a huge file": str(huge), "deep lines": str(deep), "odd strings": str(odd)}


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini-cli", "qwen-code"])
def test_every_transcript_reading_hook_refuses_what_is_not_a_session_file(agent: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    for name, path in _transcripts(tmp_path).items():
        hook = {"session_id": "s-1", "transcript_path": path, "cwd": str(tmp_path)}
        done = _hook(env, _end(agent), json.dumps(hook).encode())
        stderr = done.stderr.decode("utf-8", "replace")
        if name in ("a FIFO", "/dev/zero", "a directory", "a huge file"):
            assert done.returncode == 5 and "transcript_path" in stderr, (name, stderr)
        else:  # read as a (useless) session: spooled, no daemon running
            assert done.returncode in (0, 5), (name, stderr)


@pytest.mark.slow
def test_random_mutations_of_a_hook_input_never_break_a_hook(tmp_path: Path) -> None:
    """A seeded fuzzer over the bytes of a real hook input (the suite's: it grows with each new hook)."""
    env = _env(tmp_path)
    transcript = tmp_path / "t.jsonl"
    transcript.write_text('{"type":"user","message":{"content":"hi"},"cwd":"/w","sessionId":"s"}\n', encoding="utf-8")
    base = json.dumps({"session_id": "s-1", "transcript_path": str(transcript), "cwd": str(tmp_path),
                       "source": "startup", "parts": [{"type": "text", "text": "x"}]}).encode()
    rng = random.Random(45)
    for n in range(12):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.4:
                data[at] = rng.randrange(256)
            elif choice < 0.7:
                data[at:at] = rng.choice([b"[" * 3000, b"\\ud800", b"\\u0000", b"\xff", b'{"a":' * 500, b"\\"])
            else:
                del data[at:at + rng.randint(1, 20)]
        agent = sorted(END_HOOKS)[n % len(END_HOOKS)]
        _hook(env, _end(agent) if n % 2 else _start(agent), bytes(data))
