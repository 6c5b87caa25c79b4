"""Fuzz the operator RPC: N seeded malformed / edge-case frames over real websockets to the
daemon as a process, counting the answers by code. The goal is 0 INTERNAL answers over >= 100,000 frames.

    .venv/bin/python bench/rpc_fuzz.py                           # 100,000 frames, seed 34, 16 connections
    .venv/bin/python bench/rpc_fuzz.py --frames 20000 --seed 7 --connections 8
    .venv/bin/python bench/rpc_fuzz.py --src /tmp/old/src        # another source tree (e.g. main before)

Frames come from ``memactors.testing.rpc_fuzz.frame`` (same seed, same frames). Each connection (control
tier: every method is reachable) sends one frame and waits for its answer before the next, so every
answer is matched to the frame that caused it. Printed: the machine, the counts by code, frames per second,
frames without an answer within 30 s, connections the daemon closed, and the first INTERNAL frames (cut
to 300 characters). Exit status 1 when any frame was answered INTERNAL or not at all.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from memactors.testing.rpc_fuzz import frame

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "examples" / "run-42-api-fixer.json"
SERVICE = "harness.v1.MemoryService"


class Daemon:
    def __init__(self, workdir: Path, src: Path | None) -> None:
        state = workdir / "state"
        state.mkdir(parents=True)
        self.state = state
        config = workdir / "harness.toml"
        config.write_text(f'[store]\npath = "{state}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                          '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                          '[memory.episodes]\nsummary = false\n'
                          '[harness.coder]\nharness = "claude-code"\n', encoding="utf-8")
        env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(workdir)}
        if src is not None:
            env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
        self.log_path = workdir / "daemon.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.info = json.loads((state / "daemon.json").read_text(encoding="utf-8"))
                if self.info.get("pid") == self.proc.pid:
                    break
            except (FileNotFoundError, ValueError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"daemon did not start: {self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        self.token = (state / "operator-control.token").read_text(encoding="utf-8").strip()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def seed_store(url: str, token: str) -> None:
    """An episode and a live run, so reads find something and writes hit real rows."""
    async with open_websocket_url(url, extra_headers=[(b"authorization", f"Bearer {token}".encode())]) as ws:
        record = json.loads(RECORD.read_text(encoding="utf-8"))
        for i, (method, params) in enumerate((
                ("IngestRun", {"record": record}),
                ("ReportPresence", {"harness": "api-fixer", "run_id": "r1", "session_id": "s1",
                                    "repo": "forge.example/acme/api", "branch": "main"}))):
            await ws.send_message(json.dumps({"id": i, "method": f"{SERVICE}/{method}", "params": params}))
            await ws.get_message()


async def fuzz(url: str, token: str, frames: int, seed: int, connections: int) -> dict[str, object]:
    counts: collections.Counter[str] = collections.Counter()
    internal: list[str] = []
    unanswered: list[str] = []
    closed = 0
    sent = 0
    rng = random.Random(seed)
    batch = [frame(rng) for _ in range(frames)]
    queue = iter(batch)

    async def worker() -> None:
        nonlocal closed, sent
        while True:
            try:
                async with open_websocket_url(url, extra_headers=[(b"authorization", f"Bearer {token}".encode())],
                                              max_message_size=8 * 1024 * 1024) as ws:
                    for text in queue:
                        sent += 1
                        try:
                            await ws.send_message(text)
                        except ConnectionClosed:
                            closed += 1
                            break
                        with trio.move_on_after(30) as waited:
                            answer = await ws.get_message()
                        if waited.cancelled_caught:
                            unanswered.append(text[:300])
                            break
                        try:
                            reply = json.loads(answer)
                            code = reply["error"]["code"] if "error" in reply else "OK"
                        except (ValueError, KeyError, TypeError):
                            code = "MALFORMED_REPLY"
                        counts[code] += 1
                        if code in ("INTERNAL", "MALFORMED_REPLY"):
                            internal.append(text[:300])
                    else:
                        return
            except ConnectionClosed:
                closed += 1
            except OSError:
                closed += 1
                await trio.sleep(0.1)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - started
    return {"counts": dict(counts), "internal": internal, "unanswered": unanswered, "closed": closed,
            "sent": sent, "seconds": elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--src", type=Path, default=None, help="run the daemon from this source tree")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="rpc-fuzz-") as tmp:
        daemon = Daemon(Path(tmp), args.src)
        try:
            trio.run(seed_store, daemon.info["operator"], daemon.token)
            result = trio.run(fuzz, daemon.info["operator"], daemon.token, args.frames, args.seed, args.connections)
        finally:
            daemon.stop()
        log = daemon.log_path.read_text(encoding="utf-8", errors="replace")
    counts: dict[str, int] = result["counts"]  # type: ignore[assignment]
    answered = sum(counts.values())
    print(f"frames: {args.frames} (seed {args.seed}), answered {answered} over {args.connections} connections "
          f"in {result['seconds']:.1f} s ({answered / result['seconds']:.0f} frames/s)")
    for code, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {code:<20} {n}")
    print(f"INTERNAL answers: {counts.get('INTERNAL', 0)}; unanswered: {len(result['unanswered'])}; "  # type: ignore[arg-type]
          f"connections closed by the daemon: {result['closed']}")
    print(f"daemon log: {log.count('Traceback')} tracebacks, {log.count(' ERROR ')} ERROR lines")
    for text in result["internal"][:10]:  # type: ignore[index]
        print("  INTERNAL <-", text)
    for text in result["unanswered"][:5]:  # type: ignore[index]
        print("  no answer <-", text)
    bad = counts.get("INTERNAL", 0) + counts.get("MALFORMED_REPLY", 0) + len(result["unanswered"])  # type: ignore[arg-type]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
