"""A run's event log and stderr tail (`memactors runs logs`, `runs show`), on recorded streams."""

from __future__ import annotations

import base64
from pathlib import Path

import trio
import trio.testing

from memactors.adapters.claude_code import ClaudeCodeAdapter
from memactors.adapters.command import CommandAdapter
from memactors.agents.prompt import compose_prompt
from memactors.agents.run_watch import (
    MAX_EVENT_CHARS,
    MAX_EVENTS,
    STDERR_TAIL_BYTES,
    RunWatch,
    StderrTail,
    scrub,
)
from memactors.redact import REDACTED, redact_tail

DATA = Path(__file__).resolve().parents[1] / "data"
AT = "2026-12-01T10:00:00.000000Z"


def watched(adapter: object, lines: list[str]) -> RunWatch:
    parser = adapter.parser()  # type: ignore[attr-defined]
    watch = RunWatch()
    for line in lines:
        parser.feed(line, at=AT)
        watch.after_line(line, parser.transcript, AT)
    return watch


def test_a_claude_stream_becomes_its_events_in_order() -> None:
    """The real stream (Write, a failing pytest, a final answer): every event the operator reads, and
    nothing the parser does not keep (the file's content, the test output)."""
    lines = (DATA / "claude_stream_session.jsonl").read_text(encoding="utf-8").splitlines()
    watch = watched(ClaudeCodeAdapter(), lines)
    events = [{k: v for k, v in e.items() if k not in ("at", "seq")} for e in watch.events]
    assert events == [
        {"kind": "session", "session_id": "7f6ebf4c-3594-4ecb-beff-d2840e11bf7d", "model": "claude-opus-5-5"},
        {"kind": "tool", "name": "Write"},
        {"kind": "edit", "path": "/tmp/cx/repo/hello.txt"},
        {"kind": "tool", "name": "Bash"},
        {"kind": "command", "command": "python3 -m pytest -q", "exit_code": 5},
        {"kind": "text", "text": "All done: wrote hello.txt"},
        {"kind": "result", "ok": True, "subtype": "success", "cost_usd": 0.00288, "turns": 3},
    ]
    assert [e["seq"] for e in watch.events] == list(range(1, 8)) and watch.lines == len(lines)


def test_a_refused_command_shows_as_not_run() -> None:
    lines = (DATA / "claude_stream_refused_bash.jsonl").read_text(encoding="utf-8").splitlines()
    commands = [e for e in watched(ClaudeCodeAdapter(), lines).events if e["kind"] == "command"]
    assert [c["exit_code"] for c in commands] == [None, 0, 4]


def test_events_are_redacted_cut_and_bounded() -> None:
    watch = watched(CommandAdapter(), ["token ghp_" + "A1b2C3d4E5" * 3 + "f6G7h8 here", "y" * 5000, "", "last"])
    texts = [e["text"] for e in watch.events]
    assert texts[0] == "token [REDACTED] here"
    assert len(texts[1]) == MAX_EVENT_CHARS and texts[1].endswith("…")
    assert texts[2] == "last" and watch.lines == 3  # a blank line is no output and no event
    for n in range(MAX_EVENTS + 100):
        watch.note("daemon", AT, text=f"note {n}")
    assert len(watch.events) == MAX_EVENTS and watch.dropped == 103
    assert watch.since(watch.seq - 2) == list(watch.events)[-2:]


def test_the_stderr_tail_keeps_the_last_4_kib_in_whole_lines() -> None:
    tail = StderrTail()
    assert tail.text() is None
    for n in range(500):
        tail.feed(f"line {n:03d} {'.' * 40}\n".encode())
    text = tail.text()
    assert text is not None and len(text.encode()) <= STDERR_TAIL_BYTES
    assert text.startswith("line ") and text.endswith(f"line 499 {'.' * 40}\n")  # the cut first line dropped
    assert tail.total == 500 * 50


def test_scrub_removes_every_line_of_the_operator_prompt() -> None:
    prompt = "fix the ledger in notes/ledger.md\nthen run the tests"
    composed = compose_prompt("fact text here, from an earlier run", prompt, nonce="n0nce")
    echoed = f"usage: agent {composed}\nerror: bad flag\nfix the ledger in notes/ledger.md --x\n"
    cleaned = scrub(echoed, prompt, composed)
    assert "n0nce" not in cleaned and "fix the ledger" not in cleaned and "then run the tests" not in cleaned
    assert cleaned == "usage: agent [prompt]\nerror: bad flag\n[prompt] --x\n"
    assert scrub("ok\n", None) == "ok\n"


