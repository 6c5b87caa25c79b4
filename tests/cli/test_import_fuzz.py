"""Fuzzed import inputs: `store import` files and `import claude-code` transcripts, mutated from real ones
by Hypothesis (``st.randoms``, so every choice shrinks), each run through the CLI as a subprocess. No
input gives a traceback or an exit other than 0 (all in) and 1 (some refused, named); every refused line
is one the file has; and a daemon started on the store every `store import` example wrote starts,
serves `memory episodes`, and has no record it had to quarantine (nothing unreadable got in).

Bounded (a few dozen files, each of many lines) so it stays in `make test`."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fix_daemon import Daemon, daemon_process, start_daemon
from support import run_record, write_config
from support_runs import make_repo

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data"
SESSION = "5a0ddcd0-5487-4794-99ac-143f6bb9e248"
#: Examples per surface: each is one CLI subprocess over a file of up to LINES_PER_FILE lines.
EXAMPLES = 10
LINES_PER_FILE = 40


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False, timeout=300)


def odd_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value a careless or hostile file might hold where another was expected."""
    choice = rng.randrange(14)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, -1, 1, 2**53 + 1, 10**30, -(10**19)])
    if choice == 3:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf"), 1.0000001])
    if choice == 4:
        return ""
    if choice == 5:
        return rng.choice(["hello", "{}", "[]", "null", '{"episode_id": 1}', "ep_" + "0" * 20, "\ud800",
                           "2026-02-30T10:00:00Z", "0001-01-01T00:00:00+01:00", "project:", "fleet", "a/../b"])
    if choice == 6:
        return "x" * rng.choice([257, 5000, 300_000])
    if choice == 7 and depth < 3:
        return [odd_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    if choice == 8 and depth < 3:
        return {rng.choice(["a", "episode_id", "text", "row"]): odd_value(rng, depth + 1) for _ in range(rng.randrange(3))}
    if choice == 9:
        return "ghp_" + "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
                                for _ in range(36))
    if choice == 10:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 40)))
    return rng.choice(["forge.example/acme/api", "forge.example/acme/other", "project:forge.example/acme/api",
                       "2026-11-28T09:00:00Z", "succeeded", "live", "builtin", "claude-code"])


