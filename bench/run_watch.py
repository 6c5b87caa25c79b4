"""What watching a run costs per stdout line: the adapter's parser alone (the anchor, what the runs actor
did before it kept an event log) against the parser plus the run's event log (``RunWatch.after_line``: events
derived from the transcript, each string redacted and cut), on the runs actor's path for every line.

The stream is the real Claude Code session in tests/data (init, Write, a failing Bash, a result) and the
refused-Bash session, repeated; plus a chatty ``command`` agent (one text event per line, a line with a
token in it every tenth). The chatty agent again with a 100 KiB operator prompt under a 4 KiB briefing:
each event is then also scrubbed of the operator's prompt (one Aho-Corasick pass per event),
and building that scrub once per run is timed too. Medians of ``--repeats`` timed passes; the machine
is printed.

    .venv/bin/python bench/run_watch.py [--repeats 7] [--copies 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from memactors.adapters.claude_code import ClaudeCodeAdapter
from memactors.adapters.command import CommandAdapter
from memactors.agents.prompt import compose_prompt
from memactors.agents.run_watch import PromptScrub, RunWatch
from memactors.redact import shared

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
AT = "2026-12-01T10:00:00.000000Z"


def claude_lines(copies: int) -> list[str]:
    one = [line for name in ("claude_stream_session.jsonl", "claude_stream_refused_bash.jsonl")
           for line in (DATA / name).read_text(encoding="utf-8").splitlines()]
    return one * copies


def command_lines(copies: int) -> list[str]:
    token = "ghp_" + "A1b2C3d4E5" * 3 + "f6G7h8"
    return [f"step {n}: compiled module_{n}.py ok" if n % 10 else f"using token {token} for the fetch"
            for n in range(40 * copies)]


SCRUBS: dict[tuple[str, str], PromptScrub] = {}  # built once per run by the runs actor, off the loop: not per pass


def big_prompt() -> tuple[str, str]:
    """A 100 KiB operator prompt (2,000 distinct lines) and the prompt composed with a 4 KiB briefing."""
    prompt = "\n".join(f"step {n}: check module_{n} against the ledger rules and report" for n in range(1600))
    briefing = "\n".join(f"- run r{n} ok: All tests pass, nothing new to report" for n in range(80))
    return prompt, compose_prompt(briefing, prompt)


def per_line_us(adapter: object, lines: list[str], watched: bool, prompt: tuple[str, str] | None = None) -> float:
    parser = adapter.parser()  # type: ignore[attr-defined]
    watch = RunWatch() if prompt is None else RunWatch(scrub=SCRUBS.setdefault(prompt, PromptScrub(*prompt)))
    feed: Callable[[str], None] = parser.feed  # type: ignore[assignment]
    started = time.perf_counter()
    if watched:
        for line in lines:
            feed(line, at=AT)  # type: ignore[call-arg]
            watch.after_line(line, parser.transcript, AT)
    else:
        for line in lines:
            feed(line, at=AT)  # type: ignore[call-arg]
    return (time.perf_counter() - started) / len(lines) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--copies", type=int, default=200)
    args = parser.parse_args()
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    shared()  # compile the redaction rules first, as the daemon does at start
    for label, adapter, lines in (("claude-code stream", ClaudeCodeAdapter(), claude_lines(args.copies)),
                                  ("command stdout", CommandAdapter(), command_lines(args.copies))):
        anchor = statistics.median(per_line_us(adapter, lines, False) for _ in range(args.repeats))
        watched = statistics.median(per_line_us(adapter, lines, True) for _ in range(args.repeats))
        print(f"{label:<20} {len(lines):>6} lines  parser alone {anchor:7.1f} us/line  "
              f"parser + event log {watched:7.1f} us/line  ({watched / anchor:.2f}x, "
              f"+{watched - anchor:.1f} us/line)")
    prompt = big_prompt()
    lines = command_lines(args.copies)
    adapter = CommandAdapter()
    anchor = statistics.median(per_line_us(adapter, lines, False) for _ in range(args.repeats))
    scrubbed = statistics.median(per_line_us(adapter, lines, True, prompt) for _ in range(args.repeats))
    built = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        PromptScrub(*prompt)
        built.append((time.perf_counter() - started) * 1e3)
    print(f"{'command, 100 KiB prompt':<20} {len(lines):>6} lines  parser alone {anchor:7.1f} us/line  "
          f"parser + event log + scrub {scrubbed:7.1f} us/line  ({scrubbed / anchor:.2f}x); "
          f"scrub built once per run in {statistics.median(built):.1f} ms ({len(prompt[0]) // 1024} KiB prompt)")


if __name__ == "__main__":
    main()
