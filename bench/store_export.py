"""`memactors store export` / `import` round trip and `store backup` under a serving daemon.

1. Writes a synthetic export of N episodes (each with its run and index row: real episode bodies,
   made by memactors' own models and wire format), imports it into an empty SQLite store with the CLI,
   exports that store again and checks the round trip gives the same rows (header aside).
2. Starts the daemon on the store (it records the imported episodes to the built-in provider in the
   background: a daemon under load), measures `memory recall`'s RPC latency for a baseline, then again
   while `store backup` runs, and prints the backup's time and the recall p50/p99 of both.

    .venv/bin/python bench/store_export.py [--episodes 100000] [--recall-seconds 5]
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
import threading
import time
from pathlib import Path

from memactors._wire import episode_json
from memactors.models import Episode

REPO = "forge.example/acme/api"
WORDS = ("ledger", "rounding", "webhook", "retry", "invoice", "export", "cookie", "session", "timeout", "pool")


def synthetic(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps({"type": "header", "format": "memactors-export", "version": 1, "engine": "sqlite",
                              "exported_at": "2026-12-01T00:00:00.000000Z", "filter": {}}) + "\n")
        for i in range(n):
            at = f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:00:00Z"
            words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4))
            episode = Episode(
                episode_id=f"ep_{i:020x}", harness="api-fixer", adapter="git", run_id=f"git-{i:040x}",
                trace_id="", model="", repo=REPO, branch="main", outcome="succeeded", reason="completed",
                started_at=at, duration_ms=0, cost_usd=None, cost_source="unknown",
                files_touched=(f"src/{WORDS[i % 10]}.py",), pull_request=None, verify_failures=(),
                result_excerpt=f"commit {i}: fixed the {words}", summary=None, trust_class="standard",
                scope=f"project:{REPO}")
            run = {"harness": "api-fixer", "run_id": episode.run_id, "adapter": "git", "started_at": at,
                   "ended_at": at, "outcome": "succeeded", "reason": "completed", "duration_ms": 0, "repo": REPO,
                   "branch": "main", "ingested_at": "2026-12-01T00:00:00.000000Z"}
            out.write(json.dumps({"type": "run", "row": run, "text": None}) + "\n")
            row = {k: getattr(episode, k) for k in ("episode_id", "harness", "run_id", "repo", "branch", "scope",
                                                     "trust_class", "outcome", "started_at")}
            row |= {"recorded_at": "2026-12-01T00:00:00.000000Z", "forgotten_at": None}
            out.write(json.dumps({"type": "episode", "row": row, "text": episode_json(episode)}) + "\n")
        out.write(json.dumps({"type": "end", "counts": {"episode": n}}) + "\n")


def config_in(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "harness.toml"
    config.write_text(f'[store]\npath = "{root / "state"}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                      '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                      '[memory]\nembeddings = false\n')
    return {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}


def cli(env: dict[str, str], *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
    return time.perf_counter() - started, done


def rows(path: Path) -> list[str]:
    """The export's row lines as comparable text (header and end aside; texts compared as parsed JSON)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        if item["type"] in ("header", "end", "index"):
            continue
        if isinstance(item.get("text"), str):
            item["text"] = json.loads(item["text"])
        out.append(json.dumps(item, sort_keys=True))
    return sorted(out)


def recall_latencies(env: dict[str, str], state: Path, seconds: float, stop: threading.Event | None = None) -> list[float]:
    from memactors.rpc.wsclient import call_once

    info = json.loads((state / "daemon.json").read_text())
    url = info["operator"]
    token = (state / "operator-read.token").read_text().strip()
    out: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while (stop is None and time.monotonic() < end) or (stop is not None and not stop.is_set()):
        started = time.perf_counter()
        call_once(url, token, "harness.v1.MemoryService/Recall",
                  {"query": f"{WORDS[i % 10]} {WORDS[(i + 3) % 10]}", "repo": REPO, "limit": 8})
        out.append((time.perf_counter() - started) * 1000)
        i += 1
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--recall-seconds", type=float, default=5.0, help="baseline recall sampling (default 5)")
    args = parser.parse_args()
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}; {args.episodes} episodes")
    root = Path(tempfile.mkdtemp(prefix="store-export-"))
    try:
        source = root / "synthetic.jsonl"
        synthetic(source, args.episodes)
        env = config_in(root / "a")
        took, _ = cli(env, "store", "import", str(source), "--json")
        print(f"  import  {took:7.1f} s ({args.episodes / took:8.0f} episodes/s), {source.stat().st_size >> 20} MiB")
        again = root / "again.jsonl"
        took, _ = cli(env, "store", "export", "--output", str(again))
        print(f"  export  {took:7.1f} s ({args.episodes / took:8.0f} episodes/s)")
        same = rows(source) == rows(again)
        print(f"  round trip: {'the same rows' if same else 'ROWS DIFFER'}")
        state = root / "a" / "state"
        proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if json.loads((state / "daemon.json").read_text()).get("pid") == proc.pid:
                        break
                except (FileNotFoundError, ValueError):
                    pass
                time.sleep(0.05)
            base = recall_latencies(env, state, args.recall_seconds)
            stop = threading.Event()
            during: list[float] = []
            sampler = threading.Thread(target=lambda: during.extend(recall_latencies(env, state, 0, stop)))
            sampler.start()
            took, done = cli(env, "store", "backup", str(root / "backup.db"), "--json")
            stop.set()
            sampler.join()
            report = json.loads(done.stdout)
            print(f"  backup  {took:7.1f} s (the copy {report['seconds']:.2f} s, {report['bytes'] >> 20} MiB, "
                  f"integrity {report['integrity']})")
            print(f"  recall while the daemon records the imported episodes: p50 {statistics.median(base):.1f} ms, "
                  f"p99 {pct(base, 0.99):.1f} ms ({len(base)} calls)")
            print(f"  recall during the backup: p50 {statistics.median(during) if during else float('nan'):.1f} ms, "
                  f"p99 {pct(during, 0.99):.1f} ms ({len(during)} calls)")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        print(f"  load at the end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
