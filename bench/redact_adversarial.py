"""How long the shared redactor takes on adversarial ~200 kB inputs (ReDoS guard), per input.

    .venv/bin/python bench/redact_adversarial.py

Prints the machine, then per input the median of 5 runs in ms and the throughput. A rule that
backtracks quadratically shows up here as seconds; the test suite only checks the output.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from memactors.redact import redact  # noqa: E402
from test_redact import ADVERSARIAL  # noqa: E402


def main() -> None:
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    redact("warm up the rules")
    for name, text in ADVERSARIAL.items():
        times = []
        for _ in range(5):
            started = time.perf_counter()
            redact(text)
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        print(f"{name:>20}  {len(text) / 1000:7.0f} kB  median {median * 1000:8.1f} ms  "
              f"{len(text) / median / 1e6:6.1f} MB/s")


if __name__ == "__main__":
    main()
