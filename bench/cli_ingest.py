"""`memactors runs ingest` end to end: the CLI as a subprocess against the daemon as a process.

Two loads: N small records (what a backfill looks like), and M records of ~1 MB of non-ASCII text each
(valid, under the 1 MiB bound, together more than one 4 MiB RPC frame). Each run gets a fresh daemon and
state directory; the median and the spread of `--runs` runs are printed with records per second. With
`--baseline CMD` the same loads also go through another `memactors` (say, main's console script), so
the cost of sizing every record before it is batched shows as a ratio measured in the same run.

    .venv/bin/python bench/cli_ingest.py [--small 2000] [--large 12] [--runs 3] [--baseline /path/to/memactors]
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

RECORD = {
    "harness": "api-fixer", "adapter": "claude-code", "trace_id": "t", "started_at": "2026-11-28T09:00:00Z",
    "ended_at": "2026-11-28T09:10:00Z", "duration_ms": 600000, "outcome": "succeeded", "reason": "completed",
    "spawned_process": True, "events": [],
    "sessions": [{"session_id": "s1", "cwd": "/srv/api", "repo": "forge.example/acme/api", "git_branch": "main"}],
}


def write_records(directory: Path, n: int, text: str) -> None:
    directory.mkdir(parents=True)
    for i in range(n):
        (directory / f"{i:06}.json").write_text(json.dumps({**RECORD, "run_id": f"r{i}", "result_text": text}))


def start_daemon(root: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    config = root / "harness.toml"
    config.write_text(f'[store]\npath = "{root / "state"}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                      '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n')
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if json.loads((root / "state" / "daemon.json").read_text()).get("pid") == proc.pid:
                return proc, env
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("daemon did not start")


def one_run(cli: list[str], records: Path) -> tuple[float, str]:
    root = Path(tempfile.mkdtemp(prefix="cli-ingest-"))
    proc, env = start_daemon(root)
    try:
        started = time.perf_counter()
        done = subprocess.run([*cli, "runs", "ingest", str(records)], env=env, capture_output=True, text=True,
                              check=False)
        elapsed = time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    outcome = done.stdout.strip() or f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1][:120]}"
    return elapsed, outcome


def report(clis: dict[str, list[str]], records: Path, n: int, runs: int) -> dict[str, float | None]:
    """Each CLI `runs` times, interleaved (ABAB, then BABA) so a loaded machine's drift hits both alike."""
    results: dict[str, list[tuple[float, str]]] = {label: [] for label in clis}
    for i in range(runs):
        for label in (list(clis) if i % 2 == 0 else list(reversed(clis))):
            results[label].append(one_run(clis[label], records))
    medians: dict[str, float | None] = {}
    for label, done in results.items():
        times = sorted(t for t, _ in done)
        outcomes = {o for _, o in done}
        median = statistics.median(times)
        print(f"  {label:<10} median {median:6.2f} s ({n / median:7.0f} records/s), min {times[0]:.2f} s, "
              f"max {times[-1]:.2f} s: {' | '.join(sorted(outcomes))}")
        medians[label] = median if all(o.startswith(f"{n} record(s): {n} recorded") for o in outcomes) else None
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="small records (default 2000)")
    parser.add_argument("--large", type=int, default=12, help="~1 MB records (default 12)")
    parser.add_argument("--runs", type=int, default=3, help="runs per load and CLI (default 3)")
    parser.add_argument("--baseline", help="another memactors console script to compare with")
    args = parser.parse_args()
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    this = [sys.executable, "-m", "memactors.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small", Path(tmp) / "large"
        write_records(small, args.small, "fixed the ledger rounding")
        write_records(large, args.large, "é" * 500_000)  # 1,000,000 UTF-8 bytes: under the 1 MiB bound
        for name, path, n in (("small", small, args.small), ("~1 MB", large, args.large)):
            print(f"{n} {name} records, `runs ingest DIR`, the daemon on this branch:")
            clis = {"this": this} | ({"baseline": [args.baseline]} if args.baseline else {})
            medians = report(clis, path, n, args.runs)
            if medians.get("this") and medians.get("baseline"):
                print(f"  this / baseline: {medians['this'] / medians['baseline']:.2f}")  # type: ignore[operator]

if __name__ == "__main__":
    main()
