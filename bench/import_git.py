"""`memactors import git` end to end: the CLI as a subprocess against the daemon as a process.

Imports a real repository's history (by default every ref's commits, `--all`) into a fresh daemon and
state directory, then imports it again (every commit answers duplicate). Prints episodes per second of
the first import and commits per second of the second, as the median of `--runs` runs, with the
machine and its load. The daemon runs as the tests run it (embeddings off) unless `--embeddings`.

    .venv/bin/python bench/import_git.py /path/to/repo-or-bare-git-dir [--runs 1] [--rev HEAD] [--embeddings]
        [--baseline-src DIR]

`--baseline-src DIR` runs each import a second time on another source tree (daemon and CLI, by
PYTHONPATH; say `git archive <commit> src | tar -x -C DIR`, then DIR/src), alternating, so the two
rates are measured under the same load.

A public repository to try: a bare mirror of encode/httpx (5,810 non-merge commits over all refs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def start_daemon(root: Path, embeddings: bool, source: str | None = None) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    config = root / "harness.toml"
    config.write_text(f'[store]\npath = "{root / "state"}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                      '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                      + ("" if embeddings else "[memory]\nembeddings = false\n"))
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)} | ({"PYTHONPATH": source} if source else {})
    proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if json.loads((root / "state" / "daemon.json").read_text()).get("pid") == proc.pid:
                return proc, env
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("daemon did not start")


def one_run(repo: str, revs: list[str], embeddings: bool, source: str | None = None
            ) -> tuple[float, float, dict[str, int], dict[str, int]]:
    root = Path(tempfile.mkdtemp(prefix="import-git-"))
    proc, env = start_daemon(root, embeddings, source)
    argv = [sys.executable, "-m", "memactors.cli", "import", "git", "--repo", repo, *revs, "--json"]
    try:
        started = time.perf_counter()
        first = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        second = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        second_s = time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    for done in (first, second):
        if done.returncode != 0:
            raise SystemExit(f"import exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return first_s, second_s, json.loads(first.stdout)["outcomes"], json.loads(second.stdout)["outcomes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", help="a git checkout or bare git directory")
    parser.add_argument("--rev", help="import only the commits reachable from this (default: every ref)")
    parser.add_argument("--runs", type=int, default=1, help="runs (default 1: an import of 10k commits is minutes)")
    parser.add_argument("--embeddings", action="store_true", help="the daemon's default hybrid ranking on")
    parser.add_argument("--baseline-src", help="another source tree (its src/) to compare with, by PYTHONPATH")
    args = parser.parse_args()
    revs = ["--rev", args.rev] if args.rev else ["--all"]
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}; embeddings {'on' if args.embeddings else 'off'}")
    labels = ["this", *(["baseline"] if args.baseline_src else [])]
    firsts: dict[str, list[float]] = {label: [] for label in labels}
    seconds: dict[str, list[float]] = {label: [] for label in labels}
    n = 0
    for i in range(args.runs):
        for label in (labels if i % 2 == 0 else list(reversed(labels))):
            a, b, outcomes, again = one_run(args.repo, revs, args.embeddings,
                                            args.baseline_src if label == "baseline" else None)
            n = sum(outcomes.values())
            recorded = outcomes["recorded"] + outcomes["queued"]
            print(f"  {label:<8} first import  {a:7.1f} s: {outcomes}")
            print(f"  {label:<8} second import {b:7.1f} s: {again}")
            firsts[label].append(recorded / a)
            seconds[label].append(n / b)
    for label in labels:
        print(f"{label}: {n} commits: first import median {statistics.median(firsts[label]):.1f} episodes/s, "
              f"second (all duplicate) median {statistics.median(seconds[label]):.1f} commits/s")
    print(f"load at the end {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
