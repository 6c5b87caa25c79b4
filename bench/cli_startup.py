"""CLI cold start: `memactors --help` and `memactors memory status` against a running daemon.

Targets: `--help` <= 250 ms, `memory status` <= 400 ms. Each run is a fresh interpreter
(`python -m memactors.cli`, what the console script does); the median and the worst of N runs are
printed, with the heaviest imports of one run from `python -X importtime`. Not a test: speed belongs
here, not in assertions.

    .venv/bin/python bench/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return elapsed


def heaviest_imports(argv: list[str], env: dict[str, str], n: int = 8) -> list[tuple[int, str]]:
    done = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], env=env, capture_output=True, check=False)
    rows = []
    for line in done.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = (p.strip() for p in line.removeprefix("import time:").split("|"))
            if cumulative.isdigit():
                rows.append((int(cumulative), name))
    top_level = [r for r in rows if not r[1].startswith(" ")]
    return sorted(top_level, reverse=True)[:n]


def report(label: str, argv: list[str], env: dict[str, str], runs: int, target_ms: float) -> None:
    times = sorted(timed(argv, env) * 1000 for _ in range(runs))
    median = statistics.median(times)
    verdict = "met" if median <= target_ms else "MISSED"
    print(f"{label:<28} median {median:6.0f} ms  worst {times[-1]:6.0f} ms  target {target_ms:.0f} ms: {verdict}")
    for cumulative, name in heaviest_imports(argv, env):
        print(f"    {cumulative / 1000:7.1f} ms  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per command (default 15)")
    args = parser.parse_args()
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}")
    cli = [sys.executable, "-m", "memactors.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "harness.toml"
        config.write_text(f'[store]\npath = "{Path(tmp) / "state"}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                          '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n')
        env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": tmp}
        report("memactors --help", [*cli, "--help"], env, args.runs, 250)
        daemon = subprocess.Popen([*cli, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (Path(tmp) / "state" / "daemon.json").exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.05)
            report("memactors memory status", [*cli, "memory", "status"], env, args.runs, 400)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)


if __name__ == "__main__":
    main()
