"""`memactors runs ingest` end to end: the CLI as a subprocess against the daemon as a process.

Two loads: N small records (what a backfill looks like), and M records of ~1 MB of non-ASCII text each
(valid, under the 1 MiB bound, together more than one 4 MiB RPC frame). Each run gets a fresh daemon and
state directory; the median and the spread of `--runs` runs are printed with records per second. With
`--baseline CMD` the same loads also go through another `memactors` (say, main's console script), so
the cost of sizing every record before it is batched shows as a ratio measured in the same run.
`--baseline-src DIR` runs another source tree instead (daemon and CLI both, by PYTHONPATH: say
`git archive <commit> src | tar -x -C DIR`, then DIR/src).

`--synthetic N` replaces both loads with N realistic records over 50 repositories (bench/user_paths.py's
`run_record`: 40-120 words of text each, redaction on as always), the scale target's load (10k records):

    .venv/bin/python bench/cli_ingest.py --synthetic 10000 --runs 1 [--baseline-src /tmp/base/src]

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


def write_synthetic(directory: Path, n: int) -> None:
    """n of bench/user_paths.py's realistic run records (50 repositories), one file each."""
    import random

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from user_paths import run_record, vocabulary

    directory.mkdir(parents=True)
    rng, words = random.Random(5), vocabulary(random.Random(7))
    for i in range(n):
        (directory / f"{i:06}.json").write_text(json.dumps(run_record(i, rng, words)))


#: PYTHONPATH for the daemon and CLI of the run in progress (`--baseline-src`), else None.
SOURCE: str | None = None


def start_daemon(root: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    config = root / "harness.toml"
    config.write_text(f'[store]\npath = "{root / "state"}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                      '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n')
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}
    if SOURCE:
        env["PYTHONPATH"] = SOURCE
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


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used: what a loaded machine moves far less than
    the wall clock."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: Daemon CPU seconds of each run, by CLI label (printed per record beside the wall clock).
CPU: dict[str, list[float]] = {}


def one_run(cli: list[str], records: Path) -> tuple[float, str]:
    global SOURCE
    SOURCE, key = None, " ".join(cli)
    if cli[0].startswith("PYTHONPATH="):
        SOURCE, cli = cli[0].split("=", 1)[1], cli[1:]
    root = Path(tempfile.mkdtemp(prefix="cli-ingest-"))
    proc, env = start_daemon(root)
    try:
        started, cpu = time.perf_counter(), cpu_s(proc.pid)
        done = subprocess.run([*cli, "runs", "ingest", str(records)], env=env, capture_output=True, text=True,
                              check=False)
        elapsed = time.perf_counter() - started
        CPU.setdefault(key, []).append(cpu_s(proc.pid) - cpu)
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
        cpu_ms = 1000 * statistics.median(CPU.pop(" ".join(clis[label]), [0.0])) / n
        print(f"  {label:<10} median {median:6.2f} s ({n / median:7.0f} records/s), min {times[0]:.2f} s, "
              f"max {times[-1]:.2f} s, daemon CPU {cpu_ms:.2f} ms/record: {' | '.join(sorted(outcomes))}")
        medians[label] = median if all(o.startswith(f"{n} record(s): {n} recorded") for o in outcomes) else None
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="small records (default 2000)")
    parser.add_argument("--large", type=int, default=12, help="~1 MB records (default 12)")
    parser.add_argument("--runs", type=int, default=3, help="runs per load and CLI (default 3)")
    parser.add_argument("--baseline", help="another memactors console script to compare with")
    parser.add_argument("--baseline-src", help="another source tree (its src/) to compare with, by PYTHONPATH")
    parser.add_argument("--synthetic", type=int, default=0, help="N realistic records over 50 repositories instead")
    args = parser.parse_args()
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    this = [sys.executable, "-m", "memactors.cli"]
    baseline = ([args.baseline] if args.baseline else
                [f"PYTHONPATH={args.baseline_src}", *this] if args.baseline_src else None)
    with tempfile.TemporaryDirectory() as tmp:
        loads: list[tuple[str, Path, int]] = []
        if args.synthetic:
            write_synthetic(Path(tmp) / "synthetic", args.synthetic)
            loads.append(("realistic (50 repositories)", Path(tmp) / "synthetic", args.synthetic))
        else:
            small, large = Path(tmp) / "small", Path(tmp) / "large"
            write_records(small, args.small, "fixed the ledger rounding")
            write_records(large, args.large, "é" * 500_000)  # 1,000,000 UTF-8 bytes: under the 1 MiB bound
            loads += [("small", small, args.small), ("~1 MB", large, args.large)]
        for name, path, n in loads:
            print(f"{n} {name} records, `runs ingest DIR`, the daemon on this branch:")
            clis = {"this": this} | ({"baseline": baseline} if baseline else {})
            medians = report(clis, path, n, args.runs)
            if medians.get("this") and medians.get("baseline"):
                print(f"  this / baseline time: {medians['this'] / medians['baseline']:.2f}")  # type: ignore[operator]
    print(f"load at the end {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