def mutate_line(rng: random.Random, item: dict[str, Any], n: int) -> str:
    """One export line made from `item` (a real one), with fresh ids so it is new to the store, then
    damaged in one or two places (a row column, a body field, the text, the line itself)."""
    item = json.loads(json.dumps(item))
    row = item.get("row", {})
    for key in ("episode_id",):
        if isinstance(row.get(key), str):
            row[key] = f"ep_{rng.getrandbits(80):020x}"
    if isinstance(row.get("run_id"), str):
        row["run_id"] = f"fuzz-{n}-{rng.getrandbits(32)}"
    if item["type"] == "fact":
        row["id"] = f"f_fuzz{n}_{rng.getrandbits(24)}"
    body: dict[str, Any] | None = None
    if item["type"] == "episode" and isinstance(item.get("text"), str):
        body = json.loads(item["text"])
        body["episode_id"], body["run_id"] = row["episode_id"], row["run_id"]
    for _ in range(rng.randrange(0, 3)):  # zero damages: a good line among the bad ones
        where = rng.randrange(5)
        if where == 0 and row:
            row[rng.choice(sorted(row))] = odd_value(rng)
        elif where == 1 and body is not None:
            body[rng.choice(sorted(body))] = odd_value(rng)
        elif where == 2:
            item["text"] = odd_value(rng)
            body = None
        elif where == 3:
            del_key = rng.choice(sorted(row)) if row else None
            if del_key is not None:
                del row[del_key]
        else:
            item["type"] = rng.choice(["episode", "run", "fact", "index", "run_path", "end", "nope", 7])
    if body is not None:
        item["text"] = json.dumps(body, allow_nan=True)
    line = json.dumps(item, allow_nan=True)
    cut = rng.randrange(40)
    if cut == 0:
        return line[: rng.randrange(len(line))]  # a torn line
    if cut == 1:
        return "[" * 50_000 + "]" * 50_000
    return line


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[dict[str, Any]], Path, dict[str, str]]]:
    """A real export (an episode, its run, paths, a fact) and an empty target state directory."""
    source = tmp_path_factory.mktemp("fuzz-source")
    with daemon_process(source, config=write_config(source)) as daemon:
        record = source / "run.json"
        record.write_text(json.dumps(run_record()), encoding="utf-8")
        assert cli(daemon.env, "runs", "ingest", str(record)).returncode == 0
        assert cli(daemon.env, "facts", "add", "Ledger rounds half up.", "--scope",
                   "project:forge.example/acme/api", "--confidence", "0.5").returncode == 0
        done = cli(daemon.env, "store", "export")
        assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    target = tmp_path_factory.mktemp("fuzz-target")
    config = write_config(target)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(target)}
    yield lines, target, env
    with daemon_process(target, config=config) as daemon:  # what every example let in: the daemon serves it
        deadline = time.monotonic() + 300
        while True:
            status = json.loads(cli(daemon.env, "memory", "status", "--json").stdout)
            if status["pending"]["records"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status["pending"]["record_quarantined"] == 0 and status["pending"]["records"] == 0, status
        listed = cli(daemon.env, "memory", "episodes", "--json", "--limit", "1000")
        assert listed.returncode == 0, listed.stderr
        assert daemon.proc.poll() is None
        assert "Traceback" not in daemon.log_text()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_no_fuzzed_store_import_file_gives_a_traceback_or_poisons_the_store(
        export: tuple[list[dict[str, Any]], Path, dict[str, str]], rng: random.Random) -> None:
    lines, target, env = export
    rows = [x for x in lines if x["type"] not in ("header", "end")]
    body = [mutate_line(rng, rng.choice(rows), n) for n in range(rng.randrange(1, LINES_PER_FILE))]
    path = target / "fuzz.jsonl"
    path.write_text("\n".join([json.dumps(lines[0]), *body, json.dumps(lines[-1])]) + "\n", encoding="utf-8",
                    errors="surrogatepass")
    done = cli(env, "store", "import", str(path), "--json")
    assert done.returncode in (0, 1, 5), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if done.returncode in (0, 1):
        summary = json.loads(done.stdout)
        assert {r["line"] for r in summary["refused"]} <= set(range(2, len(body) + 2)), summary["refused"]
        assert (done.returncode == 1) == bool(summary["refused"]), summary


def transcript_lines(repo: Path, session: str) -> list[str]:
    text = (DATA / "claude_transcript_session.jsonl").read_text(encoding="utf-8")
    return text.replace("{CWD}", str(repo)).replace(SESSION, session).splitlines()


def mutate_transcript(rng: random.Random, lines: list[str]) -> str:
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if isinstance(entry, dict) and rng.random() < 0.3:
            key = rng.choice(sorted(entry) + ["timestamp", "cwd", "sessionId", "message"])
            entry[key] = odd_value(rng)
        out.append(json.dumps(entry, allow_nan=True))
    if rng.random() < 0.1:
        out.insert(rng.randrange(len(out) + 1), "{" * 30_000)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def importer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    tmp = tmp_path_factory.mktemp("fuzz-import")
    repo = make_repo(tmp / "api")
    daemon = start_daemon(tmp, extra_config=f'[harness.coder]\nharness = "claude-code"\nworkdir = "{repo}"\n')
    try:
        yield daemon, repo
    finally:
        daemon.stop()
        assert "Traceback" not in daemon.log_text()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_no_fuzzed_claude_code_transcript_gives_a_traceback(importer: tuple[Daemon, Path],
                                                             rng: random.Random) -> None:
    daemon, repo = importer
    root = Path(tempfile.mkdtemp(prefix="claude-", dir=daemon.state.parent))  # a replayed example gets its own
    project = root / str(repo).replace("/", "-")
    project.mkdir(parents=True)
    files = rng.randrange(1, 4)
    for n in range(files):
        session = f"5a0ddcd0-5487-4794-99ac-{n:012x}"
        (project / f"{session}.jsonl").write_text(mutate_transcript(rng, transcript_lines(repo, session)),
                                                  encoding="utf-8", errors="surrogatepass")
    extra = ["--since", rng.choice(["3650d", "1d", "2026-01-01T00:00:00Z"])] if rng.random() < 0.3 else []
    done = cli(daemon.env, "import", "claude-code", "--dir", str(root), "--harness", "coder", "--json", *extra)
    assert done.returncode in (0, 1), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["files"] == files, summary
    accounted = len(summary["malformed"]) + sum(summary.get("left_out", {}).values()) + summary["records"]
    assert accounted == files, summary
