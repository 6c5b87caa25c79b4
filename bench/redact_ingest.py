"""Ingest throughput with today's redactor and with the redactor of an earlier commit, same daemon code.

    .venv/bin/python bench/redact_ingest.py [--baseline 8f9bbd3] [--records 2000] [--runs 5] [--no-daemon]

Each run starts a fresh daemon (`memactors serve`, built-in provider, SQLite) whose shared redactor is
either today's or the one at ``--baseline`` (bench/_baseline_redactor.py, put in place before the daemon
starts), and sends ``--records`` realistic run records (bench/user_paths.py's, a quarter of them with a
few credentials and key = value lines in their text) over the operator RPC in batches of 500
(`IngestRuns`). Runs alternate baseline and today's, so both see the same machine load; the medians of
records per second are printed with their ratio. That is the user's path: `memactors runs ingest` and
the spool drain send the same RPC (bench/cli_ingest.py times the CLI process around it).

Beside it, the redaction alone on the same records, in this process: each record's strings through
`Redactor.redact_many` (what the ingest's `clean_many` calls), today's and the baseline's, as µs per KB
of string text and records per second (medians of ``--runs``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
from user_paths import SERVICE, machine, read_token, run_record, vocabulary, write_config  # noqa: E402

from memactors.rpc.client import connect_rpc  # noqa: E402

BOOT = """
import sys
rev = sys.argv[1]
if rev != "-":
    sys.path.insert(0, sys.argv[2])
    from _baseline_redactor import baseline_redactor
    import memactors.redact as redact
    redact._SHARED.append(baseline_redactor(rev))
from memactors.cli import main
sys.exit(main(["serve"]))
"""

SPICE = ("Deployed with GITHUB_TOKEN=ghp_{a} and `psql postgresql://app:{b}@db/app`; config: password: {c}, "
         "api_key = \"{d}\"; curl -H 'Authorization: Bearer {e}' https://api.example/v1 returned 200.")


def records(n: int) -> list[dict[str, Any]]:
    rng, words = random.Random(5), vocabulary(random.Random(7))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    out = []
    for i in range(n):
        record = run_record(i, rng, words)
        if i % 4 == 0:
            parts = {k: "".join(rng.choice(alphabet) for _ in range(36)) for k in "abcde"}
            record["result_text"] += " " + SPICE.format(**parts)
        out.append(record)
    return out


async def one_run(rev: str, batch: list[dict[str, Any]]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        config = write_config(root, state)
        env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}
        with (root / "daemon.log").open("ab") as log:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-c", BOOT, rev, str(Path(__file__).parent)], env=env, stdout=log, stderr=log)
            try:
                with trio.fail_after(180):
                    while not (state / "daemon.json").exists():  # noqa: ASYNC110 -- a bench, polling the file
                        if proc.poll() is not None:
                            raise SystemExit(f"daemon exited: {(root / 'daemon.log').read_text()[-2000:]}")
                        await trio.sleep(0.05)
                info = json.loads((state / "daemon.json").read_text())
                async with connect_rpc(info["operator"], read_token(state, "control")) as rpc:
                    with trio.fail_after(120):
                        while (await rpc.call(f"{SERVICE}/Status", {}))["state"] != "ready":  # noqa: ASYNC110
                            await trio.sleep(0.05)
                    started = time.perf_counter()
                    for n in range(0, len(batch), 500):
                        await rpc.call(f"{SERVICE}/IngestRuns", {"records": [{"record": r} for r in batch[n:n + 500]]})
                    return len(batch) / (time.perf_counter() - started)
            finally:
                proc.send_signal(2)
                with trio.move_on_after(30):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def strings(value: Any, out: list[str]) -> list[str]:
    """Every string of ``value`` (a record), as the ingest collects them."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            strings(v, out)
    elif isinstance(value, list):
        for v in value:
            strings(v, out)
    return out


def function_only(rev: str, batch: list[dict[str, Any]], runs: int) -> None:
    """The redaction of the records' strings alone, today's and the baseline's, alternating."""
    from _baseline_redactor import baseline_redactor

    from memactors.redact import Redactor

    per_record = [strings(r, []) for r in batch]
    kb = sum(len(t) for texts in per_record for t in texts) / 1024
    redactors = {"baseline": baseline_redactor(rev), "now": Redactor()}
    times: dict[str, list[float]] = {name: [] for name in redactors}
    for _ in range(runs):
        for name, redactor in redactors.items():
            started = time.perf_counter()
            for texts in per_record:
                redactor.redact_many(texts)
            times[name].append(time.perf_counter() - started)
    print(f"redaction alone ({kb:.0f} KB of strings, redact_many per record), median of {runs}:")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(f"  {name:>8} {median / kb * 1e6:8.1f} µs/KB  {len(batch) / median:8.0f} rec/s")
    ratio = statistics.median(times["now"]) / statistics.median(times["baseline"])
    print(f"  now / baseline: {ratio:.2f}x the time")


async def amain(args: argparse.Namespace) -> None:
    print(f"machine: {machine()}")
    batch = records(args.records)
    kb = sum(len(json.dumps(r)) for r in batch) / 1024
    print(f"{len(batch)} records, {kb:.0f} KB of JSON; baseline redactor at {args.baseline}")
    function_only(args.baseline, batch, args.runs)
    if args.no_daemon:
        return
    print(f"through the daemon (IngestRuns over the operator RPC, batches of 500), {args.runs} runs:")
    rates: dict[str, list[float]] = {"baseline": [], "now": []}
    for _ in range(args.runs):
        rates["baseline"].append(await one_run(args.baseline, batch))
        rates["now"].append(await one_run("-", batch))
        print(f"  baseline {rates['baseline'][-1]:8.0f} rec/s   now {rates['now'][-1]:8.0f} rec/s", flush=True)
    before, now = statistics.median(rates["baseline"]), statistics.median(rates["now"])
    print(f"median: baseline {before:.0f} rec/s, now {now:.0f} rec/s ({(now / before - 1) * 100:+.1f} %)")
    print(f"load after: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="8f9bbd3")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-daemon", action="store_true", help="only the redaction alone")
    trio.run(amain, parser.parse_args())


if __name__ == "__main__":
    main()