def test_scrub_keeps_an_answer_that_repeats_a_briefing_line() -> None:
    """The briefing holds earlier runs' excerpts; an answer equal to one is the answer."""
    prompt = "Check the nightly build and report."
    briefing = "Recent episodes\n- nightly · ok · All tests pass, nothing to do."
    composed = compose_prompt(briefing, prompt, nonce="n0nce")
    answer = "All tests pass, nothing to do."
    assert scrub(answer, prompt, composed) == answer
    assert scrub(briefing, prompt, composed) == briefing
    watch = RunWatch(prompt, composed)
    watch.note("text", AT, text=answer)
    watch.note("text", AT, text="- nightly · ok · All tests pass, nothing to do.")
    watch.note("text", AT, text=prompt)
    assert [e["text"] for e in watch.events] == [answer, "- nightly · ok · All tests pass, nothing to do.", "[prompt]"]


def test_a_credential_holding_a_prompt_line_is_redacted_whole() -> None:
    """Redact first, then scrub; a scrub inside a credential would split it in two halves the
    redactor passes (`ghp_R7kQ2mXv9L[prompt]T4sW…`)."""
    secret = "ghp_R7kQ2mXv9L" + "pZ3wYbN8cQ" * 2 + "T4sWq1Ld"
    line = secret[8:28]
    prompt = f"{line}\nfix it"
    tail = StderrTail()
    tail.feed(f"error: token {secret} rejected\n".encode())
    watch = RunWatch(prompt, prompt)
    assert watch.scrub.thorough(redact_tail(tail.text() or "")) == "error: token [REDACTED] rejected\n"
    watch.note("text", AT, text=f"token {secret}")
    assert watch.events[0]["text"] == "token [REDACTED]"


async def test_a_follower_wakes_on_the_next_event_and_when_the_run_ends() -> None:
    watch = RunWatch()
    woke: list[int] = []

    async def follow(after: int) -> None:
        await watch.wait_after(after)
        woke.append(after)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow, 0)
        nursery.start_soon(follow, 1)
        await trio.testing.wait_all_tasks_blocked()
        watch.note("daemon", AT, text="first")
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [0]
        watch.close()
    assert woke == [0, 1]


def test_an_event_echoing_the_prompt_keeps_neither_its_lines_nor_its_nonce() -> None:
    prompt = "fix the ledger in notes/ledger.md"
    composed = compose_prompt("fact text here, long", prompt, nonce="n0nce42")
    watch = RunWatch(prompt, composed)
    watch.note("text", AT, text=f"echo: {composed}")
    watch.note("text", AT, text=f"echo: {composed.replace(chr(10) * 2, chr(10))}\nmore")  # not whole: by line
    first, second = (e["text"] for e in watch.events)
    assert first == "echo: [prompt]"
    assert "n0nce42" not in second and "fix the ledger" not in second and "[nonce]" in second
    assert second.endswith("\n[prompt]\nmore") and "fact text here, long" in second  # the briefing is kept
    long_line = "fix " + "the ledger " * 300  # a prompt line longer than the window an event is redacted in
    watch = RunWatch(long_line, long_line)
    watch.note("text", AT, text=f"echo\n{long_line}")
    assert watch.events[0]["text"] == "echo\n[prompt]"


def test_a_key_block_cut_by_the_tail_window_shows_none_of_its_lines() -> None:
    """The stderr tail keeps the last 4 KiB; when a private key's BEGIN line falls before the
    cut, its body lines and END line are all the tail holds of it, and `redact_tail` drops them."""
    body = [base64.b64encode(bytes([n]) * 48).decode() for n in range(80)]  # 64-char lines, ~5 KiB
    tail = StderrTail()
    tail.feed(b"starting\n-----BEGIN OPENSSH PRIVATE KEY-----\n")
    tail.feed(("\n".join(body) + "\n-----END OPENSSH PRIVATE KEY-----\nerror: bad flag --x\n").encode())
    text = tail.text()
    assert text is not None and "BEGIN" not in text and body[-1] in text  # the window starts mid-block
    shown = redact_tail(text)
    assert not any(line in shown for line in body) and "END OPENSSH" not in shown
    assert shown == f"{REDACTED}\nerror: bad flag --x\n"
