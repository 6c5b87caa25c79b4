"""`memactors import claude-code` of a directory of N session transcripts: episodes per second.

The transcripts are the recorded Claude Code fixture (tests/data/claude_transcript_session.jsonl), one
per session id, in a git repository made here; a fresh daemon and state directory per run. Prints the
first import's episodes/s and the second's (all duplicate) sessions/s, with the machine and its load.

    .venv/bin/python bench/import_sessions.py [--sessions 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from import_git import start_daemon

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "claude_transcript_session.jsonl"
SESSION = "5a0ddcd0-5487-4794-99ac-143f6bb9e248"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args()
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}; {args.sessions} sessions, embeddings off")
    root = Path(tempfile.mkdtemp(prefix="import-sessions-"))
    try:
        repo = root / "api"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", "git@forge.example:acme/api.git"], check=True)
        project = root / "claude" / "projects" / "-api"
        project.mkdir(parents=True)
        text = FIXTURE.read_text(encoding="utf-8").replace("{CWD}", str(repo))
        for _ in range(args.sessions):
            sid = str(uuid.uuid4())
            (project / f"{sid}.jsonl").write_text(text.replace(SESSION, sid), encoding="utf-8")
        (root / "d").mkdir()
        proc, env = start_daemon(root / "d", embeddings=False)
        argv = [sys.executable, "-m", "memactors.cli", "import", "claude-code", "--dir", str(root / "claude" / "projects"),
                "--json"]
        try:
            times, outcomes = [], []
            for _ in range(2):
                started = time.perf_counter()
                done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
                times.append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise SystemExit(f"import exited {done.returncode}: {done.stderr[-400:]}")
                outcomes.append(json.loads(done.stdout)["outcomes"])
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        recorded = outcomes[0]["recorded"] + outcomes[0]["queued"]
        print(f"  first import  {times[0]:6.1f} s: {outcomes[0]} -> {recorded / times[0]:.1f} episodes/s")
        print(f"  second import {times[1]:6.1f} s: {outcomes[1]} -> {args.sessions / times[1]:.1f} sessions/s")
        print(f"  load at the end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
