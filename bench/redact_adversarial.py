"""The shared redactor's cost: adversarial ~200 kB inputs (ReDoS guard), and per KB of record text, each
beside the redactor of an earlier commit run on the same input in the same process.

    .venv/bin/python bench/redact_adversarial.py [--baseline 8f9bbd3] [--runs 5]

The baseline is the redactor as it was at ``--baseline`` (its ``redact.py`` and rule file, read with
``git show`` and loaded as a module of this checkout's package), so both figures come from one machine
under one load. Prints the machine, then medians of ``--runs`` runs:

* per adversarial input: ms and MB/s (a rule that backtracks quadratically shows up as seconds);
* per KB of record text: µs/KB for the strings of the example run records (what ingest redacts), for
  agent prose and code without secrets, and for a text dense with secrets (the context rules' corpus).

Ingest throughput end to end (CLI, daemon, store) is ``bench/cli_ingest.py --baseline``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _baseline_redactor import baseline_redactor  # noqa: E402

from memactors.redact import Redactor  # noqa: E402
from support_corpus import full  # noqa: E402
from support_secrets import ADVERSARIAL  # noqa: E402


def record_strings() -> list[str]:
    """Every string of the example run records, as ingest redacts them (one call per string)."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for path in sorted((ROOT / "examples").glob("run-*.json")):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return out


PROSE = ("Refactored the ledger module: split `post_entry` into validation and persistence, added a fixed "
         "clock to the flaky test in tests/test_ledger.py, and ran `pytest -q -x` (41 passed). The config "
         "now reads `timeout = 30` and `retries: 3`; see docs/operations.md#ledger for the new keys.\n"
         "def post_entry(entry: Entry, *, clock: Clock) -> Receipt:\n    return store.write(entry, clock.now())\n")


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="8f9bbd3", help="git revision whose redactor is the baseline")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-adversarial", action="store_true", help="only the per-KB figures")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    current = Redactor()
    compile_now = time.perf_counter() - started
    started = time.perf_counter()
    before = baseline_redactor(args.baseline)
    compile_before = time.perf_counter() - started
    print(f"rules: {len(current.rules)} now (compiled in {compile_now:.2f} s), {len(before.rules)} at "
          f"{args.baseline} ({compile_before:.2f} s)")
    current.redact("warm up")
    before.redact("warm up")

    print("\nadversarial inputs: median ms (MB/s), now vs baseline")
    for name, text in {} if args.no_adversarial else ADVERSARIAL.items():
        now = median_time(lambda t=text: current.redact(t), args.runs)
        then = median_time(lambda t=text: before.redact(t), args.runs)
        print(f"{name:>22}  {len(text) / 1000:5.0f} kB  now {now * 1000:8.1f} ms ({len(text) / now / 1e6:5.1f})"
              f"  baseline {then * 1000:8.1f} ms ({len(text) / then / 1e6:5.1f})")

    strings = record_strings()
    texts = {
        "example records (per string)": strings * 50,
        "prose and code, no secrets": [PROSE] * 400,
        "secret-dense (context rules' corpus)": [s.text for s in full()],
    }
    print("\nper KB of record text: median µs/KB, now vs baseline (ratio)")
    for name, batch in texts.items():
        kb = sum(len(t) for t in batch) / 1024
        now = median_time(lambda b=batch: [current.redact(t) for t in b], args.runs)
        then = median_time(lambda b=batch: [before.redact(t) for t in b], args.runs)
        print(f"{name:>32}  {kb:7.1f} KB  now {now / kb * 1e6:8.1f}  baseline {then / kb * 1e6:8.1f}  "
              f"({now / then:4.2f}x)")
        many_now = median_time(lambda b=batch: current.redact_many(b), args.runs)
        many_then = median_time(lambda b=batch: before.redact_many(b), args.runs)
        print(f"{'… as redact_many':>32}  {kb:7.1f} KB  now {many_now / kb * 1e6:8.1f}  baseline "
              f"{many_then / kb * 1e6:8.1f}  ({many_now / many_then:4.2f}x)")


if __name__ == "__main__":
    main()
