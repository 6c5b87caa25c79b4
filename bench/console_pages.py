"""The web console's pages against a real daemon: median and p90 time per page over HTTP.

Starts `memactors serve` with the console on (tests/support_console.py: three episodes, two configured
harnesses), signs in with the read token and fetches each page ``--rounds`` times, one at a time, over a
kept-alive connection. Prints medians with the machine and its load. `python bench/console_pages.py`.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support_console import API, console_daemon, csrf_of, seed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = console_daemon(Path(tmp))
        try:
            ids = seed(daemon)
            base = daemon.info["console"].rstrip("/")
            origin = {"origin": base}
            with httpx2.Client(base_url=base, timeout=60) as client:
                login = client.get("/login")
                client.post("/login", data={"csrf": csrf_of(login.text), "token": daemon.token("read")}, headers=origin)
                csrf = csrf_of(client.get("/recall").text)
                pages = {
                    "episodes list": lambda: client.get("/episodes"),
                    "episodes, outcome filter": lambda: client.get("/episodes", params={"outcome": "failed"}),
                    "episode page": lambda: client.get(f"/episodes/{ids['web']}"),
                    "recall as a repository": lambda: client.post(
                        "/recall", data={"csrf": csrf, "query": "ledger rounding", "as_kind": "repo", "target": API},
                        headers=origin),
                    "briefing": lambda: client.get("/briefings/api-fixer"),
                    "health": lambda: client.get("/health"),
                }
                print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
                      f"load {os.getloadavg()[0]:.2f} at start; {args.rounds} rounds per page")
                for name, fetch in pages.items():
                    assert fetch().status_code == 200, name  # warm
                    times = []
                    for _ in range(args.rounds):
                        started = time.perf_counter()
                        response = fetch()
                        times.append((time.perf_counter() - started) * 1000)
                        assert response.status_code == 200, name
                    size = len(re.sub(rb"\s+", b" ", response.content))
                    times.sort()
                    print(f"  {name:<26} median {statistics.median(times):6.1f} ms  p90 {times[int(len(times) * 0.9) - 1]:6.1f} ms"
                          f"  ({size} bytes)")
                print(f"load {os.getloadavg()[0]:.2f} at the end")
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
